//! Pure pieces of the bench: sample statistics. The shape sets are
//! `fa_schema::shape`'s, so that xtask checks `--shape` by the same rules.

pub use fa_schema::shape::{Batching, Shape, default_shapes};

/// Summary statistics of timing samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// The median (linear-interpolated, as `quantile`).
    pub median: f64,
    /// The first quartile.
    pub q1: f64,
    /// The third quartile.
    pub q3: f64,
    /// The smallest sample.
    pub min: f64,
    /// The arithmetic mean.
    pub mean: f64,
    /// The sample standard deviation over the mean.
    pub rel_stdev: f64,
}

/// Linear-interpolated quantile of sorted data; NaN for none.
///
/// ```
/// use kernel_ffi::bench::quantile;
///
/// assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
/// assert!(quantile(&[], 0.5).is_nan());
/// ```
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The statistics of `samples`, in any order.
///
/// ```
/// use kernel_ffi::bench::stats;
///
/// let st = stats(&[4.0, 1.0, 3.0, 2.0, 5.0]);
/// assert_eq!((st.median, st.q1, st.q3, st.min, st.mean), (3.0, 2.0, 4.0, 1.0, 3.0));
/// ```
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
    fn statistics() {
        let st = stats(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((st.median, st.q1, st.q3, st.min, st.mean), (3.0, 2.0, 4.0, 1.0, 3.0));
        assert!((st.rel_stdev - (2.5f64).sqrt() / 3.0).abs() < 1e-12);
        assert!(!converged(&[1.0, 1.0], 10, 0.01));
        assert!(converged(&[1.0; 20], 10, 0.01));
        let noisy: Vec<f64> = (0..20).map(|i| if i % 2 == 0 { 1.0 } else { 2.0 }).collect();
        assert!(!converged(&noisy, 10, 0.01));
    }
}
