//! The gate's statistics: an anytime-valid confidence sequence for the median
//! of the per-quad log ratios, and the verdict it supports. Pure and deterministic.
//!
//! For the true median m, each quad's indicator [r ≤ m] is a fair coin. The
//! mixture over p ~ Beta(A, A) of the likelihood ratio of those coins against
//! p = 1/2 is a nonnegative martingale, so by Ville's inequality it passes 1/α at
//! *any* look with probability at most α. The counts k it keeps under 1/α after n
//! quads form [k_lo, n − k_lo], and m lies between the order statistics
//! r_(k_lo) and r_(n−k_lo+1): an interval that may be read after every quad
//! (Howard & Ramdas 2022, "Sequential estimation of quantiles").

use serde::{Deserialize, Serialize};

/// A slowdown the gate must catch: more than 2%.
pub const THRESHOLD: f64 = 0.02;
/// The Beta prior's parameter; 8 keeps the interval tight from about 100 to 1000 quads.
const PRIOR: f64 = 8.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The whole interval lies above +2%.
    Regression,
    /// The whole interval lies below −2%.
    Improvement,
    /// The interval's upper end is under +2%.
    Same,
    /// Undecided at the budget, or too many quads set aside: fails the gate.
    Inconclusive,
}

impl Verdict {
    /// What the gate fails on.
    pub fn fails(self) -> bool {
        matches!(self, Verdict::Regression | Verdict::Inconclusive)
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms: relative error under 1e-13).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = G[0] + G[1..].iter().enumerate().map(|(i, g)| g / (x + i as f64 + 1.0)).sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// ln of the mixture martingale after `n` coins, `k` of them heads.
fn ln_mixture(n: usize, k: usize) -> f64 {
    let (n, k) = (n as f64, k as f64);
    ln_beta(PRIOR + k, PRIOR + n - k) - ln_beta(PRIOR, PRIOR) + n * std::f64::consts::LN_2
}

/// The fewest of `n` quads that must lie at or under the median, at level `alpha`:
/// the smallest k whose mixture stays under 1/α (0 when even k = 0 does).
pub fn lower_count(n: usize, alpha: f64) -> usize {
    let bar = (1.0 / alpha).ln();
    // ln_mixture falls from k = 0 to k = n/2: binary search the first k under the bar.
    let (mut lo, mut hi) = (0, n / 2);
    if ln_mixture(n, hi) >= bar {
        return hi + 1; // no count is consistent: an empty interval
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if ln_mixture(n, mid) < bar { hi = mid } else { lo = mid + 1 }
    }
    lo
}

/// The confidence sequence's interval for the median of `sorted` (ascending, no
/// NaN) at level `alpha`; infinite ends where no order statistic bounds it yet.
pub fn median_interval(sorted: &[f64], alpha: f64) -> (f64, f64) {
    let n = sorted.len();
    let k = lower_count(n, alpha);
    let lo = if k == 0 { f64::NEG_INFINITY } else { sorted.get(k - 1).copied().unwrap_or(f64::INFINITY) };
    // r_(n−k+1), 1-based: index n − k.
    let hi = if k == 0 { f64::INFINITY } else { sorted.get(n - k).copied().unwrap_or(f64::NEG_INFINITY) };
    (lo, hi)
}

/// The verdict an interval of log ratios supports, if any.
pub fn decide((lo, hi): (f64, f64)) -> Option<Verdict> {
    let t = (1.0 + THRESHOLD).ln();
    if lo > t {
        Some(Verdict::Regression)
    } else if hi < -t {
        Some(Verdict::Improvement)
    } else if hi < t {
        Some(Verdict::Same)
    } else {
        None
    }
}

/// When a shape has measured enough.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Per-shape level: 0.05 over the number of shapes.
    pub alpha: f64,
    pub min_quads: usize,
    pub min_secs: f64,
    pub max_quads: usize,
    pub max_secs: f64,
    /// Keep measuring a decided shape until the interval's half-width (in log
    /// ratio) is under this, while the budget lasts.
    pub precision: f64,
    /// More than this fraction of quads set aside (hardware slowdown) is inconclusive.
    pub max_set_aside: f64,
}

