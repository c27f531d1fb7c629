//! safetensors in and out for the `fa-run` tool: q, k, v as PyTorch saves them
//! (`safetensors.torch.save_file`), out and lse back. Pure functions of bytes.

use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};

use crate::error::{Error, Result, invalid};
use crate::tensor::{Desc, Dtype, Layout};

/// One contiguous 16-bit tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor16 {
    pub dtype: Dtype,
    pub desc: Desc,
    pub bits: Vec<u16>,
}

/// Reads tensors `q`, `k`, `v`: rank 4, f16 or bf16, in `layout` order
/// ([B, H, S, D] for bhsd, [B, S, H, D] for bshd).
pub fn read_qkv(bytes: &[u8], layout: Layout) -> Result<[HostTensor16; 3]> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Invalid(format!("not a safetensors file: {e}")))?;
    let read = |name: &str| -> Result<HostTensor16> {
        let t = st.tensor(name).map_err(|_| {
            Error::Invalid(format!("no tensor named `{name}`; the file holds {:?}; save q, k and v", st.names()))
        })?;
        let dtype = match t.dtype() {
            StDtype::F16 => Dtype::F16,
            StDtype::BF16 => Dtype::Bf16,
            other => invalid!("`{name}` is {other:?}; the kernels take F16 or BF16 (use .half() or .bfloat16())"),
        };
        let shape = t.shape();
        let &[b, x, y, d] = shape else {
            invalid!("`{name}` has shape {shape:?}; expected rank 4 ({})", layout_dims(layout));
        };
        let dims = match layout {
            Layout::Bhsd => [b, x, y, d],
            Layout::Bshd => [b, y, x, d],
        };
        let bits = t.data().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        Ok(HostTensor16 { dtype, desc: Desc::new(dims, layout), bits })
    };
    Ok([read("q")?, read("k")?, read("v")?])
}

fn layout_dims(layout: Layout) -> &'static str {
    match layout {
        Layout::Bhsd => "[batch, heads, seq, head_dim]",
        Layout::Bshd => "[batch, seq, heads, head_dim]",
    }
}

/// Serialises `out` (in its own layout) and, if given, `lse` as F32 [B, H, Sq].
pub fn write_outputs(out: &HostTensor16, layout: Layout, lse: Option<&[f32]>) -> Result<Vec<u8>> {
    let [b, h, s, d] = out.desc.dims;
    let shape = match layout {
        Layout::Bhsd => vec![b, h, s, d],
        Layout::Bshd => vec![b, s, h, d],
    };
    let dtype = match out.dtype {
        Dtype::F16 => StDtype::F16,
        Dtype::Bf16 => StDtype::BF16,
    };
    let out_bytes: Vec<u8> = out.bits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let lse_bytes: Vec<u8> = lse.unwrap_or_default().iter().flat_map(|x| x.to_le_bytes()).collect();
    let err = |e: safetensors::SafeTensorError| Error::Invalid(format!("serialising outputs: {e}"));
    let mut views = vec![("out", TensorView::new(dtype, shape, &out_bytes).map_err(err)?)];
    if lse.is_some() {
        views.push(("lse", TensorView::new(StDtype::F32, vec![b, h, s], &lse_bytes).map_err(err)?));
    }
    safetensors::serialize(views, None).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(&str, StDtype, Vec<usize>)]) -> Vec<u8> {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, dt, shape)| vec![0u8; shape.iter().product::<usize>() * dt.bitsize() / 8])
            .collect();
        let views: Vec<_> = tensors
            .iter()
            .zip(&data)
            .map(|((name, dt, shape), d)| (*name, TensorView::new(*dt, shape.clone(), d).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn reads_both_layouts() {
        let f = file(&[
            ("q", StDtype::BF16, vec![2, 3, 5, 64]),
            ("k", StDtype::BF16, vec![2, 3, 7, 64]),
            ("v", StDtype::BF16, vec![2, 3, 7, 64]),
        ]);
        let [q, k, _] = read_qkv(&f, Layout::Bhsd).unwrap();
        assert_eq!((q.dtype, q.desc.dims, k.desc.dims), (Dtype::Bf16, [2, 3, 5, 64], [2, 3, 7, 64]));
        let [q, ..] = read_qkv(&f, Layout::Bshd).unwrap();
        assert_eq!(q.desc.dims, [2, 5, 3, 64], "bshd reads dim 1 as seq");
    }

    #[test]
    fn clear_errors() {
        let err = |f: &[u8]| read_qkv(f, Layout::Bhsd).unwrap_err().to_string();
        let e = err(&file(&[("q", StDtype::F16, vec![1, 1, 1, 64]), ("v", StDtype::F16, vec![1, 1, 1, 64])]));
        assert!(e.contains("no tensor named `k`"), "{e}");
        let e = err(&file(&[("q", StDtype::F32, vec![1, 1, 1, 64])]));
        assert!(e.contains("`q` is F32") && e.contains(".half()"), "{e}");
        let e = err(&file(&[("q", StDtype::F16, vec![1, 8, 64])]));
        assert!(e.contains("shape [1, 8, 64]; expected rank 4"), "{e}");
        assert!(err(b"garbage").contains("not a safetensors file"));
    }

    #[test]
    fn outputs_round_trip() {
        let out =
            HostTensor16 { dtype: Dtype::F16, desc: Desc::new([1, 2, 3, 64], Layout::Bshd), bits: (0..384).collect() };
        let bytes = write_outputs(&out, Layout::Bshd, Some(&[1.0; 6])).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("out").unwrap().shape(), &[1, 3, 2, 64]);
        assert_eq!(st.tensor("lse").unwrap().shape(), &[1, 2, 3]);
        assert_eq!(&st.tensor("out").unwrap().data()[..4], &[0, 0, 1, 0]);
    }
}
