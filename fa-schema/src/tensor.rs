//! Shapes, strides and the validation rules of the launch API. Pure: no CUDA,
//! so that xtask checks a flag by the same rules kernel-ffi checks a launch.

use serde::{Deserialize, Serialize};

/// A value that breaks one of the launch API's rules; the message names both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Invalid {}

/// `Result` with [`Invalid`].
pub type Result<T, E = Invalid> = std::result::Result<T, E>;

macro_rules! invalid {
    ($($arg:tt)*) => { return Err(Invalid(format!($($arg)*))) };
}

/// The element type of a call's tensors: q, k and v share one, the output is
/// theirs, or f16 or bf16 where they are e4m3. Host code holds every element's
/// bits in a `u16` (e4m3's in the low byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE half precision: 11-bit significand, 5-bit exponent.
    F16,
    /// bfloat16: 8-bit significand, f32's 8-bit exponent.
    Bf16,
    /// OCP FP8 e4m3 (PyTorch's `float8_e4m3fn`): 4-bit significand, 4-bit
    /// exponent, no infinities, at most ±448. Inputs only.
    E4m3,
}

impl Dtype {
    /// `f16`, `bf16` or `e4m3`: what `name` writes.
    ///
    /// ```
    /// use fa_schema::tensor::Dtype;
    ///
    /// assert_eq!(Dtype::parse("bf16"), Ok(Dtype::Bf16));
    /// assert_eq!(Dtype::E4m3.name(), "e4m3");
    /// assert_eq!(Dtype::parse("fp32"), Err("unknown dtype `fp32`; use f16, bf16 or e4m3".to_string()));
    /// ```
    pub fn parse(s: &str) -> std::result::Result<Dtype, String> {
        match s {
            "f16" => Ok(Dtype::F16),
            "bf16" => Ok(Dtype::Bf16),
            "e4m3" => Ok(Dtype::E4m3),
            other => Err(format!("unknown dtype `{other}`; use f16, bf16 or e4m3")),
        }
    }

    /// `f16`, `bf16` or `e4m3`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::E4m3 => "e4m3",
        }
    }

    /// Bytes an element takes on the device.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::E4m3 => 1,
        }
    }

    /// Whether the kernels write outputs of this type (f16, bf16).
    pub fn is_output(self) -> bool {
        self != Dtype::E4m3
    }

    /// The value of `bits` (exact: every type widens to f32 without rounding).
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_bits(bits).to_f32(),
            Dtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
            Dtype::E4m3 => float8::F8E4M3::from_bits(bits as u8).to_f32(),
        }
    }

    /// `x` rounded to the nearest value of this type (ties to even), as its
    /// bits; e4m3 saturates at ±448, as the kernels' conversions do.
    ///
    /// ```
    /// use fa_schema::tensor::Dtype;
    ///
    /// let bits = Dtype::F16.from_f32(0.1);
    /// assert_eq!(Dtype::F16.to_f32(bits), 0.0999755859375);
    /// assert_eq!(Dtype::Bf16.to_f32(Dtype::Bf16.from_f32(0.1)), 0.10009765625);
    /// assert_eq!(Dtype::E4m3.to_f32(Dtype::E4m3.from_f32(0.1)), 0.1015625);
    /// assert_eq!(Dtype::E4m3.to_f32(Dtype::E4m3.from_f32(1e6)), 448.0);
    /// ```
    pub fn from_f32(self, x: f32) -> u16 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            Dtype::E4m3 => u16::from(float8::F8E4M3::from_f32(x).to_bits()),
        }
    }

    /// Elements' bits (one `u16` each) as the device holds them: little-endian
    /// pairs of bytes, or for e4m3 one byte, the low one.
    ///
    /// ```
    /// use fa_schema::tensor::Dtype;
    ///
    /// assert_eq!(Dtype::F16.encode(&[0x3c00, 0x0102]), [0x00, 0x3c, 0x02, 0x01]);
    /// assert_eq!(Dtype::E4m3.encode(&[0x38, 0x7f]), [0x38, 0x7f]);
    /// assert_eq!(Dtype::E4m3.decode(&[0x38, 0x7f]), [0x38, 0x7f]);
    /// assert_eq!(Dtype::Bf16.decode(&Dtype::Bf16.encode(&[0x3f80, 7])), [0x3f80, 7]);
    /// ```
    pub fn encode(self, bits: &[u16]) -> Vec<u8> {
        match self {
            Dtype::F16 | Dtype::Bf16 => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            Dtype::E4m3 => bits.iter().map(|&b| b as u8).collect(),
        }
    }

    /// The bits of the elements in `bytes` (as `encode` writes them; a last
    /// partial 16-bit element is dropped).
    pub fn decode(self, bytes: &[u8]) -> Vec<u16> {
        match self {
            Dtype::F16 | Dtype::Bf16 => bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(),
            Dtype::E4m3 => bytes.iter().map(|&b| u16::from(b)).collect(),
        }
    }

    /// A quiet NaN, used to poison outputs before a launch.
    pub fn nan(self) -> u16 {
        match self {
            Dtype::F16 => 0x7e00,
            Dtype::Bf16 => 0x7fc0,
            Dtype::E4m3 => 0x7f,
        }
    }
}

