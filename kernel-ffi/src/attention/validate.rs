//! A forward call's checks on its buffers, made before anything is launched;
//! each error names the value and the rule it breaks.

use cudarc::driver::{CudaSlice, CudaStream};

use super::memory::device_ptr;
use super::{Descales, Tensor};
use crate::error::{Result, invalid};
use crate::tensor::{self, Dtype, Problem};

/// The problem q, k, v and out describe (`tensor::validate`: dtypes, dims,
/// strides, extents), with room for its rows in `lse`.
pub(super) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: Option<&CudaSlice<f32>>,
    scale: Option<f32>,
) -> Result<Problem> {
    let p = tensor::validate(q.arg("q"), k.arg("k"), v.arg("v"), out.arg("out"), scale)?;
    let rows = p.rows();
    if let Some(l) = lse
        && l.len() < rows
    {
        invalid!("lse holds {} floats but batch × heads × seqlen_q = {rows}", l.len());
    }
    Ok(p)
}

/// Descales dequantise e4m3 inputs: none for other dtypes, and each given one
/// holds batch × kv_heads factors.
pub(super) fn descales(d: &Descales, input: Dtype, p: &Problem) -> Result<()> {
    let need = p.batch * p.kv_heads;
    for (name, given) in [("q_descale", d.q), ("k_descale", d.k), ("v_descale", d.v)] {
        let Some(given) = given else { continue };
        if input != Dtype::E4m3 {
            invalid!("{name} is given but q is {}; descales dequantise e4m3 inputs", input.name());
        }
        if given.len() < need {
            invalid!("{name} holds {} floats but batch × kv_heads = {need} ([B, Hkv] fp32, contiguous)", given.len());
        }
    }
    Ok(())
}

/// The kernels load rows with 16-byte accesses: every tensor's device pointer is
/// 16-byte aligned.
pub(super) fn aligned(tensors: [(&str, &Tensor); 4], stream: &CudaStream) -> Result<()> {
    for (name, t) in tensors {
        let ptr = device_ptr(&t.data, stream);
        if ptr % 16 != 0 {
            invalid!("{name} device pointer {ptr:#x} is not 16-byte aligned");
        }
    }
    Ok(())
}
