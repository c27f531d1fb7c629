//! safetensors in and out for the `fa-run` tool: q, k, v as PyTorch saves them
//! (`safetensors.torch.save_file`), out and lse back. Pure functions of bytes;
//! `header_len` and `check_header` let the reader bound what it reads by the
//! file's size before reading the tensors.

use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};

use crate::error::{Error, Result, invalid};
use crate::tensor::{Arg, Desc, Dtype, Layout};

/// The largest header safetensors reads (its `MAX_HEADER_SIZE`).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The header length a safetensors file of `file_len` bytes declares in its first
/// 8 bytes (`prefix`, little-endian), checked against the file before the header
/// is read: it must be non-empty, within safetensors' limit and inside the file.
pub fn header_len(prefix: [u8; 8], file_len: u64) -> Result<u64> {
    if file_len < 8 {
        invalid!("not a safetensors file: {file_len} bytes, fewer than the 8 of the header length");
    }
    let n = u64::from_le_bytes(prefix);
    if n == 0 || n > MAX_HEADER_BYTES {
        invalid!(
            "not a safetensors file: its first 8 bytes declare a header of {n} bytes (at most {MAX_HEADER_BYTES})"
        );
    }
    if n > file_len - 8 {
        invalid!(
            "not a safetensors file, or a truncated one: the header claims {n} bytes but the file holds {} after the length",
            file_len - 8
        );
    }
    Ok(n)
}

/// Checks that every tensor the JSON `header` lists lies within the `data_len`
/// bytes after it, so that nothing past the file is read or trusted.
pub fn check_header(header: &[u8], data_len: u64) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Info {
        data_offsets: (u64, u64),
    }
    let Entries(entries) = serde_json::from_slice(header)
        .map_err(|e| Error::Invalid(format!("not a safetensors file: its header is not a JSON object ({e})")))?;
    for (name, value) in entries.into_iter().filter(|(name, _)| name != "__metadata__") {
        let Info { data_offsets: (begin, end) } = serde_json::from_value(value)
            .map_err(|e| Error::Invalid(format!("not a safetensors file: tensor `{name}` in the header: {e}")))?;
        if begin > end || end > data_len {
            invalid!(
                "truncated or corrupt safetensors file: `{name}` claims data bytes {begin}..{end}, but the file holds {data_len} after its header"
            );
        }
    }
    Ok(())
}

/// A header's entries in file order, refusing a name given twice (a map would
/// keep the last, and the file's data would then not add up).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Entries, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Entries, A::Error> {
                let mut seen = std::collections::BTreeSet::new();
                let mut out = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!("tensor `{name}` is named twice")));
                    }
                    out.push((name, value));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One contiguous tensor on the host, each element's bits in a `u16`
/// (`Dtype::encode`).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor16 {
    /// f16, bf16 or e4m3.
    pub dtype: Dtype,
    /// Logical dims [batch, heads, seq, head_dim] and the strides of the
    /// layout it was read in.
    pub desc: Desc,
    /// The elements' bits, in the file's order.
    pub bits: Vec<u16>,
}

impl HostTensor16 {
    /// This tensor as `tensor::validate` takes it.
    ///
    /// ```
    /// use kernel_ffi::io::HostTensor16;
    /// use kernel_ffi::tensor::{self, Desc, Dtype, Layout};
    ///
    /// let t = |s| {
    ///     let desc = Desc::new([1, 4, s, 64], Layout::Bshd);
    ///     HostTensor16 { dtype: Dtype::Bf16, desc, bits: vec![0; desc.span()] }
    /// };
    /// let (q, kv) = (t(10), t(30));
    /// let p = tensor::validate(q.arg("q"), kv.arg("k"), kv.arg("v"), q.arg("out"), None).unwrap();
    /// assert_eq!((p.seqlen_q, p.seqlen_k, p.rows()), (10, 30, 40));
    /// ```
    pub fn arg<'a>(&self, name: &'a str) -> Arg<'a> {
        Arg { name, dtype: self.dtype, desc: self.desc, len: self.bits.len() }
    }
}