/// Memory order of a 4-D attention tensor; the head dim is always innermost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// [batch, seq, heads, head_dim]: what most frameworks hold.
    Bshd,
    /// [batch, heads, seq, head_dim]: what SDPA takes.
    Bhsd,
}

/// Logical dims `[batch, heads, seq, head_dim]` and element strides of batch, head
/// and seq; the head-dim stride is 1.
///
/// ```
/// use fa_schema::tensor::{Desc, Layout};
///
/// // [batch 2, heads 8, seq 100, head_dim 64] held as [B, S, H, D].
/// let d = Desc::new([2, 8, 100, 64], Layout::Bshd);
/// assert_eq!(d.strides, [100 * 8 * 64, 64, 8 * 64]);
/// assert_eq!(d.offset(1, 3, 10), 100 * 8 * 64 + 3 * 64 + 10 * 8 * 64);
/// assert_eq!(d.span(), d.numel()); // dense: the buffer holds exactly the elements
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desc {
    /// `[batch, heads, seq, head_dim]`, whatever the memory order.
    pub dims: [usize; 4],
    /// Element strides of batch, head and seq (the kernels need multiples of 8).
    pub strides: [usize; 3],
}

impl Desc {
    /// The dense strides of `dims` held in `layout`'s order. Strides saturate at
    /// `usize::MAX`, so that dims read from a file or a flag reach `validate`
    /// (which refuses them) instead of overflowing here.
    pub fn new(dims: [usize; 4], layout: Layout) -> Desc {
        let [_, h, s, d] = dims;
        let strides = match layout {
            Layout::Bshd => [s.saturating_mul(h).saturating_mul(d), d, h.saturating_mul(d)],
            Layout::Bhsd => [h.saturating_mul(s).saturating_mul(d), s.saturating_mul(d), d],
        };
        Desc { dims, strides }
    }

    /// Elements in all: the product of the dims. Saturates at `usize::MAX`.
    pub fn numel(&self) -> usize {
        self.dims.iter().fold(1, |n, &x| n.saturating_mul(x))
    }

    /// Elements a buffer needs: the largest offset plus one (saturating at `usize::MAX`).
    pub fn span(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let [b, h, s, d] = self.dims;
        [(b - 1, self.strides[0]), (h - 1, self.strides[1]), (s - 1, self.strides[2])]
            .into_iter()
            .fold(d, |n, (i, stride)| n.saturating_add(i.saturating_mul(stride)))
    }

    /// Offset of element (b, h, s, 0).
    pub fn offset(&self, b: usize, h: usize, s: usize) -> usize {
        b * self.strides[0] + h * self.strides[1] + s * self.strides[2]
    }
}

/// A validated problem, in the units the kernels take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Problem {
    /// B.
    pub batch: usize,
    /// H, query heads.
    pub heads: usize,
    /// K/V heads; `heads` is a multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// Queries per head.
    pub seqlen_q: usize,
    /// Keys (and values) per head.
    pub seqlen_k: usize,
    /// D: 64 or 128.
    pub head_dim: usize,
    /// The softmax scale: the caller's, else 1/sqrt(head_dim).
    pub scale: f32,
}

impl Problem {
    /// Query rows in all: batch × heads × seqlen_q.
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.seqlen_q
    }
}

/// The head dims the kernels are compiled for, dense and serving
/// (`FA_EVERY_HEAD_DIM` in kernels/common.cuh).
pub const HEAD_DIMS: [usize; 5] = [64, 96, 128, 192, 256];
/// The head dims of the e4m3 entries (kernels/flash_fwd_e4m3.cu).
pub const E4M3_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Grid y is batch × heads, and gridDim.y is at most 65535.
pub const MAX_BATCH_HEADS: usize = 65_535;

/// One tensor argument as the validator sees it.
#[derive(Debug, Clone, Copy)]
pub struct Arg<'a> {
    /// What the errors call it: `q`, `k`, `v` or `out`.
    pub name: &'a str,
    /// Its element type.
    pub dtype: Dtype,
    /// Its dims and strides.
    pub desc: Desc,
    /// Elements in the buffer behind it.
    pub len: usize,
}

