//! Pure pieces of the bench: the shape sets, FLOP counting and sample statistics.

use crate::error::Error;
use crate::tensor::{self, Arg, Desc, Dtype, Layout};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub seqlen: usize,
    pub head_dim: usize,
    pub causal: bool,
}

impl Shape {
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
        crate::planner::attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, self.causal)
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
        tensor::validate(arg("q"), arg("k"), arg("v"), arg("out"), None).map_err(|e| match e {
            Error::Invalid(rule) => format!("shape `{s}`: {rule}"),
            other => format!("shape `{s}`: {other}"),
        })?;
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

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
    pub min: f64,
    pub mean: f64,
    pub rel_stdev: f64,
}

/// Linear-interpolated quantile of sorted data.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

pub fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let mean = s.iter().sum::<f64>() / n;
    let var = s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    Stats {
        median: quantile(&s, 0.5),
        q1: quantile(&s, 0.25),
        q3: quantile(&s, 0.75),
        min: s.first().copied().unwrap_or(f64::NAN),
        mean,
        rel_stdev: var.sqrt() / mean,
    }
}

/// Stop sampling once the median is pinned down: the interquartile range relative
/// to the median, shrunk by √n (a standard-error-like spread of the median), is
/// under `target`.
pub fn converged(samples: &[f64], min_samples: usize, target: f64) -> bool {
    if samples.len() < min_samples {
        return false;
    }
    let st = stats(samples);
    (st.q3 - st.q1) / st.median / (samples.len() as f64).sqrt() < target
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
    fn statistics() {
        let st = stats(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((st.median, st.q1, st.q3, st.min, st.mean), (3.0, 2.0, 4.0, 1.0, 3.0));
        assert!((st.rel_stdev - (2.5f64).sqrt() / 3.0).abs() < 1e-12);
        assert!(!converged(&[1.0, 1.0], 10, 0.01));
        assert!(converged(&[1.0; 20], 10, 0.01));
        let noisy: Vec<f64> = (0..20).map(|i| if i % 2 == 0 { 1.0 } else { 2.0 }).collect();
        assert!(!converged(&noisy, 10, 0.01));
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