/// The e4m3 inputs' descales a file may hold: F32 `q_descale`, `k_descale`,
/// `v_descale`, each [batch, kv_heads] (FA3's), as `[Option<(values, shape)>; 3]`.
pub type Descales = [Option<(Vec<f32>, Vec<usize>)>; 3];

/// The names of [`Descales`]' tensors, in its order.
pub const DESCALE_TENSORS: [&str; 3] = ["q_descale", "k_descale", "v_descale"];

/// Reads the [`Descales`] a file holds.
///
/// ```
/// use kernel_ffi::io::read_descales;
/// use safetensors::tensor::{Dtype, TensorView};
///
/// let bytes: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// let view = TensorView::new(Dtype::F32, vec![1, 2], &bytes).unwrap();
/// let file = safetensors::serialize([("k_descale", view)], None).unwrap();
/// let [q, k, v] = read_descales(&file).unwrap();
/// assert!(q.is_none() && v.is_none());
/// assert_eq!(k, Some((vec![0.5, 2.0], vec![1, 2])));
/// ```
pub fn read_descales(bytes: &[u8]) -> Result<Descales> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Invalid(format!("not a safetensors file: {e}")))?;
    let read = |name: &str| -> Result<Option<(Vec<f32>, Vec<usize>)>> {
        let Ok(t) = st.tensor(name) else { return Ok(None) };
        if t.dtype() != StDtype::F32 {
            invalid!("`{name}` is {:?}; descales are F32 [batch, kv_heads] (use .float())", t.dtype());
        }
        let v = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(Some((v, t.shape().to_vec())))
    };
    Ok([read(DESCALE_TENSORS[0])?, read(DESCALE_TENSORS[1])?, read(DESCALE_TENSORS[2])?])
}

/// Reads tensors `q`, `k`, `v`: rank 4, f16, bf16 or e4m3, in `layout` order
/// ([B, H, S, D] for bhsd, [B, S, H, D] for bshd).
pub fn read_qkv(bytes: &[u8], layout: Layout) -> Result<[HostTensor16; 3]> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Invalid(format!("not a safetensors file: {e}")))?;
    let read = |name| read16(&st, name, |shape| rank4(name, shape, layout));
    Ok([read("q")?, read("k")?, read("v")?])
}

/// Tensor `name` of 16-bit floats, its desc from its shape by `desc_of`.
fn read16(st: &SafeTensors, name: &str, desc_of: impl FnOnce(&[usize]) -> Result<Desc>) -> Result<HostTensor16> {
    let t = st.tensor(name).map_err(|_| {
        Error::Invalid(format!("no tensor named `{name}`; the file holds {:?}; save q, k and v", st.names()))
    })?;
    let dtype = match t.dtype() {
        StDtype::F16 => Dtype::F16,
        StDtype::BF16 => Dtype::Bf16,
        StDtype::F8_E4M3 => Dtype::E4m3,
        other => invalid!(
            "`{name}` is {other:?}; the kernels take F16, BF16 or F8_E4M3 (use .half(), .bfloat16() or \
             .to(torch.float8_e4m3fn))"
        ),
    };
    let desc = desc_of(t.shape())?;
    let bits = dtype.decode(t.data());
    Ok(HostTensor16 { dtype, desc, bits })
}

/// The desc of a rank-4 tensor in `layout` order.
fn rank4(name: &str, shape: &[usize], layout: Layout) -> Result<Desc> {
    let &[b, x, y, d] = shape else {
        invalid!("`{name}` has shape {shape:?}; expected rank 4 ({})", layout_dims(layout));
    };
    Ok(match layout {
        Layout::Bhsd => Desc::new([b, x, y, d], layout),
        Layout::Bshd => Desc::new([b, y, x, d], layout),
    })
}

