//! The uniform split model: every key block costs the same, and a CTA's time is
//! its key blocks plus a fixed overhead.

use super::{MAX_SPLITS, Plan};

// Calibrated on an H200 (graph replay, D=64, `fa-bench --splits 1` against auto,
// on an early portable kernel): one 64-key block costs ~0.8 µs to a lone CTA,
// launch + Q load + epilogue ~2.3 µs, and the combine kernel ~1.9-2.4 µs, i.e.
// about two and a half key blocks.
/// Cost of one CTA beyond its key blocks (Q load, epilogue), in key-block units.
const CTA_OVERHEAD: f64 = 0.5;
/// Cost of the combine launch, in key-block units.
const COMBINE_COST: f64 = 2.5;
/// Co-resident CTAs per SM that still add throughput on these latency-bound tiles:
/// measured, a second one does not (B=2 H=8 S=512: 9.1 µs unsplit at 1 CTA/SM,
/// 11.5 µs as 2 splits, 11.8 µs as 3; B=1 H=16 S=512 D=128: 13.5 against 15.4).
const USEFUL_CTAS_PER_SM: u32 = 1;

/// `work_ctas` = batch × heads × query blocks; `ctas_per_sm` from the occupancy
/// calculator. A problem that already fills ≥ 80% of one wave runs unsplit.
/// Otherwise each candidate split count is costed as waves × (key blocks per CTA
/// + CTA overhead) + combine, and the cheapest wins, fewer splits on a tie.
pub fn plan(sm_count: u32, ctas_per_sm: u32, work_ctas: u64, seqlen_k: u32, block_n: u32) -> Plan {
    plan_with(sm_count, ctas_per_sm.clamp(1, USEFUL_CTAS_PER_SM), work_ctas, seqlen_k, block_n)
}

/// `plan` for an entry whose CTA is `key_groups` groups of two warps over the
/// same rows (the portable D=64 `_kg2`, 32 rows): each step of its key loop
/// covers `key_groups` blocks, and up to two CTAs per SM add throughput, as a
/// 64-row CTA's four warps would. Measured on an H100 (`fa-bench --block-m 32
/// --key-groups 2 --splits 1|2|4|8`, 2 rounds in one run): B1 H1 S2048 fastest
/// in 4 splits (256 CTAs, 9.9 µs against 11.5 in 2), B1 H1 S512 in 4 (5.2
/// against 5.6 unsplit), S128-S384 and B1 H4 S256 unsplit.
pub fn plan_grouped(
    sm_count: u32,
    ctas_per_sm: u32,
    work_ctas: u64,
    seqlen_k: u32,
    block_n: u32,
    key_groups: u32,
) -> Plan {
    let step = block_n.max(1) * key_groups.max(1);
    plan_with(sm_count, ctas_per_sm.clamp(1, 2), work_ctas, seqlen_k, step)
}

/// The caller's split count for keys up to `seqlen_k`: whole key tiles per
/// split, so that no split is empty (at most `n` splits, at most [`MAX_SPLITS`]).
pub fn plan_fixed(n: u32, seqlen_k: u32, block_n: u32) -> Plan {
    let block_n = block_n.max(1);
    let n_blocks = seqlen_k.div_ceil(block_n).max(1);
    let per = n_blocks.div_ceil(n.clamp(1, MAX_SPLITS));
    Plan { num_splits: n_blocks.div_ceil(per), keys_per_split: per * block_n }
}

/// Splits for a serving launch, whose sequences' key counts live on the device
/// (each at most `max_seqlen_k`): a CTA's work is not known, so the keys are
/// split until the grid makes about [`RAGGED_WAVES`] waves, each split at
/// least [`RAGGED_MIN_BLOCKS`] key tiles. A long sequence's splits then spread
/// over the SMs while a short one's empty splits exit at once.
pub fn plan_ragged(sm_count: u32, ctas_per_sm: u32, work_ctas: u64, max_seqlen_k: u32, block_n: u32) -> Plan {
    let n_blocks = max_seqlen_k.div_ceil(block_n.max(1)).max(1);
    let slots = u64::from(sm_count.max(1)) * u64::from(ctas_per_sm.max(1));
    let wanted = (RAGGED_WAVES * slots).div_ceil(work_ctas.max(1));
    let most = (n_blocks / RAGGED_MIN_BLOCKS).max(1);
    plan_fixed(wanted.min(u64::from(most)) as u32, max_seqlen_k, block_n)
}

