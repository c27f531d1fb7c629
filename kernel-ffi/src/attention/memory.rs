//! Device tensors, their addresses, and the copies between host and device.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::Attention;
use crate::error::{CudaContext, Result, invalid};
use crate::tensor::{Arg, Desc, Dtype};

/// A device tensor: a 4-D attention operand, [batch, heads, seq, head_dim]
/// with the strides of `desc`, its elements' bytes as [`Dtype::encode`] lays
/// them out.
///
/// Made by [`Attention::upload`] or [`Attention::alloc_poisoned`], or from a
/// device buffer of the caller's own (any `CudaSlice<u8>` on the same
/// context); [`Attention::forward`] checks `desc` against the buffer's
/// elements before it launches.
pub struct Tensor {
    /// The elements' bytes, on the device.
    pub data: CudaSlice<u8>,
    /// What the elements are: f16, bf16 or e4m3.
    pub dtype: Dtype,
    /// Logical dims and element strides: where element (b, h, s, d) lies in `data`.
    pub desc: Desc,
}

impl Tensor {
    /// The tensor as `tensor::validate` sees it.
    pub(super) fn arg<'a>(&self, name: &'a str) -> Arg<'a> {
        Arg { name, dtype: self.dtype, desc: self.desc, len: self.data.len() / self.dtype.bytes() }
    }
}

impl Attention {
    /// Copies host bits (one `u16` an element; e4m3's in the low byte) to a new
    /// device tensor. `bits` holds at least `desc.span()` elements, laid out by
    /// `desc`'s strides; the copy is enqueued on the stream.
    pub fn upload(&self, dtype: Dtype, desc: Desc, bits: &[u16]) -> Result<Tensor> {
        if bits.len() < desc.span() {
            invalid!(
                "host data has {} elements; dims {:?} with strides {:?} need {}",
                bits.len(),
                desc.dims,
                desc.strides,
                desc.span()
            );
        }
        if let Some(i) = bits.iter().position(|&b| dtype == Dtype::E4m3 && b > 0xff) {
            invalid!("element {i} has bits {:#06x}; an e4m3 element's bits are one byte", bits[i]);
        }
        let data = self.stream.clone_htod(&dtype.encode(bits)).cuda("copying a tensor to the device")?;
        Ok(Tensor { data, dtype, desc })
    }

    /// Refuses work that needs `bytes` of device memory where fewer are free, naming
    /// both, before a first allocation fails half-way through a set of buffers.
    pub fn check_fits(&self, bytes: u64, what: &str) -> Result<()> {
        let (free, total) = self.ctx.mem_get_info().cuda("reading the free device memory")?;
        if bytes > free as u64 {
            invalid!(
                "{what} needs {:.1} GB of device memory; {} has {:.1} GB free of {:.1} GB",
                bytes as f64 / 1e9,
                self.device.name,
                free as f64 / 1e9,
                total as f64 / 1e9
            );
        }
        Ok(())
    }

    /// A new device tensor filled with NaN (outputs start poisoned).
    pub fn alloc_poisoned(&self, dtype: Dtype, desc: Desc) -> Result<Tensor> {
        self.upload(dtype, desc, &vec![dtype.nan(); desc.span()])
    }

    /// A new LSE buffer for `rows` rows, filled with NaN (at least one element, so
    /// that an empty problem still has a valid allocation).
    pub fn alloc_lse(&self, rows: usize) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(&vec![f32::NAN; rows.max(1)]).cuda("allocating the LSE buffer")
    }

    /// The first `rows` values of an LSE buffer.
    pub fn download_lse(&self, lse: &CudaSlice<f32>, rows: usize) -> Result<Vec<f32>> {
        let mut all = self.stream.clone_dtoh(lse).cuda("copying the LSE to the host")?;
        all.truncate(rows);
        Ok(all)
    }

    /// Copies a tensor's bits to the host (one `u16` an element), after the
    /// work enqueued before it. The whole buffer comes back, in the tensor's own
    /// strides.
    pub fn download(&self, t: &Tensor) -> Result<Vec<u16>> {
        Ok(t.dtype.decode(&self.stream.clone_dtoh(&t.data).cuda("copying a tensor to the host")?))
    }
}

pub(super) fn device_ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (ptr, _sync) = buf.device_ptr(stream);
    ptr
}

/// Element strides of batch, head and seq as the kernels' parameters take them.
pub(super) fn strides(desc: &Desc) -> [i64; 3] {
    desc.strides.map(|x| x as i64)
}