/// A serving call read from a file (FlashAttention's layouts): `q` (total_q,
/// H, D) with `cu_seqlens_q`, else rank 4 in the layout; `k`, `v` (total_k,
/// Hkv, D) with `cu_seqlens_k`, (pages, page_size, Hkv, D) with `block_table`,
/// else rank 4; and int32 `seqused_k` (or `cache_seqlens`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServingInput {
    /// q, k and v as [batch, heads, seq, D] descs (packed: batch 1; paged: pages).
    pub qkv: [HostTensor16; 3],
    /// `cu_seqlens_q`, where given.
    pub cu_seqlens_q: Option<Vec<i32>>,
    /// `cu_seqlens_k`, where given.
    pub cu_seqlens_k: Option<Vec<i32>>,
    /// `seqused_k` or `cache_seqlens`, where given.
    pub seqused_k: Option<Vec<i32>>,
    /// The block table and its width (page slots per sequence), where given.
    pub block_table: Option<(Vec<i32>, usize)>,
    /// Sequences: the offsets' count − 1, else the batch of q or of the block table.
    pub seqs: usize,
}

/// The index tensors that make a file a serving call.
pub const SERVING_TENSORS: [&str; 5] = ["cu_seqlens_q", "cu_seqlens_k", "seqused_k", "cache_seqlens", "block_table"];

/// Reads a serving call if the file holds any of [`SERVING_TENSORS`] (else
/// `None`: a dense call for [`read_qkv`]); `layout` is that of rank-4 q, k and v.
pub fn read_serving(bytes: &[u8], layout: Layout) -> Result<Option<ServingInput>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Invalid(format!("not a safetensors file: {e}")))?;
    if !SERVING_TENSORS.iter().any(|n| st.tensor(n).is_ok()) {
        return Ok(None);
    }
    let ints = |name: &str| -> Result<Option<(Vec<i32>, Vec<usize>)>> {
        let Ok(t) = st.tensor(name) else { return Ok(None) };
        if t.dtype() != StDtype::I32 {
            invalid!("`{name}` is {:?}; sequence offsets, lengths and block tables are I32 (use .int())", t.dtype());
        }
        let v = t.data().chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(Some((v, t.shape().to_vec())))
    };
    let vector = |name: &str| -> Result<Option<Vec<i32>>> {
        match ints(name)? {
            Some((v, shape)) if shape.len() == 1 => Ok(Some(v)),
            Some((_, shape)) => invalid!("`{name}` has shape {shape:?}; expected rank 1"),
            None => Ok(None),
        }
    };
    let cu_seqlens_q = vector("cu_seqlens_q")?;
    let cu_seqlens_k = vector("cu_seqlens_k")?;
    let seqused_k = match (vector("seqused_k")?, vector("cache_seqlens")?) {
        (Some(_), Some(_)) => {
            invalid!("the file holds both `seqused_k` and `cache_seqlens`; they are one thing, keep one")
        }
        (a, b) => a.or(b),
    };
    let block_table = match ints("block_table")? {
        Some((v, shape)) => match shape[..] {
            [_, width] => Some((v, width)),
            _ => invalid!("`block_table` has shape {shape:?}; expected [batch, max_pages]"),
        },
        None => None,
    };
    let read = |name: &str, packed: bool, paged: bool| {
        read16(&st, name, |shape| match (packed, paged, shape) {
            (true, _, &[total, h, d]) => Ok(Desc::new([1, h, total, d], Layout::Bshd)),
            (true, ..) => {
                invalid!("`{name}` has shape {shape:?}; packed with cu_seqlens it is (total, heads, head_dim)")
            }
            (_, true, &[pages, page_size, h, d]) => Ok(Desc::new([pages, h, page_size, d], Layout::Bshd)),
            (_, true, _) => invalid!(
                "`{name}` has shape {shape:?}; paged with a block_table it is (pages, page_size, heads, head_dim)"
            ),
            _ => rank4(name, shape, layout),
        })
    };
    let (packed_q, packed_k, paged) = (cu_seqlens_q.is_some(), cu_seqlens_k.is_some(), block_table.is_some());
    let qkv = [read("q", packed_q, false)?, read("k", packed_k, paged)?, read("v", packed_k, paged)?];
    let seqs = match (&cu_seqlens_q, &cu_seqlens_k, &block_table) {
        (Some(cu), ..) | (None, Some(cu), _) => cu.len().saturating_sub(1),
        (None, None, Some((table, width))) => table.len() / (*width).max(1),
        (None, None, None) => qkv[0].desc.dims[0],
    };
    Ok(Some(ServingInput { qkv, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, seqs }))
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
    write_shaped(out, shape, lse.map(|l| (l, vec![b, h, s])))
}