/// Checks q, k, v and o against each other and against the kernels' rules,
/// and returns the problem they describe. q is [B, H, Sq, D], k and v
/// [B, Hkv, Sk, D] with H a multiple of Hkv, o q's shape; one dtype (o f16 or
/// bf16 where q, k and v are e4m3); D one of [`HEAD_DIMS`] ([`E4M3_HEAD_DIMS`]
/// for e4m3); B × H at most [`MAX_BATCH_HEADS`]; strides of 16 bytes' multiples
/// (8 elements, 16 for e4m3); every buffer long enough for its dims and strides; the scale
/// (`None`: 1/sqrt(D)) finite and positive. The first rule broken is returned,
/// naming the tensor, the value and the rule.
///
/// ```
/// use fa_schema::tensor::{Arg, Desc, Dtype, Layout, validate};
///
/// let q = Desc::new([2, 8, 100, 64], Layout::Bshd);
/// let kv = Desc::new([2, 2, 300, 64], Layout::Bshd); // 2 k/v heads: GQA
/// let arg = |name, desc: Desc| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
/// let p = validate(arg("q", q), arg("k", kv), arg("v", kv), arg("out", q), None).unwrap();
/// assert_eq!((p.heads, p.kv_heads, p.seqlen_k, p.scale), (8, 2, 300, 0.125));
///
/// let short = Arg { len: kv.span() - 1, ..arg("v", kv) };
/// let e = validate(arg("q", q), arg("k", kv), short, arg("out", q), None).unwrap_err();
/// assert!(e.to_string().starts_with("v needs 76800 elements"), "{e}");
/// ```
pub fn validate(q: Arg, k: Arg, v: Arg, o: Arg, scale: Option<f32>) -> Result<Problem> {
    let p = operands(q, k, v, o, scale)?;
    if k.desc.dims[0] != p.batch {
        invalid!("k has batch {} but q has batch {}", k.desc.dims[0], p.batch);
    }
    if p.batch.saturating_mul(p.heads) > MAX_BATCH_HEADS {
        invalid!(
            "batch × heads = {} exceeds {MAX_BATCH_HEADS} (the grid's y dimension)",
            p.batch as u128 * p.heads as u128
        );
    }
    Ok(p)
}

