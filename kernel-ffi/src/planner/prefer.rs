//! Which compiled entry runs a problem: the measured rules for the kernel
//! family, the rows and key groups per CTA, and persistent CTAs.

/// Whether the Hopper kernel beats the portable one on an sm_90 device: wherever
/// a head has more than one 64-key block. Below that the Hopper kernel's 128-key
/// tile is half empty and its fixed cost (barrier set-up, the TMA pipeline
/// filling) shows. Measured on an H200 with graph replay (`fa-bench --variant
/// portable|hopper`, 3 rounds in one run, f16; exploratory, not in the ledger):
/// 64 keys or fewer, portable 14-16% faster (B1 H1 S32/S64, D64 2.82/3.07 against
/// 3.33/3.55 µs, D128 3.39/4.05 against 4.01/4.71); from 96 keys on the Hopper
/// kernel 2-18% faster at every size tried (B1 H1 S96 D64 3.51 against 3.90, B1 H1
/// S128 D128 4.50 against 5.23, B1 H1/H2/H4/H8 S256 D128 4-18%, B1 H16 S512 D128
/// 9.1 against 12.5, and 1.5-1.7x on every large shape).
pub fn prefer_hopper(seqlen_k: usize) -> bool {
    seqlen_k > 64
}

/// Whether a serving call whose sequences have up to `max_seqlen_q` query rows
/// runs on the Hopper kernel's `_varlen` entries: prefill does, in 128-row
/// tiles of one query head; decode and short chunks (64 rows or fewer) stay on
/// the portable entries, which pack the query heads of a K/V head into one
/// tile's rows, so that each K/V tile is read once per group rather than once
/// per head, and a one-token query fills a tile's rows instead of 1 of 128.
pub fn prefer_hopper_varlen(max_seqlen_q: usize) -> bool {
    max_seqlen_q > 64
}

/// Whether a kernel with 64- and 128-row entries should run the 64-row one, from
/// each entry's resident CTA slots (SMs × CTAs per SM, the occupancy calculator's)
/// and rows per CTA, and the 64-row grid: when that grid fits in one wave, so that
/// more SMs work, or when the 128-row entry keeps no more query rows resident
/// (the portable D=128 one on an L4, where 64 KB of shared memory leaves one CTA
/// per SM: 4 warps against the 64-row entry's 8). Causal grids also take the
/// 64-row entry below 2.5 waves of 128-row CTAs: their blocks' costs grow with the
/// row index, and in few waves the last, uneven wave of coarse blocks costs more
/// than two row tiles per warp save.
///
/// The 64-row entry measured on an H200 (`fa-bench --block-m 64|128`, 3 rounds):
/// Hopper D=128 (one CTA per SM either way) 15% faster at B1 H16 S512 (128 CTAs
/// against 64), 35-43% slower wherever 128-row CTAs already fill the GPU; portable
/// D=64 (three 64-row or two 128-row CTAs per SM) 17-30% faster on B1 H1 S512 and
/// B2 H8 S512, 9-12% slower from B4 H16 S2048 up; portable D=128 15-17% slower
/// from B1 H16 S2048 up (both measured before each warp of the 128-row entries
/// owned two 16-row tiles);
/// portable D=128 causal (two CTAs of either size per SM) 4% faster at B1 H16
/// S4096 (1.9 waves of 128-row CTAs), 5% slower at B4 H16 S2048 (3.9 waves) and
/// 11-12% at B2 H16 S8192 (7.8), which a list-scheduling model of the causal grid
/// reproduces with 128-row CTAs 18% cheaper per row and puts the break-even
/// between 2.2 and 2.9 waves. (Hopper D=64, and e4m3 D=128 between 128 and 192
/// rows, choose by `prefer_m192` and `prefer_wide_causal_d64`.)
pub fn prefer_m64(
    causal: bool,
    narrow_ctas: u64,
    narrow_slots: u64,
    narrow_rows: u64,
    wide_slots: u64,
    wide_rows: u64,
) -> bool {
    let wide_ctas = (narrow_ctas * narrow_rows).div_ceil(wide_rows.max(1));
    narrow_ctas <= narrow_slots
        || narrow_slots * narrow_rows >= wide_slots * wide_rows
        || (causal && 2 * wide_ctas < 5 * wide_slots)
}

