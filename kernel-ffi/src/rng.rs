//! SplitMix64: fresh, reproducible inputs from one seed, for the test and bench
//! drivers. Pure.

use crate::tensor::Dtype;

/// A SplitMix64 generator: the same seed gives the same values everywhere.
///
/// ```
/// use kernel_ffi::{Dtype, rng::Rng};
///
/// let q = Rng::new(7).bits(Dtype::Bf16, 4, -1.0, 1.0);
/// assert_eq!(q, Rng::new(7).bits(Dtype::Bf16, 4, -1.0, 1.0));
/// assert!(q.iter().all(|&b| (-1.0..=1.0).contains(&Dtype::Bf16.to_f32(b))));
/// ```
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// `n` values uniform in [lo, hi), rounded to `dtype`, as its bits.
    pub fn bits(&mut self, dtype: Dtype, n: usize, lo: f32, hi: f32) -> Vec<u16> {
        (0..n).map(|_| dtype.from_f32(self.uniform(lo, hi))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_in_range() {
        let a = Rng::new(7).bits(Dtype::F16, 1000, -1.5, 1.5);
        assert_eq!(a, Rng::new(7).bits(Dtype::F16, 1000, -1.5, 1.5));
        assert_ne!(a, Rng::new(8).bits(Dtype::F16, 1000, -1.5, 1.5));
        let xs: Vec<f32> = a.iter().map(|&b| Dtype::F16.to_f32(b)).collect();
        assert!(xs.iter().all(|x| (-1.5..=1.5).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
    }
}
