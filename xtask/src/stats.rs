//! The regression gate's statistics. Pure and deterministic.

use serde::{Deserialize, Serialize};

/// A slowdown must exceed this (point estimate) to count.
pub const THRESHOLD: f64 = 0.02;
/// …and the confidence interval's near bound must clear this.
pub const CONFIDENCE_FLOOR: f64 = 0.01;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Regression,
    Improvement,
    Same,
    /// The interval is too wide to call: rerun with more processes.
    Ambiguous,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// median(candidate) / median(base) − 1: positive is slower.
    pub change: f64,
    /// 95% bootstrap interval of `change`.
    pub ci_low: f64,
    pub ci_high: f64,
    pub verdict: Verdict,
}

pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// xorshift64*: a fixed seed makes the interval reproducible for the same data.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Compares per-process medians of the base and the candidate: the change of the
/// median of medians, and a percentile-bootstrap interval (both groups resampled).
pub fn compare(base: &[f64], cand: &[f64]) -> Comparison {
    let change = median(cand) / median(base) - 1.0;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut boot: Vec<f64> = (0..4000)
        .map(|_| {
            let a: Vec<f64> = (0..base.len()).map(|_| base[rng.below(base.len())]).collect();
            let b: Vec<f64> = (0..cand.len()).map(|_| cand[rng.below(cand.len())]).collect();
            median(&b) / median(&a) - 1.0
        })
        .collect();
    boot.sort_by(f64::total_cmp);
    let ci_low = boot[(boot.len() as f64 * 0.025) as usize];
    let ci_high = boot[(boot.len() as f64 * 0.975) as usize - 1];
    Comparison { change, ci_low, ci_high, verdict: verdict(change, ci_low, ci_high) }
}

pub fn verdict(change: f64, lo: f64, hi: f64) -> Verdict {
    if change > THRESHOLD && lo > CONFIDENCE_FLOOR {
        Verdict::Regression
    } else if change < -THRESHOLD && hi < -CONFIDENCE_FLOOR {
        Verdict::Improvement
    } else if lo > -THRESHOLD && hi < THRESHOLD {
        Verdict::Same
    } else {
        Verdict::Ambiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic "noise": a spread of ±spread around `center`.
    fn runs(center: f64, spread: f64, n: usize, phase: usize) -> Vec<f64> {
        (0..n).map(|i| center * (1.0 + spread * (((i * 7 + phase) % 11) as f64 / 5.0 - 1.0))).collect()
    }

    #[test]
    fn identical_code_is_same() {
        let c = compare(&runs(100.0, 0.003, 5, 0), &runs(100.0, 0.003, 5, 3));
        assert_eq!(c.verdict, Verdict::Same, "{c:?}");
    }

    #[test]
    fn three_percent_slower_is_a_regression() {
        let c = compare(&runs(100.0, 0.003, 5, 0), &runs(103.0, 0.003, 5, 1));
        assert_eq!(c.verdict, Verdict::Regression, "{c:?}");
        assert!((c.change - 0.03).abs() < 0.005);
        let c = compare(&runs(103.0, 0.003, 5, 0), &runs(100.0, 0.003, 5, 1));
        assert_eq!(c.verdict, Verdict::Improvement, "{c:?}");
    }

    #[test]
    fn noisy_small_change_is_not_called_a_regression() {
        // 2.5% slower on average, but with 3% process-to-process noise: rerun.
        let c = compare(&runs(100.0, 0.03, 5, 0), &runs(102.5, 0.03, 5, 4));
        assert_ne!(c.verdict, Verdict::Regression, "{c:?}");
        assert_eq!(verdict(0.025, 0.005, 0.04), Verdict::Ambiguous);
        assert_eq!(verdict(0.015, 0.011, 0.019), Verdict::Same, "under the 2% threshold");
    }

    #[test]
    fn median_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