/// Whether a causal Hopper D=64 problem should run the 128-row entry (two consumer
/// warpgroups taking turns on the exponentials, one CTA per SM) rather than two
/// 64-row CTAs per SM, from the 128-row grid (query blocks × batch × heads), its
/// resident slots and the keys per head. Both keep 128 query rows resident per
/// SM (so `prefer_m64` would never leave the 64-row entry); the 128-row one wins
/// from 1024 keys on grids of at least three waves, and loses where its coarser,
/// serial items leave SMs idle (few waves) or do little work per item (512 keys).
///
/// Measured on an H200 with today's 128-row entry (`fa-bench --variant hopper
/// --block-m 64|128`, 3 rounds in one run, f16 / bf16): B2 H16 S4096 (7.8 waves
/// of 128-row CTAs) −5.0 / −4.8%, B1 H32 S4096 (7.8) −5.3 / −4.4%, B1 H16 S8192
/// (7.8) −2.4 / −2.7%, B4 H8 and B2 H16 S2048 (3.9) −4.3 / −4.4% and −4.1 /
/// −4.1%, B4 H16 S1024 (3.9) −2.4% (bf16), B8 H32 S512 (7.8) −0.2 / +0.3%, B2 H8
/// S1024 (1) +25%. Before its Q descriptor went through a shuffle and its ring
/// slot was worked out at the end of a tile, the 128-row entry won only at
/// 1024-2048 keys (B2 H16 S4096 ±0.1%, B1 H16 S8192 +1.7%).
pub fn prefer_wide_causal_d64(wide_ctas: u64, wide_slots: u64, seqlen_k: usize) -> bool {
    seqlen_k >= 1024 && wide_ctas >= 3 * wide_slots
}

/// Whether a non-causal Hopper problem should run the 192-row entry (three
/// consumer warpgroups, one persistent CTA per SM, a partial last round as
/// split-tail items: `whole_units`) rather than the narrower one (D=64: two
/// 64-row CTAs per SM; e4m3 D=128: one 128-row CTA of two), from its grid of
/// 192-row units (query blocks × batch × heads), the resident slots and the
/// queries and keys per head. Three warpgroups hide more of each other's
/// softmax than two CTAs of one, but a unit is three times as coarse: it wins
/// from 2048 queries and keys on grids of at least four rounds, and loses where
/// few rounds or short heads leave its coarser units, a last block's unused rows
/// (every warpgroup runs every key tile: at 64 queries two thirds of the work
/// would be wasted), or the tail round showing.
///
/// Measured on an H100 (`fa-bench --variant hopper --block-m 64|192`, 3 rounds
/// in one run, f16): B4 H16 S2048 (5.3 rounds of 192-row units) −8.8% (bf16
/// −9.7%), B8 H16 S2048 (10.7) −10%, B2 H16 S4096 (5.3) −10%, B1 H16 S8192 (5.2)
/// −11%; B16 H16 S1024 (11.6) −1%, B8 H16 S1024 (5.8) ±0.3%, B2 H16 S2048 (2.7)
/// +1%, B8 H16 S512 (2.9) +2.5%, B4 H16 S1024 (2.9) +4%, and under two rounds
/// (B4 H16 S512, B2 H8 S1024, B1 H16 S2048) 39-47% slower.
///
/// e4m3 D=128, on an H200 (`fa-bench --dtype e4m3 --variant hopper --block-m
/// 128|192`, 2 rounds in one run), where the 128-row entry's two warpgroups
/// leave the tensor pipe idle half the time: B4 H16 S2048 (5.3 rounds) −7%,
/// B1 H16 S8192 (5.2) and B1 H32 S4096 (5.3) −6.7%; B8 H16 S1024 (5.8, short
/// heads) −1%, B1 H8 S8192 (2.6) −1.5%, B2 H16 S2048, B1 H16 S4096, B4 H16 S1024,
/// B16 H16 S1024, B32 H16 S512 and B1 H4 S16384 within ±0.5%; B1 H2 S16384 (1.3
/// rounds) +2%, B64 H16 S256 (a 192-row block of 256 queries) +17%, B1 H16 S2048
/// (1.3) +47%.
pub fn prefer_m192(wide_units: u64, wide_slots: u64, seqlen_q: usize, seqlen_k: usize) -> bool {
    seqlen_q >= 2048 && seqlen_k >= 2048 && wide_units >= 4 * wide_slots
}

/// Whether an entry with a persistent twin should run it, given the planned grid
/// (query blocks × batch × heads × splits) and the resident slots. A persistent
/// CTA loads its next item's Q and first K/V tiles under the current one and
/// skips the CTA launch gap, which only pays where CTAs have more than one item;
/// at one item each its larger code cost 4% in instruction-cache misses.
///
/// Measured on an H200 (Hopper non-causal D=64, two 64-row CTAs per SM; same-run
/// A/B, f16 and bf16 alike): B4 H16 S1024 7-8% faster
/// (7.8 waves), B4 H16 S2048 2-3% (7.8 waves of 16-tile CTAs), B2 H16 S8192
/// unchanged; B2 H8 S512 (128 CTAs, half a wave) 4% slower.
pub fn prefer_persistent(grid_ctas: u64, slots: u64) -> bool {
    grid_ctas > slots
}