impl Rule {
    pub fn for_shapes(shapes: usize, max_secs: f64) -> Rule {
        Rule {
            alpha: 0.05 / shapes.max(1) as f64,
            min_quads: 64,
            min_secs: 1.0,
            max_quads: 20_000,
            max_secs,
            precision: 1.005f64.ln(),
            max_set_aside: 0.10,
        }
    }
}

/// The state of one shape's sequence after a quad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    Continue,
    Stop(Verdict),
}

/// Whether to stop after `quads` quads (`set_aside` of them not counted) and
/// `secs` seconds, `sorted` holding the counted log ratios.
pub fn step(rule: &Rule, sorted: &[f64], set_aside: usize, quads: usize, secs: f64) -> Step {
    let over_budget = quads >= rule.max_quads || secs >= rule.max_secs;
    if quads < rule.min_quads || secs < rule.min_secs {
        return if over_budget { Step::Stop(Verdict::Inconclusive) } else { Step::Continue };
    }
    let too_many_set_aside = set_aside as f64 > rule.max_set_aside * quads as f64;
    let iv = median_interval(sorted, rule.alpha);
    let precise = (iv.1 - iv.0) / 2.0 <= rule.precision;
    match decide(iv) {
        Some(v) if !too_many_set_aside && (precise || over_budget) => Step::Stop(v),
        _ if over_budget => Step::Stop(Verdict::Inconclusive),
        _ => Step::Continue,
    }
}

/// The per-quad statistic: ln((B₁+B₂)/(A₁+A₂)), candidate over base. Positive is slower.
pub fn log_ratio(base: [f64; 2], cand: [f64; 2]) -> f64 {
    ((cand[0] + cand[1]) / (base[0] + base[1])).ln()
}

/// Inserts keeping `sorted` ascending.
pub fn insert_sorted(sorted: &mut Vec<f64>, x: f64) {
    let at = sorted.partition_point(|&y| y <= x);
    sorted.insert(at, x);
}

/// The median of unordered data (NaN when empty).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    sorted_median(&v)
}