/// Waves of CTAs `plan_ragged` aims for.
pub const RAGGED_WAVES: u64 = 4;
/// Fewest key tiles per split `plan_ragged` makes.
pub const RAGGED_MIN_BLOCKS: u32 = 4;

/// The model over `useful` CTAs per SM, for key blocks of `block_n`.
fn plan_with(sm_count: u32, useful: u32, work_ctas: u64, seqlen_k: u32, block_n: u32) -> Plan {
    let block_n = block_n.max(1);
    let n_blocks = seqlen_k.div_ceil(block_n).max(1);
    let slots = u64::from(sm_count.max(1)) * u64::from(useful);
    let unsplit = Plan { num_splits: 1, keys_per_split: n_blocks * block_n };
    if work_ctas == 0 || work_ctas * 5 >= slots * 4 || n_blocks == 1 {
        return unsplit;
    }
    let cost = |splits: u32, blocks_per_split: u32| {
        let waves = (work_ctas * u64::from(splits)).div_ceil(slots) as f64;
        let combine = if splits > 1 { COMBINE_COST } else { 0.0 };
        waves * (f64::from(blocks_per_split) + CTA_OVERHEAD) + combine
    };
    // Candidates: every whole number of key blocks per split, so none is empty.
    let mut best = (cost(1, n_blocks), unsplit);
    for blocks_per_split in (1..n_blocks).rev() {
        let splits = n_blocks.div_ceil(blocks_per_split);
        if splits > MAX_SPLITS {
            break;
        }
        let c = cost(splits, blocks_per_split);
        if c < best.0 - 1e-9 {
            best = (c, Plan { num_splits: splits, keys_per_split: blocks_per_split * block_n });
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{H200_SMS, L4_SMS, ctas};

    #[test]
    fn fixed_splits_are_whole_tiles_and_never_empty() {
        assert_eq!(plan_fixed(3, 130, 64), Plan { num_splits: 3, keys_per_split: 64 });
        assert_eq!(plan_fixed(4, 130, 64), Plan { num_splits: 3, keys_per_split: 64 });
        assert_eq!(plan_fixed(2, 1000, 64), Plan { num_splits: 2, keys_per_split: 512 });
        assert_eq!(plan_fixed(5, 0, 64), Plan { num_splits: 1, keys_per_split: 64 });
        assert_eq!(plan_fixed(1000, 1 << 20, 64).num_splits, MAX_SPLITS);
    }

    #[test]
    fn ragged_decode_splits_until_the_grid_fills_the_gpu() {
        // Decode: 64 sequences × 8 k/v heads, one query block each, up to 32k keys.
        let p = plan_ragged(H200_SMS, 2, 64 * 8, 32768, 64);
        assert!(p.num_splits > 1 && u64::from(p.num_splits) * 512 >= RAGGED_WAVES * 264 - 512, "{p:?}");
        // One long sequence: as many splits as make four waves.
        let p = plan_ragged(H200_SMS, 2, 8, 32768, 64);
        assert_eq!(p.num_splits, 128);
        // Short caches keep at least RAGGED_MIN_BLOCKS tiles per split.
        assert_eq!(plan_ragged(H200_SMS, 2, 8, 512, 64).num_splits, 2);
        // A prefill grid that fills the GPU runs unsplit.
        assert_eq!(plan_ragged(H200_SMS, 2, 65536, 8192, 64).num_splits, 1);
    }

    #[test]
    fn large_problems_stay_unsplit() {
        let p = plan(H200_SMS, 3, ctas(4, 16, 2048), 2048, 64);
        assert_eq!(p, Plan { num_splits: 1, keys_per_split: 2048 });
        assert_eq!(plan(L4_SMS, 3, ctas(8, 32, 1024), 1024, 64).num_splits, 1);
    }

    #[test]
    fn seed_cases_fill_the_gpu() {
        // H200, measured: S=256 5.0 µs as 4 splits against 5.4 unsplit; S=512 5.5 µs as
        // 8 splits against 8.6 unsplit. Every key block becomes its own split.
        for s in [256u32, 512] {
            let p = plan(H200_SMS, 3, ctas(1, 1, s.into()), s, 64);
            assert_eq!((p.num_splits, p.keys_per_split), (s / 64, 64), "S={s}: {p:?}");
        }
        // 128 CTAs already cover the H200's 132 SMs: unsplit (measured 9.1 µs against
        // 11.5 with 2 splits for B=2 H=8 S=512; 13.5 against 15.4 for B=1 H=16 D=128).
        assert_eq!(plan(H200_SMS, 3, ctas(2, 8, 512), 512, 64).num_splits, 1);
        assert_eq!(plan(H200_SMS, 2, ctas(1, 16, 512), 512, 64).num_splits, 1);
        // On the 58-SM L4 the same 128 CTAs are 2.2 waves; splitting cannot shorten that.
        assert_eq!(plan(L4_SMS, 3, ctas(2, 8, 512), 512, 64).num_splits, 1);
    }

    #[test]
    fn two_key_blocks_do_not_pay_for_a_combine() {
        // B=1 H=1 S=128 has two 64-key blocks: splitting saves one block (~0.8 µs) and
        // costs the combine launch (~2 µs). Measured: 5.6 µs split, 3.9 µs unsplit.
        for sms in [H200_SMS, L4_SMS] {
            assert_eq!(plan(sms, 3, ctas(1, 1, 128), 128, 64).num_splits, 1);
        }
    }

    #[test]
    fn l4_seed_shapes_spread_over_the_sms() {
        // The seed's B=1 H=1 S=512 launched 8 CTAs on the 58-SM L4; now 4 splits of two
        // key blocks each: 32 CTAs in one wave (64 one-block CTAs would need two).
        let p = plan(L4_SMS, 3, ctas(1, 1, 512), 512, 64);
        assert_eq!(ctas(1, 1, 512) * u64::from(p.num_splits), 32);
        assert_eq!(p.keys_per_split, 128);
    }

    #[test]
    fn splits_cover_all_keys_without_empty_splits() {
        for sk in [1u32, 63, 64, 65, 200, 513, 4096, 100_000] {
            for work in [1u64, 7, 100, 500] {
                let p = plan(L4_SMS, 2, work, sk, 64);
                assert!(p.num_splits >= 1 && p.num_splits <= MAX_SPLITS);
                assert_eq!(p.keys_per_split % 64, 0);
                let covered = u64::from(p.num_splits) * u64::from(p.keys_per_split);
                assert!(covered >= u64::from(sk), "{p:?} misses keys of {sk}");
                assert!(
                    u64::from(p.num_splits - 1) * u64::from(p.keys_per_split) < u64::from(sk.max(1)),
                    "{p:?} has an empty split for {sk}"
                );
            }
        }
    }

    #[test]
    fn two_group_ctas_split_less() {
        // H100, 32-row two-group CTAs (`fa-bench --splits 1|2|4|8`): unsplit to 384
        // keys, 4 splits at 512 and 2048 keys (128-key steps, two CTAs per SM).
        let grouped = |h: u64, s: u32| {
            let p = plan_grouped(H200_SMS, 3, h * u64::from(s).div_ceil(32), s, 64, 2);
            assert_eq!(p.keys_per_split % 128, 0, "{p:?}");
            p.num_splits
        };
        for s in [128, 192, 256, 384] {
            assert_eq!(grouped(1, s), 1, "S={s}");
        }
        assert_eq!(grouped(4, 256), 1);
        assert_eq!(grouped(1, 512), 4);
        assert_eq!(grouped(1, 2048), 4);
        // Keys not a multiple of the 128-key step are still covered.
        let p = plan_grouped(L4_SMS, 2, 3, 200, 64, 2);
        assert!(p.num_splits * p.keys_per_split >= 200 && (p.num_splits - 1) * p.keys_per_split < 200, "{p:?}");
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        assert_eq!(plan_grouped(0, 0, 0, 0, 0, 0).num_splits, 1);
        assert_eq!(plan(0, 0, 0, 0, 0).num_splits, 1);
        assert_eq!(plan(132, 1, 1, 0, 64).num_splits, 1);
    }
}
