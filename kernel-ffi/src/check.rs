//! Comparing a kernel's output with a reference: pure numerics shared by the
//! correctness driver and the `run` tool's users.

/// Tolerances per input dtype: relative L2 error of the output, max abs error
/// of the output, max abs error of the LSE. e4m3 is held to the f64 reference
/// of its dequantised inputs.
pub fn tolerances(dtype: crate::Dtype) -> (f64, f64, f64) {
    match dtype {
        // fp16: 11-bit mantissa, output and P rounded to fp16.
        crate::Dtype::F16 => (2e-3, 5e-3, 1e-3),
        // bf16: 8-bit mantissa, so ~8x the fp16 rounding.
        crate::Dtype::Bf16 => (1.2e-2, 4e-2, 1e-3),
        // e4m3: P quantised to 4 significant bits, each p off by at most 2^-4
        // of itself, so O by at most 2^-4 · max |v| (fa-test's v: below 3 with
        // its descale), and far less where the roundings cancel. Scores summed
        // in fp32 are exact (products of e4m3 values), so the LSE keeps fp32's
        // tolerance and a wrong mask or scale moves it; FP8 wgmma's sums add a
        // row's own term (E4M3_WGMMA_QK_EPS).
        crate::Dtype::E4m3 => (2.5e-2, 1.5e-1, 1e-3),
    }
}

/// The Hopper kernel's e4m3 entries sum Q·Kᵀ on FP8 wgmma, which keeps about
/// 13 significand bits and truncates at each step: a score is within about
/// this fraction of `scale · Σ_d |q_d · k_d|` (reference::score_magnitudes_on)
/// of exact, and a row's LSE within its largest. Measured on an H200: up to
/// 2^-11.4 with outlier channels, 2^-15 without; the bound is 2^-10.
pub const E4M3_WGMMA_QK_EPS: f64 = 1.0 / 1024.0;

/// The same for tensor cores that sum Q·Kᵀ in fp32 (16-bit wgmma, mma.sync),
/// where outlier inputs make scores of thousands: an H200 measured up to
/// 2^-21 (1.3e-3 on the LSE of a row whose scores reach about 5000).
pub const FP32_QK_EPS: f64 = 1.0 / 262144.0;

/// How far an output is from its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Errors {
    /// ‖got − want‖₂ / ‖want‖₂ (‖got − want‖₂ where want is all zeros);
    /// infinite where any value of got is not finite.
    pub rel_l2: f64,
    /// max |got − want|; infinite where any value of got is not finite.
    pub max_abs: f64,
    /// Values of got that are NaN or infinite.
    pub non_finite: usize,
}

/// ‖got − want‖₂ / ‖want‖₂ (or ‖got‖₂ when want is all zeros) and max |got − want|.
/// Non-finite values in `got` are counted and make both errors infinite.
///
/// Panics where `got` has fewer elements than `want`.
///
/// ```
/// use kernel_ffi::{Dtype, check};
///
/// let want = [1.0, 2.0, 3.0];
/// let got = [1.0f32, 2.001, 3.0];
/// let e = check::compare(got.iter().map(|&x| f64::from(x)), &want);
/// let (rel_l2, max_abs, _) = check::tolerances(Dtype::F16);
/// assert!(e.rel_l2 < rel_l2 && e.max_abs < max_abs && e.non_finite == 0);
/// assert_eq!(check::compare([f64::NAN, 2.0, 3.0], &want).non_finite, 1);
/// ```
pub fn compare(got: impl IntoIterator<Item = f64>, want: &[f64]) -> Errors {
    let (mut diff2, mut ref2, mut max_abs, mut non_finite) = (0.0, 0.0, 0.0f64, 0);
    let mut n = 0;
    for (g, &w) in got.into_iter().zip(want) {
        n += 1;
        if !g.is_finite() {
            non_finite += 1;
            continue;
        }
        let d = g - w;
        diff2 += d * d;
        ref2 += w * w;
        max_abs = max_abs.max(d.abs());
    }
    assert_eq!(n, want.len(), "compare: got has fewer elements than want");
    if non_finite > 0 {
        return Errors { rel_l2: f64::INFINITY, max_abs: f64::INFINITY, non_finite };
    }
    let rel_l2 = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    Errors { rel_l2, max_abs, non_finite }
}

/// Max |got − want| over rows; −inf must match −inf exactly, NaN never passes.
pub fn compare_lse(got: &[f32], want: &[f64]) -> (f64, usize) {
    let (worst, bad, _) = compare_lse_within(got, want, |_| 0.0);
    (worst, bad)
}

/// [`compare_lse`] where row i's error may exceed the tolerance by `allowance(i)`
/// (an error model's, per row): (max abs error, rows not finite where the
/// reference is or finite where it is −∞, max of error − allowance).
pub fn compare_lse_within(got: &[f32], want: &[f64], allowance: impl Fn(usize) -> f64) -> (f64, usize, f64) {
    let mut worst = 0.0f64;
    let mut excess = f64::NEG_INFINITY;
    let mut bad = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        if w == f64::NEG_INFINITY {
            if g != f64::NEG_INFINITY {
                bad += 1;
            }
        } else if !g.is_finite() {
            bad += 1;
        } else {
            worst = worst.max((g - w).abs());
            excess = excess.max((g - w).abs() - allowance(i));
        }
    }
    (worst, bad, excess.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lse_allowance_is_per_row() {
        let (worst, bad, excess) = compare_lse_within(&[1.5, 2.0], &[1.0, 2.0], |i| if i == 0 { 0.4 } else { 0.0 });
        assert_eq!((worst, bad), (0.5, 0));
        assert!((excess - 0.1).abs() < 1e-12);
        // Another row's allowance does not cover it.
        assert!(
            (compare_lse_within(&[1.0, 2.5], &[1.0, 2.0], |i| if i == 0 { 1.0 } else { 0.0 }).2 - 0.5).abs() < 1e-12
        );
        assert_eq!(compare_lse_within(&[f32::NAN], &[0.0], |_| 9.0).1, 1);
    }

    #[test]
    fn nan_never_passes() {
        let e = compare([1.0, f64::NAN], &[1.0, 2.0]);
        assert_eq!(e.non_finite, 1);
        assert!(e.rel_l2.is_infinite() && e.max_abs.is_infinite());
        assert_eq!(compare_lse(&[f32::NAN], &[0.0]).1, 1);
        assert_eq!(compare_lse(&[0.0], &[f64::NEG_INFINITY]).1, 1);
        assert_eq!(compare_lse(&[f32::NEG_INFINITY], &[f64::NEG_INFINITY]), (0.0, 0));
    }

    #[test]
    fn relative_and_max_errors() {
        let e = compare([3.0, 4.5], &[3.0, 4.0]);
        assert!((e.rel_l2 - 0.1).abs() < 1e-12);
        assert_eq!(e.max_abs, 0.5);
        // All-zero reference (rows that see no key): absolute L2.
        assert_eq!(compare([0.0, 0.0], &[0.0, 0.0]).rel_l2, 0.0);
        assert!(compare([0.1], &[0.0]).rel_l2 > 0.0);
    }
}