/// Serialises packed `out` ([1, H, total, D], Bshd) as (total, H, D) and, if
/// given, `lse` as F32 (H, total): FlashAttention's varlen layouts.
pub fn write_packed_outputs(out: &HostTensor16, lse: Option<&[f32]>) -> Result<Vec<u8>> {
    let [_, h, total, d] = out.desc.dims;
    write_shaped(out, vec![total, h, d], lse.map(|l| (l, vec![h, total])))
}

fn write_shaped(out: &HostTensor16, shape: Vec<usize>, lse: Option<(&[f32], Vec<usize>)>) -> Result<Vec<u8>> {
    let dtype = match out.dtype {
        Dtype::F16 => StDtype::F16,
        Dtype::Bf16 => StDtype::BF16,
        Dtype::E4m3 => StDtype::F8_E4M3,
    };
    let out_bytes = out.dtype.encode(&out.bits);
    let lse_bytes: Vec<u8> = lse.as_ref().map_or(&[][..], |l| l.0).iter().flat_map(|x| x.to_le_bytes()).collect();
    let err = |e: safetensors::SafeTensorError| Error::Invalid(format!("serialising outputs: {e}"));
    let mut views = vec![("out", TensorView::new(dtype, shape, &out_bytes).map_err(err)?)];
    if let Some((_, lse_shape)) = lse {
        views.push(("lse", TensorView::new(StDtype::F32, lse_shape, &lse_bytes).map_err(err)?));
    }
    safetensors::serialize(views, None).map_err(err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tensor_named_twice_is_named_as_such() {
        let header = br#"{"q":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"q":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}"#;
        let err = check_header(header, 4).unwrap_err().to_string();
        assert!(err.contains("tensor `q` is named twice"), "{err}");
    }

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
    fn e4m3_tensors_and_their_descales() {
        let mut f = file(&[
            ("q", StDtype::F8_E4M3, vec![1, 2, 3, 64]),
            ("k", StDtype::F8_E4M3, vec![1, 2, 3, 64]),
            ("v", StDtype::F8_E4M3, vec![1, 2, 3, 64]),
            ("v_descale", StDtype::F32, vec![1, 2]),
        ]);
        let [q, ..] = read_qkv(&f, Layout::Bhsd).unwrap();
        assert_eq!((q.dtype, q.bits.len()), (Dtype::E4m3, 2 * 3 * 64), "one element a byte");
        let [qd, kd, vd] = read_descales(&f).unwrap();
        assert!(qd.is_none() && kd.is_none());
        assert_eq!(vd, Some((vec![0.0, 0.0], vec![1, 2])));
        f = file(&[("k_descale", StDtype::BF16, vec![1, 2])]);
        let e = read_descales(&f).unwrap_err().to_string();
        assert!(e.contains("`k_descale` is BF16; descales are F32 [batch, kv_heads]"), "{e}");
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
    fn header_length_is_checked_against_the_file() {
        let len = |n: u64| n.to_le_bytes();
        assert_eq!(header_len(len(64), 72).unwrap(), 64);
        let e = header_len(len(1 << 40), 1000).unwrap_err().to_string();
        assert!(e.contains("header of 1099511627776 bytes"), "{e}");
        let e = header_len(len(500), 100).unwrap_err().to_string();
        assert!(e.contains("the header claims 500 bytes but the file holds 92"), "{e}");
        // /dev/zero's first bytes, and a file too short to hold a length.
        assert!(header_len([0; 8], 1 << 20).unwrap_err().to_string().contains("a header of 0 bytes"));
        assert!(header_len([0; 8], 3).unwrap_err().to_string().contains("3 bytes, fewer than the 8"));
    }

    #[test]
    fn each_tensor_must_lie_inside_the_file() {
        let f = file(&[("q", StDtype::F16, vec![1, 1, 2, 64]), ("k", StDtype::F16, vec![1, 1, 2, 64])]);
        let n = header_len(f[..8].try_into().unwrap(), f.len() as u64).unwrap() as usize;
        let (header, data) = (&f[8..8 + n], (f.len() - 8 - n) as u64);
        assert!(check_header(header, data).is_ok());
        let e = check_header(header, data - 1).unwrap_err().to_string();
        assert!(e.contains("claims data bytes 256..512, but the file holds 511 after its header"), "{e}");
        let meta = br#"{"__metadata__":{"format":"pt"},"q":{"dtype":"F16","shape":[1],"data_offsets":[4,2]}}"#;
        assert!(check_header(meta, 10).unwrap_err().to_string().contains("`q` claims data bytes 4..2"));
        let e = check_header(br#"{"q":{"dtype":"F16"}}"#, 10).unwrap_err().to_string();
        assert!(e.contains("tensor `q` in the header") && e.contains("data_offsets"), "{e}");
        assert!(check_header(b"[1, 2]", 10).unwrap_err().to_string().contains("not a JSON object"));
    }

    fn ints(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn serving_files_read_in_flash_attentions_layouts() {
        let (cu, table) = (ints(&[0, 3, 10]), ints(&[2, 0, 1, 1, 2, 0]));
        let half = |shape: &[usize]| vec![0u8; shape.iter().product::<usize>() * 2];
        let (qs, ks) = ([10, 4, 64], [3, 16, 2, 64]);
        let (qb, kb) = (half(&qs), half(&ks));
        let lens = ints(&[30, 40]);
        let views = vec![
            ("q", TensorView::new(StDtype::BF16, qs.to_vec(), &qb).unwrap()),
            ("k", TensorView::new(StDtype::BF16, ks.to_vec(), &kb).unwrap()),
            ("v", TensorView::new(StDtype::BF16, ks.to_vec(), &kb).unwrap()),
            ("cu_seqlens_q", TensorView::new(StDtype::I32, vec![3], &cu).unwrap()),
            ("cache_seqlens", TensorView::new(StDtype::I32, vec![2], &lens).unwrap()),
            ("block_table", TensorView::new(StDtype::I32, vec![2, 3], &table).unwrap()),
        ];
        let f = safetensors::serialize(views, None).unwrap();
        let s = read_serving(&f, Layout::Bshd).unwrap().unwrap();
        assert_eq!((s.qkv[0].desc.dims, s.qkv[1].desc.dims, s.seqs), ([1, 4, 10, 64], [3, 2, 16, 64], 2));
        assert_eq!((s.seqused_k, s.block_table.map(|t| t.1)), (Some(vec![30, 40]), Some(3)));
        // A dense file is not a serving one.
        let dense = file(&[("q", StDtype::F16, vec![1, 1, 2, 64])]);
        assert_eq!(read_serving(&dense, Layout::Bhsd).unwrap(), None);
        // Offsets must be I32, and packed q rank 3.
        let bad = file(&[("q", StDtype::F16, vec![1, 1, 2, 64]), ("cu_seqlens_q", StDtype::I64, vec![2])]);
        assert!(read_serving(&bad, Layout::Bhsd).unwrap_err().to_string().contains("are I32"));
        let bad = file(&[("q", StDtype::F16, vec![1, 1, 2, 64]), ("cu_seqlens_q", StDtype::I32, vec![2])]);
        let e = read_serving(&bad, Layout::Bhsd).unwrap_err().to_string();
        assert!(e.contains("(total, heads, head_dim)"), "{e}");
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
