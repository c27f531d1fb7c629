//! The shapes the bench and the gate time: `B,H,S,D[,causal]` as flags and
//! names, checked by the launch API's rules (`tensor::validate`) when parsed.

use crate::tensor::{Arg, Desc, Dtype, Layout, validate};

/// Matrix-product FLOPs of an attention forward by the usual convention (the
/// one FlashAttention papers and the bench's TFLOP/s use): 4·B·H·Sq·Sk·D, halved
/// for causal.
pub fn attention_flops(
    batch: usize,
    heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    causal: bool,
) -> f64 {
    let f = 4.0 * (batch * heads) as f64 * seqlen_q as f64 * seqlen_k as f64 * head_dim as f64;
    if causal { f / 2.0 } else { f }
}

/// A self-attention shape the bench times: q, k and v all [batch, heads,
/// seqlen, head_dim].
///
/// ```
/// use fa_schema::shape::Shape;
/// use fa_schema::tensor::Dtype;
///
/// let s = Shape::parse("2,16,8192,128,causal").unwrap();
/// assert_eq!((s.batch, s.heads, s.seqlen, s.head_dim, s.causal), (2, 16, 8192, 128, true));
/// assert_eq!(s.spec(), "2,16,8192,128,causal");
/// assert_eq!(s.name(Dtype::F16), "f16-b2h16s8192d128-causal");
/// // Refused when parsed: the kernels have no head dim 96.
/// assert!(Shape::parse("1,1,128,96").unwrap_err().contains("head dims [64, 128]"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// B.
    pub batch: usize,
    /// H (the k/v heads too).
    pub heads: usize,
    /// Queries and keys per head.
    pub seqlen: usize,
    /// D.
    pub head_dim: usize,
    /// Whether the causal mask applies.
    pub causal: bool,
}

impl Shape {
    /// The name reports and the gate key results by, e.g. `f16-b2h16s8192d128-causal`.
    pub fn name(&self, dtype: Dtype) -> String {
        format!(
            "{}-b{}h{}s{}d{}{}",
            dtype.name(),
            self.batch,
            self.heads,
            self.seqlen,
            self.head_dim,
            if self.causal { "-causal" } else { "" }
        )
    }

    /// `B,H,S,D` or `B,H,S,D,causal`: what `parse` reads.
    pub fn spec(&self) -> String {
        let causal = if self.causal { ",causal" } else { "" };
        format!("{},{},{},{}{causal}", self.batch, self.heads, self.seqlen, self.head_dim)
    }

    /// 4·B·H·S²·D (two matmuls of 2·S²·D each), halved for causal.
    pub fn flops(&self) -> f64 {
        attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, self.causal)
    }

    /// `B,H,S,D` or `B,H,S,D,causal`, each count at least 1, within the launch
    /// API's rules (`tensor::validate`), so that a bad shape is refused before
    /// any CUDA call.
    pub fn parse(s: &str) -> Result<Shape, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let causal = match parts.get(4) {
            None => false,
            Some(&"causal") => true,
            Some(other) => return Err(format!("`{other}` in shape `{s}`: the fifth field may only be `causal`")),
        };
        if !(4..=5).contains(&parts.len()) {
            return Err(format!("shape `{s}` must be B,H,S,D or B,H,S,D,causal"));
        }
        let n =
            |i: usize| parts[i].parse::<usize>().map_err(|_| format!("`{}` in shape `{s}` is not a number", parts[i]));
        let shape = Shape { batch: n(0)?, heads: n(1)?, seqlen: n(2)?, head_dim: n(3)?, causal };
        if [shape.batch, shape.heads, shape.seqlen].contains(&0) {
            return Err(format!("shape `{s}`: batch, heads and sequence length must be at least 1"));
        }
        let desc = Desc::new([shape.batch, shape.heads, shape.seqlen, shape.head_dim], Layout::Bhsd);
        let arg = |name| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
        validate(arg("q"), arg("k"), arg("v"), arg("out"), None).map_err(|e| format!("shape `{s}`: {e}"))?;
        Ok(shape)
    }
}

/// The default set: the seed's small shapes and the large ones.
pub fn default_shapes() -> Vec<Shape> {
    let s = |batch, heads, seqlen, head_dim, causal| Shape { batch, heads, seqlen, head_dim, causal };
    let mut v: Vec<Shape> = [32, 64, 128, 256, 512].iter().map(|&n| s(1, 1, n, 64, false)).collect();
    v.extend([
        s(2, 8, 512, 64, false),
        s(1, 16, 512, 128, false),
        s(4, 16, 2048, 64, false),
        s(4, 16, 2048, 128, false),
        s(2, 16, 8192, 128, false),
        s(2, 16, 8192, 128, true),
        s(8, 32, 1024, 64, true),
        // Causal grids that leave SMs idle when unsplit (planner::plan_simulated).
        s(1, 4, 2048, 64, true),
        s(1, 1, 8192, 128, true),
    ]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_and_names() {
        let s = Shape { batch: 4, heads: 16, seqlen: 2048, head_dim: 64, causal: false };
        assert_eq!(s.flops(), 4.0 * 64.0 * 2048.0 * 2048.0 * 64.0);
        assert_eq!(Shape { causal: true, ..s }.flops(), s.flops() / 2.0);
        assert_eq!(s.name(Dtype::Bf16), "bf16-b4h16s2048d64");
    }

    #[test]
    fn shape_parsing() {
        assert_eq!(Shape::parse("2,16,8192,128,causal").unwrap().seqlen, 8192);
        assert!(Shape::parse("2,16,8192,128,causal").unwrap().causal);
        assert!(Shape::parse("2,16,8192").unwrap_err().contains("B,H,S,D"));
        assert!(Shape::parse("2,16,x,128").unwrap_err().contains("`x`"));
        assert!(Shape::parse("2,16,8,128,sideways").unwrap_err().contains("causal"));
    }

    #[test]
    fn shapes_the_kernels_cannot_run_are_refused_at_parse_time() {
        let e = Shape::parse("1,1,128,96").unwrap_err();
        assert!(e.contains("shape `1,1,128,96`: q head dim is 96; the kernels support head dims [64, 128]"), "{e}");
        assert!(Shape::parse("1,0,128,64").unwrap_err().contains("at least 1"));
        let e = Shape::parse("4294967296,4294967296,1,64").unwrap_err();
        assert!(e.contains("exceeds 65535"), "{e}");
        assert!(Shape::parse("1,1,4294967296,64").unwrap_err().contains("sequence length 4294967296 exceeds"));
        for s in default_shapes() {
            assert_eq!(Shape::parse(&s.spec()), Ok(s));
        }
    }

    #[test]
    fn default_set_covers_the_seed_and_large_shapes() {
        let names: Vec<String> = default_shapes().iter().map(|s| s.name(Dtype::F16)).collect();
        for want in [
            "f16-b1h1s32d64",
            "f16-b1h1s512d64",
            "f16-b2h8s512d64",
            "f16-b2h16s8192d128-causal",
            "f16-b8h32s1024d64-causal",
            "f16-b1h4s2048d64-causal",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
    }
}