/// The rules of [`validate`] but those that tie k's batch to q's and bound the
/// grid: what a serving call's tensors (packed, dense or paged, whose batch
/// extents differ) are held to before the rules of their sequences. The
/// problem's batch and lengths are q's and k's own extents.
pub fn operands(q: Arg, k: Arg, v: Arg, o: Arg, scale: Option<f32>) -> Result<Problem> {
    let [batch, heads, seqlen_q, head_dim] = q.desc.dims;
    let [_, kv_heads, seqlen_k, _] = k.desc.dims;
    if !HEAD_DIMS.contains(&head_dim) {
        invalid!("q head dim is {head_dim}; the kernels support head dims {HEAD_DIMS:?}");
    }
    if q.dtype == Dtype::E4m3 && !E4M3_HEAD_DIMS.contains(&head_dim) {
        invalid!("q head dim is {head_dim}; e4m3 inputs take head dims {E4M3_HEAD_DIMS:?}");
    }
    for t in [&k, &v] {
        if t.dtype != q.dtype {
            invalid!("{} is {} but q is {}; q, k and v must share one dtype", t.name, t.dtype.name(), q.dtype.name());
        }
    }
    if q.dtype == Dtype::E4m3 && !o.dtype.is_output() {
        invalid!("out is e4m3; e4m3 inputs write f16 or bf16 output");
    }
    if q.dtype != Dtype::E4m3 && o.dtype != q.dtype {
        invalid!("out is {} but q is {}; all tensors must share one dtype", o.dtype.name(), q.dtype.name());
    }
    for t in [&k, &v, &o] {
        if t.desc.dims[3] != head_dim {
            invalid!("{} head dim is {} but q's is {head_dim}; they must match", t.name, t.desc.dims[3]);
        }
    }
    if v.desc.dims != k.desc.dims {
        invalid!("v dims {:?} differ from k dims {:?}; k and v must have the same shape", v.desc.dims, k.desc.dims);
    }
    if o.desc.dims != q.desc.dims {
        invalid!("out dims {:?} differ from q dims {:?}; the output has q's shape", o.desc.dims, q.desc.dims);
    }
    if kv_heads == 0 && heads > 0 {
        invalid!("k/v have 0 heads but q has {heads}");
    }
    if kv_heads > 0 && heads % kv_heads != 0 {
        invalid!("q heads ({heads}) must be a multiple of k/v heads ({kv_heads}) for GQA");
    }
    for (what, n) in [("q sequence length", seqlen_q), ("k/v sequence length", seqlen_k)] {
        if n > i32::MAX as usize / 2 {
            invalid!("{what} {n} exceeds {}", i32::MAX / 2);
        }
    }
    for t in [&q, &k, &v, &o] {
        let multiple = 16 / t.dtype.bytes();
        for (axis, stride) in ["batch", "head", "row"].iter().zip(t.desc.strides) {
            if stride % multiple != 0 {
                invalid!(
                    "{} {axis} stride is {stride} elements; {} strides must be multiples of {multiple} \
                     (16-byte rows for cp.async)",
                    t.name,
                    t.dtype.name()
                );
            }
        }
        if t.desc.span() > t.len {
            invalid!(
                "{} needs {} elements for dims {:?} and strides {:?}, but its buffer holds {}",
                t.name,
                t.desc.span(),
                t.desc.dims,
                t.desc.strides,
                t.len
            );
        }
    }
    if seqlen_q > 1 && o.desc.strides[2] < head_dim {
        invalid!("out row stride {} is below the head dim {head_dim}; output rows would overlap", o.desc.strides[2]);
    }
    let scale = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0) {
        invalid!("softmax scale {scale} must be finite and positive");
    }
    Ok(Problem { batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, scale })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(name: &str, dims: [usize; 4]) -> Arg<'_> {
        let desc = Desc::new(dims, Layout::Bshd);
        Arg { name, dtype: Dtype::F16, desc, len: desc.span() }
    }

    fn check(q: Arg, k: Arg, v: Arg, o: Arg) -> String {
        match validate(q, k, v, o, None) {
            Ok(p) => format!("ok {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts_gqa_and_both_layouts() {
        let q = arg("q", [2, 8, 100, 64]);
        let k = arg("k", [2, 2, 37, 64]);
        let mut v = arg("v", [2, 2, 37, 64]);
        v.desc = Desc::new([2, 2, 37, 64], Layout::Bhsd);
        let p = validate(q, k, v, arg("out", [2, 8, 100, 64]), None).unwrap();
        assert_eq!((p.heads, p.kv_heads, p.seqlen_k), (8, 2, 37));
        assert!((p.scale - 0.125).abs() < 1e-7);
    }

    #[test]
    fn errors_name_value_and_rule() {
        let o = arg("out", [1, 4, 16, 64]);
        let e = check(
            arg("q", [1, 4, 16, 80]),
            arg("k", [1, 4, 16, 80]),
            arg("v", [1, 4, 16, 80]),
            arg("out", [1, 4, 16, 80]),
        );
        assert!(e.contains("head dim is 80") && e.contains("[64, 96, 128, 192, 256]"), "{e}");
        let e = check(arg("q", [1, 4, 16, 64]), arg("k", [1, 3, 16, 64]), arg("v", [1, 3, 16, 64]), o);
        assert!(e.contains("q heads (4) must be a multiple of k/v heads (3)"), "{e}");
        let e = check(arg("q", [1, 4, 16, 64]), arg("k", [1, 4, 16, 64]), arg("v", [1, 4, 17, 64]), o);
        assert!(e.contains("v dims [1, 4, 17, 64] differ from k dims [1, 4, 16, 64]"), "{e}");
        let e = check(arg("q", [1, 4, 16, 64]), arg("k", [2, 4, 16, 64]), arg("v", [2, 4, 16, 64]), o);
        assert!(e.contains("k has batch 2 but q has batch 1"), "{e}");
        let e = check(arg("q", [1, 4, 16, 64]), arg("k", [1, 4, 16, 128]), arg("v", [1, 4, 16, 128]), o);
        assert!(e.contains("k head dim is 128 but q's is 64"), "{e}");
        let e = check(
            arg("q", [1, 4, 16, 64]),
            arg("k", [1, 4, 16, 64]),
            arg("v", [1, 4, 16, 64]),
            arg("out", [1, 4, 15, 64]),
        );
        assert!(e.contains("out dims"), "{e}");
    }

    #[test]
    fn strides_buffers_and_scale() {
        let mut q = arg("q", [1, 1, 4, 64]);
        q.desc.strides[2] = 68;
        q.len = 10_000;
        let e = check(q, arg("k", [1, 1, 4, 64]), arg("v", [1, 1, 4, 64]), arg("out", [1, 1, 4, 64]));
        assert!(e.contains("q row stride is 68 elements") && e.contains("multiples of 8"), "{e}");
        let mut k = arg("k", [1, 1, 4, 64]);
        k.len -= 1;
        let e = check(arg("q", [1, 1, 4, 64]), k, arg("v", [1, 1, 4, 64]), arg("out", [1, 1, 4, 64]));
        assert!(e.contains("k needs 256 elements") && e.contains("holds 255"), "{e}");
        let a = arg("q", [1, 1, 4, 64]);
        let e = validate(a, a, a, a, Some(f32::NAN)).unwrap_err().to_string();
        assert!(e.contains("softmax scale NaN must be finite and positive"), "{e}");
        let e = validate(a, a, a, a, Some(-1.0)).unwrap_err().to_string();
        assert!(e.contains("scale -1"), "{e}");
        let mut o = arg("out", [1, 1, 4, 64]);
        o.dtype = Dtype::Bf16;
        let e = validate(a, a, a, o, None).unwrap_err().to_string();
        assert!(e.contains("out is bf16 but q is f16"), "{e}");
    }

    #[test]
    fn e4m3_inputs_write_16_bit_output_at_their_head_dims_and_strides() {
        let e4m3 = |name, dims| Arg { dtype: Dtype::E4m3, ..arg(name, dims) };
        let (q, o) = (e4m3("q", [1, 2, 32, 128]), arg("out", [1, 2, 32, 128]));
        assert!(validate(q, e4m3("k", [1, 2, 32, 128]), e4m3("v", [1, 2, 32, 128]), o, None).is_ok());
        let bf16_out = Arg { dtype: Dtype::Bf16, ..o };
        assert!(validate(q, e4m3("k", [1, 2, 32, 128]), e4m3("v", [1, 2, 32, 128]), bf16_out, None).is_ok());
        let e = check(q, e4m3("k", [1, 2, 32, 128]), e4m3("v", [1, 2, 32, 128]), e4m3("out", [1, 2, 32, 128]));
        assert!(e.contains("out is e4m3; e4m3 inputs write f16 or bf16 output"), "{e}");
        let e = check(q, arg("k", [1, 2, 32, 128]), e4m3("v", [1, 2, 32, 128]), o);
        assert!(e.contains("k is f16 but q is e4m3; q, k and v must share one dtype"), "{e}");
        let q96 = e4m3("q", [1, 2, 32, 96]);
        let e = check(q96, e4m3("k", [1, 2, 32, 96]), e4m3("v", [1, 2, 32, 96]), arg("out", [1, 2, 32, 96]));
        assert!(e.contains("head dim is 96; e4m3 inputs take head dims [64, 128, 256]"), "{e}");
        // A row of 136 e4m3 elements is not a 16-byte multiple; 136 f16 ones are.
        let mut k = e4m3("k", [1, 2, 32, 128]);
        k.desc.strides[2] = 136;
        k.len = 10_000;
        let e = check(q, k, e4m3("v", [1, 2, 32, 128]), o);
        assert!(e.contains("k row stride is 136 elements; e4m3 strides must be multiples of 16"), "{e}");
    }

    #[test]
    fn grid_limit_and_empty_shapes() {
        let big = arg("q", [65_536, 1, 1, 64]);
        let e = validate(big, big, big, big, None).unwrap_err().to_string();
        assert!(e.contains("batch × heads = 65536 exceeds 65535"), "{e}");
        let empty = arg("q", [1, 2, 0, 64]);
        assert!(validate(empty, empty, empty, empty, None).is_ok());
        assert_eq!(empty.desc.span(), 0);
    }

    #[test]
    fn dims_that_overflow_are_refused_not_wrapped() {
        let huge = 1usize << 40;
        let e = check(
            arg("q", [huge, huge, 1, 64]),
            arg("k", [huge, huge, 1, 64]),
            arg("v", [huge, huge, 1, 64]),
            arg("out", [huge, huge, 1, 64]),
        );
        assert!(e.contains("batch × heads = 1208925819614629174706176 exceeds 65535"), "{e}");
        // No elements, but strides past usize: what a safetensors header may declare.
        let zero = arg("q", [0, huge, huge, 64]);
        assert_eq!((zero.desc.span(), zero.desc.strides[0]), (0, usize::MAX));
        let e = validate(zero, zero, zero, zero, None).unwrap_err().to_string();
        assert!(e.contains("sequence length 1099511627776 exceeds"), "{e}");
        assert_eq!(Desc::new([2, huge, huge, huge], Layout::Bhsd).span(), usize::MAX);
    }
}