/// The median of ascending data (NaN when empty).
pub fn sorted_median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* with Box-Muller normals: seeded, so every run sees the same series.
    struct Rng(u64);
    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
        }
    }

    /// Launch times under a software power cap: the clock sits at one of two
    /// levels (about 1980 and 1760 MHz, so times 1660 and 1870 µs) and hops
    /// between them now and then, within a quad too; 0.4% jitter per launch.
    /// The candidate is `shift` slower. Returns the per-quad log ratios, ABBA/BAAB
    /// in seeded order, as the gate forms them.
    fn power_capped_quads(seed: u64, quads: usize, shift: f64) -> Vec<f64> {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut slow = false;
        let mut launch = |rng: &mut Rng, scale: f64| {
            if rng.uniform() < 0.02 {
                slow = !slow;
            }
            let level = if slow { 1870.0 } else { 1660.0 };
            level * scale * (1.0 + 0.004 * rng.normal())
        };
        (0..quads)
            .map(|_| {
                let abba = rng.uniform() < 0.5;
                let c = 1.0 + shift;
                let (base, cand) = if abba {
                    let a1 = launch(&mut rng, 1.0);
                    let b1 = launch(&mut rng, c);
                    let b2 = launch(&mut rng, c);
                    ([a1, launch(&mut rng, 1.0)], [b1, b2])
                } else {
                    let b1 = launch(&mut rng, c);
                    let a1 = launch(&mut rng, 1.0);
                    let a2 = launch(&mut rng, 1.0);
                    ([a1, a2], [b1, launch(&mut rng, c)])
                };
                log_ratio(base, cand)
            })
            .collect()
    }

    /// Runs the sequential rule over a series, one quad a millisecond of "time".
    fn run_rule(rule: &Rule, series: &[f64], ms_per_quad: f64) -> (Step, usize, (f64, f64)) {
        let mut sorted = Vec::new();
        for (i, &r) in series.iter().enumerate() {
            insert_sorted(&mut sorted, r);
            let s = step(rule, &sorted, 0, i + 1, (i + 1) as f64 * ms_per_quad / 1e3);
            if let Step::Stop(_) = s {
                return (s, i + 1, median_interval(&sorted, rule.alpha));
            }
        }
        (Step::Continue, series.len(), median_interval(&sorted, rule.alpha))
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        assert!((ln_gamma(1.0)).abs() < 1e-13);
        assert!((ln_gamma(10.0) - 362_880f64.ln()).abs() < 1e-11);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
        assert!((ln_gamma(200.5) - 860.582_203_509_782_5).abs() < 1e-9);
    }

    #[test]
    fn a_three_percent_slowdown_under_a_two_level_clock_is_a_regression() {
        let rule = Rule::for_shapes(14, 6.0);
        for seed in 0..20 {
            let series = power_capped_quads(seed, 6000, 0.03);
            let (s, n, iv) = run_rule(&rule, &series, 7.0);
            assert_eq!(s, Step::Stop(Verdict::Regression), "seed {seed}: {n} quads, {iv:?}");
        }
    }

    #[test]
    fn the_same_series_without_the_shift_is_the_same() {
        let rule = Rule::for_shapes(14, 6.0);
        for seed in 0..20 {
            let series = power_capped_quads(seed, 6000, 0.0);
            let (s, n, iv) = run_rule(&rule, &series, 7.0);
            assert_eq!(s, Step::Stop(Verdict::Same), "seed {seed}: {n} quads, {iv:?}");
            assert!(iv.0 > -0.005 && iv.1 < 0.005, "seed {seed}: {iv:?} wider than ±0.5%");
        }
    }

    #[test]
    fn a_short_budget_leaves_a_close_call_inconclusive() {
        // 2.1% slower with 1% noise per quad: 64 quads cannot split it from 2%.
        let mut rng = Rng(7);
        let series: Vec<f64> = (0..64).map(|_| 0.021 + 0.01 * rng.normal()).collect();
        let rule = Rule { max_quads: 64, ..Rule::for_shapes(14, 60.0) };
        assert_eq!(run_rule(&rule, &series, 1.0).0, Step::Stop(Verdict::Inconclusive));
    }

    #[test]
    fn too_many_quads_set_aside_is_inconclusive() {
        let rule = Rule::for_shapes(1, 1.0);
        let sorted = vec![0.0; 200];
        assert_eq!(step(&rule, &sorted, 30, 230, 2.0), Step::Stop(Verdict::Inconclusive));
        assert_eq!(step(&rule, &sorted, 10, 210, 2.0), Step::Stop(Verdict::Same));
    }

    /// The reason for the confidence sequence: looking after every quad.
    /// Over many A/A series the interval must exclude the true median (0) at
    /// some look in under α of them; the fixed-n 95% interval of the median
    /// (normal approximation to the sign test), read the same way, fails far
    /// more often, which shows this test can tell them apart.
    #[test]
    fn peeking_after_every_quad_keeps_errors_under_alpha() {
        let (alpha, series, looks) = (0.05, 300, 1000);
        let (mut sequence_errors, mut naive_errors) = (0, 0);
        for seed in 0..series {
            let mut rng = Rng(seed * 2 + 1);
            let mut sorted = Vec::new();
            let (mut seq_wrong, mut naive_wrong) = (false, false);
            for n in 1..=looks {
                // Heavy-tailed noise: a normal with an occasional 5x outlier.
                let scale = if rng.uniform() < 0.05 { 5.0 } else { 1.0 };
                insert_sorted(&mut sorted, 0.01 * scale * rng.normal());
                if n < 10 {
                    continue;
                }
                let (lo, hi) = median_interval(&sorted, alpha);
                seq_wrong |= lo > 0.0 || hi < 0.0;
                let half = 1.96 * (n as f64).sqrt() / 2.0;
                let k = ((n as f64 / 2.0 - half).floor().max(1.0)) as usize;
                naive_wrong |= sorted[k - 1] > 0.0 || sorted[n - k] < 0.0;
            }
            sequence_errors += seq_wrong as usize;
            naive_errors += naive_wrong as usize;
        }
        let rate = sequence_errors as f64 / series as f64;
        assert!(rate <= alpha, "confidence sequence erred on {rate} of the series");
        let naive = naive_errors as f64 / series as f64;
        assert!(naive > 2.0 * alpha, "the peeked fixed-n interval erred on only {naive}");
    }

    #[test]
    fn interval_ends_are_order_statistics() {
        let sorted: Vec<f64> = (0..500).map(|i| i as f64).collect();
        let k = lower_count(500, 0.01);
        assert!(k > 150 && k < 250, "{k}");
        assert_eq!(median_interval(&sorted, 0.01), ((k - 1) as f64, (500 - k) as f64));
        // Too few quads to bound anything: the whole line.
        assert_eq!(median_interval(&[1.0, 2.0], 0.01), (f64::NEG_INFINITY, f64::INFINITY));
    }

    /// Quads captured by `bench --self-test` on an H100: replaying each series
    /// through the rule, at the seconds it took, gives the verdict the device gave.
    #[test]
    fn captured_h100_quads_replay_to_their_verdicts() {
        let text = include_str!("../../../tests/data/h100/gate-self-test-quads.json");
        let data: serde_json::Value = serde_json::from_str(text).unwrap();
        let alpha = data["alpha"].as_f64().unwrap();
        let rule = Rule { alpha, ..Rule::for_shapes(1, 6.0) };
        let replay = |rs: &[f64], secs: f64| {
            let mut sorted = Vec::new();
            for (i, &r) in rs.iter().enumerate() {
                insert_sorted(&mut sorted, r);
                let t = secs * (i + 1) as f64 / rs.len() as f64;
                if let Step::Stop(v) = step(&rule, &sorted, 0, i + 1, t) {
                    return (v, i + 1);
                }
            }
            (Verdict::Inconclusive, rs.len())
        };
        let series =
            |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
        let verdict = |v: &serde_json::Value| serde_json::from_value::<Verdict>(v.clone()).unwrap();
        for (name, shape) in data["shapes"].as_object().unwrap() {
            for side in ["aa", "planted"] {
                let rs = series(&shape[side]);
                let (v, n) = replay(&rs, shape[format!("{side}_seconds")].as_f64().unwrap());
                assert_eq!(v, verdict(&shape[format!("{side}_verdict")]), "{name} {side}");
                assert_eq!(n, rs.len(), "{name} {side}: stopped where the device stopped");
            }
        }
        // The 8192-key shapes the process-level gate could not call: decided both ways.
        let causal = &data["shapes"]["f16-b2h16s8192d128-causal"];
        assert_eq!(verdict(&causal["planted_verdict"]), Verdict::Regression);
        assert_eq!(verdict(&causal["aa_verdict"]), Verdict::Same);
        // B1 H16 S512 D128: the two processes differ by about 1%, so the planted
        // 3% reads as about 2% and stays undecided.
        let offset = &data["shapes"]["f16-b1h16s512d128"];
        let mut aa = series(&offset["aa"]);
        aa.sort_by(f64::total_cmp);
        let (lo, hi) = median_interval(&aa, alpha);
        assert!(hi < -0.003 && lo > -0.012, "[{lo}, {hi}]");
    }

    #[test]
    fn median_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn decisions_at_the_threshold() {
        let t = 1.02f64.ln();
        assert_eq!(decide((t + 0.001, t + 0.01)), Some(Verdict::Regression));
        assert_eq!(decide((t - 0.001, t + 0.01)), None);
        assert_eq!(decide((-0.01, t - 0.001)), Some(Verdict::Same));
        assert_eq!(decide((-0.05, -t - 0.001)), Some(Verdict::Improvement));
        assert!(Verdict::Inconclusive.fails() && Verdict::Regression.fails() && !Verdict::Same.fails());
    }
}