/// Whether a 64-row entry should run as its two-key-group twin of the same rows
/// (the portable D=128 `_kg2`: eight warps, each group of four walking every
/// other key block of the CTA's split), given the one-group entry's grid (query
/// blocks × batch × heads × splits) and key blocks per CTA. Only a grid of at
/// most one CTA per SM gains: there the second group doubles the warps per SM and
/// halves the serial key loop, without a combine launch; where CTAs share SMs
/// anyway, the two-group merge is pure cost. And each group needs two key blocks
/// to beat its start-up.
///
/// Measured on an H200 (`fa-bench --variant portable --key-groups 1|2`, 3 rounds
/// in one run, f16 and bf16 alike; the D=64 figures are of a 64-row D=64 twin of
/// the same build, since replaced by a 32-row one, `prefer_narrow_key_groups`):
/// one CTA per SM of 8 or 16 key blocks 5-11% faster (B2 H8 S512 D64 9.33 →
/// 8.54 µs, B1 H16 S512 D128 13.48 → 12.47, B1 H8 S1024 D128 22.77 → 20.36, B1
/// H1 S2048 D64 in 4 splits 11.37 → 10.81); of 4 blocks within ±3% (B1 H16 S256
/// D64 −3%, B1 H32 S256 D128 ±1%, B1 H8 S512 D128 in 2 splits −0.5%); of 2
/// blocks 7% slower (B1 H4 S512 D128 in 4 splits); two CTAs per SM 33% slower
/// (B2 H16 S512 D64, 256 CTAs).
pub fn prefer_key_groups(grid_ctas: u64, sm_count: u32, blocks_per_cta: u32) -> bool {
    grid_ctas <= u64::from(sm_count) && blocks_per_cta >= 4
}

/// Whether a 64-row entry should give way to a two-key-group entry of fewer rows
/// (the portable D=64 `_kg2`: 32 rows, two groups of two warps, each warp
/// walking every other key block of its 16 rows), given the 64-row entry's
/// unsplit grid (query blocks × batch × heads) and the head's 64-key blocks.
/// Where that grid leaves SMs idle, the narrow entry runs twice the CTAs, each
/// warp's chain of mma.sync half as long, and needs fewer splits
/// (`plan_grouped`); where it fills them, twice the CTAs only queue.
///
/// Measured on an H100 (`fa-bench --variant portable`, 32-row two-group entry at
/// its best split against the 64-row entry's planned launch, 2 rounds in one run,
/// f16): B1 H1 S128 3.02 against 3.69 µs, S256 3.91 / 4.91, S512 5.22 / 5.46, S1024
/// 6.39 / 6.73, B1 H4 S512 5.58 / 6.50, B2 H8 S512 (128 CTAs) 7.55 / 7.96; one
/// key block (S64) has nothing to share; B2 H16 S512 and B4 H8 S512 (256 CTAs)
/// 13.4 against 11.2.
pub fn prefer_narrow_key_groups(narrow_ctas: u64, sm_count: u32, key_blocks: u32) -> bool {
    narrow_ctas <= u64::from(sm_count) && key_blocks >= 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{H200_SMS, L4_SMS, ctas};
    use crate::planner::plan;

    #[test]
    fn serving_prefill_takes_the_hopper_entries_and_decode_the_packed_portable_ones() {
        for decode in [1, 4, 64] {
            assert!(!prefer_hopper_varlen(decode), "{decode} query rows");
        }
        for prefill in [65, 128, 8192] {
            assert!(prefer_hopper_varlen(prefill), "{prefill} query rows");
        }
    }

    #[test]
    fn persistent_twin_only_past_a_wave() {
        let slots = 132 * 2; // H200, two 64-row Hopper D=64 CTAs per SM
        assert!(!prefer_persistent(128, slots), "B2 H8 S512 D64: one item per CTA, 4% slower persistent");
        assert!(!prefer_persistent(slots, slots));
        assert!(prefer_persistent(2048, slots), "B4 H16 S1024/S2048 D64: 7.8 waves");
        assert!(prefer_persistent(slots + 1, slots));
    }

    #[test]
    fn wide_causal_d64_from_1024_keys_on_three_waves() {
        let slots = 132; // H200, one 128-row Hopper D=64 CTA per SM
        let wide = |b: u64, h: u64, s: u64| b * h * s.div_ceil(128);
        assert!(prefer_wide_causal_d64(wide(8, 32, 1024), slots, 1024), "B8 H32 S1024: -3%");
        assert!(prefer_wide_causal_d64(wide(2, 16, 2048), slots, 2048), "B2 H16 S2048: -4%");
        assert!(prefer_wide_causal_d64(wide(4, 16, 1024), slots, 1024), "B4 H16 S1024: -2%");
        assert!(prefer_wide_causal_d64(wide(2, 16, 4096), slots, 4096), "B2 H16 S4096: -5%");
        assert!(prefer_wide_causal_d64(wide(1, 16, 8192), slots, 8192), "B1 H16 S8192: -2.5%");
        assert!(!prefer_wide_causal_d64(wide(2, 8, 1024), slots, 1024), "B2 H8 S1024, one wave: +25%");
        assert!(!prefer_wide_causal_d64(wide(8, 32, 512), slots, 512), "B8 H32 S512: even");
        assert!(!prefer_wide_causal_d64(wide(1, 4, 2048), slots, 2048), "B1 H4 S2048: under a wave, split");
    }

    #[test]
    fn m192_from_2048_keys_on_four_rounds() {
        // One 192-row CTA per SM on 132 SMs (H100 and H200 alike).
        let slots = 132;
        let wide = |b: u64, h: u64, s: usize| prefer_m192(b * h * (s as u64).div_ceil(192), slots, s, s);
        // e4m3 D=128 against the 128-row entry, measured on an H200.
        assert!(wide(4, 16, 2048), "B4 H16 S2048: -7%");
        assert!(wide(1, 16, 8192), "B1 H16 S8192: -6.7%");
        assert!(wide(1, 32, 4096), "B1 H32 S4096: -6.7%");
        assert!(wide(2, 16, 8192), "B2 H16 S8192: -4 to -12%");
        assert!(!wide(1, 16, 2048), "B1 H16 S2048, 1.3 rounds: +47%");
        assert!(!wide(1, 2, 16384), "B1 H2 S16384, 1.3 rounds: +2%");
        assert!(!wide(64, 16, 256), "B64 H16 S256: +17%");
        assert!(!wide(2, 16, 2048), "B2 H16 S2048: even");
        // 16-bit D=64 against two 64-row CTAs per SM, measured on an H100.
        assert!(wide(4, 16, 2048), "B4 H16 S2048: -9%");
        assert!(wide(8, 16, 2048), "B8 H16 S2048: -10%");
        assert!(wide(2, 16, 4096), "B2 H16 S4096: -10%");
        assert!(wide(1, 16, 8192), "B1 H16 S8192: -11%");
        assert!(!wide(16, 16, 1024), "B16 H16 S1024: -1%");
        assert!(!wide(2, 16, 2048), "B2 H16 S2048, 2.7 rounds: +1%");
        assert!(!wide(1, 16, 2048), "B1 H16 S2048, 1.3 rounds: +47%");
        assert!(!wide(4, 16, 512), "B4 H16 S512: +44%");
        // B64 H16, 64 queries against 4096 keys: 1024 units, but each 192-row unit
        // would run two warpgroups of rows past the queries over every key tile.
        assert!(!prefer_m192(64 * 16, slots, 64, 4096));
        assert!(!prefer_m192(64 * 16 * 6, slots, 1024, 4096));
    }

    #[test]
    fn m64_where_it_measured_faster() {
        // H200: 132 SMs, one Hopper D=128 CTA per SM either way.
        let d128 = |b: u64, h: u64, s: u64| prefer_m64(false, b * h * s.div_ceil(64), 132, 64, 132, 128);
        assert!(d128(1, 16, 512));
        // Portable D=64 non-causal, three 64-row or two 128-row CTAs per SM on an H200
        // and an L4 (58 SMs).
        let d64 =
            |sms: u64, b: u64, h: u64, s: u64| prefer_m64(false, b * h * s.div_ceil(64), 3 * sms, 64, 2 * sms, 128);
        assert!(d64(132, 1, 1, 512) && d64(132, 2, 8, 512));
        assert!(!d64(132, 4, 16, 2048) && !d64(132, 16, 16, 1024) && !d64(132, 2, 16, 4096));
        assert!(d64(58, 2, 8, 512) && d64(58, 1, 16, 512));
        assert!(!d64(58, 1, 16, 1024) && !d64(58, 4, 16, 2048));
        // Portable D=128 non-causal: two CTAs of either size per SM on an H200 (the
        // measured 15-17% win of 128 rows from B1 H16 S2048 up); on an L4 the 128-row
        // entry's 64 KB leaves one per SM, so the 64-row one always.
        let h200 = |b: u64, h: u64, s: u64| prefer_m64(false, b * h * s.div_ceil(64), 264, 64, 264, 128);
        assert!(h200(1, 16, 512) && !h200(1, 16, 2048) && !h200(4, 16, 2048));
        let l4 = |causal: bool, b: u64, h: u64, s: u64| prefer_m64(causal, b * h * s.div_ceil(64), 116, 64, 58, 128);
        assert!(l4(false, 1, 16, 512) && l4(false, 4, 16, 2048) && l4(false, 2, 16, 8192));
        assert!(!d128(2, 16, 512) && !d128(1, 16, 1024) && !d128(4, 16, 2048) && !d128(2, 16, 8192));
        // Portable D=128 causal: two CTAs of either size per SM on an H200; 128-row
        // CTAs from 2.5 waves (measured: 4% slower at 1.9 waves, 5-12% faster from
        // 3.9 up); on an L4 the 64-row entry, as non-causal.
        let h200_causal = |b: u64, h: u64, s: u64| prefer_m64(true, b * h * s.div_ceil(64), 264, 64, 264, 128);
        assert!(h200_causal(1, 16, 4096) && h200_causal(1, 16, 512) && h200_causal(2, 16, 2048));
        assert!(!h200_causal(4, 16, 2048) && !h200_causal(2, 16, 8192) && !h200_causal(1, 12, 8192));
        assert!(l4(true, 2, 16, 8192) && l4(true, 1, 16, 4096));
    }

    #[test]
    fn key_groups_where_they_measured_faster() {
        // H200: 128 unsplit 64-row CTAs of 8 or 16 key blocks, 4 splits of 8 (measured wins).
        assert!(prefer_key_groups(ctas(2, 8, 512), H200_SMS, 8));
        assert!(prefer_key_groups(ctas(1, 8, 1024), H200_SMS, 16));
        assert!(prefer_key_groups(ctas(1, 1, 2048) * 4, H200_SMS, 8));
        // Two CTAs per SM (measured loss), or one or two key blocks per CTA after
        // splitting (measured losses: B1 H4 S512 in 4 splits, B1 H1 S512 in 8).
        assert!(!prefer_key_groups(ctas(2, 16, 512), H200_SMS, 8));
        assert!(!prefer_key_groups(ctas(1, 4, 512) * 4, H200_SMS, 2));
        assert!(!prefer_key_groups(ctas(1, 1, 512) * 8, H200_SMS, 1));
        // The L4's 58 SMs: the same 128 CTAs are 2.2 waves, no gain; the seed's
        // B1 H1 S512 planned as 4 splits of 2 blocks, no gain either.
        assert!(!prefer_key_groups(ctas(2, 8, 512), L4_SMS, 8));
        let p = plan(L4_SMS, 3, ctas(1, 1, 512), 512, 64);
        assert!(!prefer_key_groups(ctas(1, 1, 512) * u64::from(p.num_splits), L4_SMS, p.keys_per_split / 64));
        // Whatever the arch: at most one CTA per SM with four blocks each takes two groups.
        assert!(prefer_key_groups(u64::from(L4_SMS), L4_SMS, 4) && !prefer_key_groups(59, L4_SMS, 4));
    }

    #[test]
    fn narrow_key_groups_while_64_row_ctas_leave_sms_idle() {
        // H100/H200 (132 SMs): measured wins up to 128 64-row CTAs of two or more key blocks.
        assert!(prefer_narrow_key_groups(ctas(1, 1, 128), H200_SMS, 2));
        assert!(prefer_narrow_key_groups(ctas(2, 8, 512), H200_SMS, 8));
        // One key block; 256 CTAs (measured 19% slower).
        assert!(!prefer_narrow_key_groups(ctas(1, 1, 64), H200_SMS, 1));
        assert!(!prefer_narrow_key_groups(ctas(2, 16, 512), H200_SMS, 8));
        assert!(!prefer_narrow_key_groups(ctas(2, 8, 512), L4_SMS, 8));
    }

    #[test]
    fn hopper_only_where_it_measured_faster() {
        // Measured on an H200: portable faster at one 64-key block, Hopper from 96 keys.
        assert!(!prefer_hopper(32) && !prefer_hopper(64));
        for keys in [96, 128, 256, 512, 2048, 8192] {
            assert!(prefer_hopper(keys), "{keys}");
        }
    }
}
