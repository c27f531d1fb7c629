//! A launch as the simulated split model and the causal schedule see it: its
//! tiles, its work units, and each query block's key tiles; and the units a
//! split-tail launch runs whole.

/// A launch as the simulated split model sees it: the chosen entry's tiles and
/// residency, and the problem's rows and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchGrid {
    /// Whether the causal mask applies (query block i sees i + 1 blocks of keys).
    pub causal: bool,
    /// Batch × heads.
    pub heads: u64,
    /// Queries per head.
    pub seqlen_q: u32,
    /// Keys per head.
    pub seqlen_k: u32,
    /// The entry's query rows per CTA.
    pub block_m: u32,
    /// The entry's key tile.
    pub block_n: u32,
    /// Resident CTAs per SM (the occupancy calculator's, at the entry's
    /// threads and shared memory).
    pub ctas_per_sm: u32,
    /// Resident CTAs looping over pairs of query blocks (longest with shortest)
    /// instead of one CTA per query block, longest first. (The simulation keeps
    /// the pairs where `causal_order` deals the last round singly.)
    pub persistent: bool,
}

impl LaunchGrid {
    /// Query blocks per (batch, head).
    pub(super) fn m_blocks(&self) -> u64 {
        u64::from(self.seqlen_q.div_ceil(self.block_m.max(1)))
    }
    /// Key tiles per (batch, head), at least one.
    pub(super) fn key_tiles(&self) -> u32 {
        self.seqlen_k.div_ceil(self.block_n.max(1)).max(1)
    }
}

/// A persistent entry's work units (fa::HopperSched), grid-strided over its CTAs,
/// a head's units adjacent. Non-causal: one query block of one (split, batch,
/// head) each. Causal: pairs of one (batch, head)'s splits × m_blocks items,
/// numbered z = split × m_blocks + block, the longest left with the shortest
/// (z = items − 1 − i, then z = i): unsplit, block m_blocks − 1 − i with block i;
/// split, block i of split s with block m_blocks − 1 − i of split splits − 1 − s,
/// which together see about one split's keys (pairs within a split would cost
/// from one split's keys to two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Units {
    /// Units per (split, batch, head); causal: per (batch, head).
    pub per_head: u32,
    /// Units in all.
    pub total: u64,
    m_blocks: u64,
    splits: u64,
    heads: u64,
    causal: bool,
}

impl Units {
    /// The units of `heads` (batch × heads) heads of `m_blocks` query blocks in `splits` splits.
    pub fn new(m_blocks: u32, splits: u32, heads: u64, causal: bool) -> Units {
        let (m, s) = (u64::from(m_blocks), u64::from(splits));
        let (per_head, total) =
            if causal { ((m * s).div_ceil(2), (m * s).div_ceil(2) * heads) } else { (m, m * s * heads) };
        Units { per_head: per_head as u32, total, m_blocks: m, splits: s, heads, causal }
    }

    /// The query blocks of unit `u` in the order the kernel runs them, each as
    /// (split, batch × heads + head, block).
    pub fn blocks(&self, u: u64) -> impl Iterator<Item = (u64, u64, u64)> + use<> {
        let per = u64::from(self.per_head).max(1);
        let (m, heads) = (self.m_blocks.max(1), self.heads.max(1));
        let (outer, i) = (u / per, u % per);
        let (first, second) = if self.causal {
            // outer: the head; the pair's items z = split × m_blocks + block.
            let long = m * self.splits - 1 - i;
            let item = |z: u64| (z / m, outer, z % m);
            (item(long), (i != long).then(|| item(i)))
        } else {
            // outer: split × heads + head; i: the block.
            ((outer / heads, outer % heads, i), None)
        };
        std::iter::once(first).chain(second)
    }
}

/// Units a persistent split-tail launch (the Hopper 192-row entry: three consumer
/// warpgroups) runs whole, of `units` on a grid of `ctas`: all but a last round
/// that would leave CTAs idle, whose units then run as three 64-row items each,
/// the warpgroups sharing an item's key tiles, so that the round is a third as
/// long (two thirds where the items fill the grid once over). Where three items
/// a unit would take as long as the whole units (more than two items per CTA),
/// every unit runs whole.
pub fn whole_units(units: u64, ctas: u64) -> u64 {
    let last = units % ctas.max(1);
    if last > 0 && 3 * last <= 2 * ctas { units - last } else { units }
}

/// Whether a persistent launch's work decodes in the kernel's 32-bit ints: its
/// query blocks (a causal schedule's entries), and every unit index a CTA
/// computes before it finds none left, below the units plus the grid (a
/// split-tail launch counts three items a unit).
pub fn decodes_in_i32(blocks: u64, units: u64, ctas: u64, split_tail: bool) -> bool {
    let indices = if split_tail { units.saturating_mul(3) } else { units }.saturating_add(ctas);
    blocks.max(indices) <= i32::MAX as u64
}

/// Key tiles of query block `i` within split `split` of `per` tiles each.
pub(super) fn block_tiles(g: &LaunchGrid, i: u64, split: u64, per: u64) -> u64 {
    let n_blocks = u64::from(g.seqlen_k.div_ceil(g.block_n.max(1)));
    if !g.causal {
        return n_blocks.saturating_sub(split * per).min(per);
    }
    let diag = i64::from(g.seqlen_k) - i64::from(g.seqlen_q); // bottom-right diagonal
    let last_key = (i as i64 + 1) * i64::from(g.block_m) + diag; // keys 0 … last_key − 1
    let tiles = if last_key <= 0 { 0 } else { (last_key as u64).div_ceil(u64::from(g.block_n.max(1))).min(n_blocks) };
    tiles.saturating_sub(split * per).min(per)
}

#[cfg(test)]
mod tests {
    use super::{LaunchGrid, Units, block_tiles, decodes_in_i32, whole_units};

    #[test]
    fn unit_indices_stay_in_32_bits() {
        let max = i32::MAX as u64;
        assert!(decodes_in_i32(1000, 500, 132, false));
        // A CTA's last index passes the units by up to one grid.
        assert!(decodes_in_i32(max - 132, max - 132, 132, false));
        assert!(!decodes_in_i32(max - 100, max - 100, 132, false));
        assert!(!decodes_in_i32(max + 1, 1, 1, false));
        // Split-tail items: three a unit.
        assert!(decodes_in_i32(720_000_000, 720_000_000, 132, false));
        assert!(!decodes_in_i32(720_000_000, 720_000_000, 132, true));
    }

    #[test]
    fn causal_units_pair_mirrored_splits_longest_first() {
        // Two splits of four blocks, one head: items z = split × 4 + block, 7 with 0, 6 with 1, …
        let units = Units::new(4, 2, 1, true);
        let order: Vec<(u64, u64, u64)> = (0..units.total).flat_map(|u| units.blocks(u)).collect();
        let expect = [(1, 3), (0, 0), (1, 2), (0, 1), (1, 1), (0, 2), (1, 0), (0, 3)];
        assert_eq!(order, expect.map(|(s, b)| (s, 0, b)));
        // Unsplit, an odd count: the middle block once.
        let units = Units::new(3, 1, 2, true);
        let order: Vec<(u64, u64, u64)> = (0..units.total).flat_map(|u| units.blocks(u)).collect();
        assert_eq!(order, [(0, 0, 2), (0, 0, 0), (0, 0, 1), (0, 1, 2), (0, 1, 0), (0, 1, 1)]);
    }

    #[test]
    fn units_run_every_block_once() {
        for (m, s, heads) in [(1, 1, 1), (7, 1, 3), (32, 4, 4), (5, 3, 2), (16, 8, 1), (3, 5, 7)] {
            for causal in [false, true] {
                let units = Units::new(m, s, heads, causal);
                let mut seen: Vec<(u64, u64, u64)> = (0..units.total).flat_map(|u| units.blocks(u)).collect();
                seen.sort_unstable();
                let mut all = Vec::new();
                for split in 0..u64::from(s) {
                    for bh in 0..heads {
                        all.extend((0..u64::from(m)).map(|b| (split, bh, b)));
                    }
                }
                all.sort_unstable();
                assert_eq!(seen, all, "m {m} splits {s} heads {heads} causal {causal}");
            }
        }
    }

    #[test]
    fn causal_pairs_of_a_split_launch_cost_about_the_same() {
        // B1 H4 S2048 D64 in 4 splits of 4 key tiles, 64-row blocks: pairs within a
        // split cost up to 8 tiles (blocks 15 and 16 of split 0 see all of its keys);
        // mirrored across splits, every pair 4 or 5.
        let g = LaunchGrid {
            causal: true,
            heads: 4,
            seqlen_q: 2048,
            seqlen_k: 2048,
            block_m: 64,
            block_n: 128,
            ctas_per_sm: 2,
            persistent: true,
        };
        let units = Units::new(32, 4, 4, true);
        assert_eq!(units.total, 256);
        let costs: Vec<u64> =
            (0..units.total).map(|u| units.blocks(u).map(|(s, _, b)| block_tiles(&g, b, s, 4)).sum()).collect();
        assert!(costs.iter().all(|&c| (4..=5).contains(&c)), "{costs:?}");
    }

    #[test]
    fn a_partial_last_round_runs_as_split_tail_items_where_that_shortens_it() {
        // B4 H16 S2048 on 132 SMs: 704 units, five whole rounds and 44 units left,
        // which as 132 items of a third the length fill one round once.
        assert_eq!(whole_units(704, 132), 660);
        // 88 left: 264 items, two thirds of a round.
        assert_eq!(whole_units(748, 132), 660);
        // 89 left: 267 items would take three thirds, a whole round anyway.
        assert_eq!(whole_units(749, 132), 749);
        // Whole rounds, and grids of one unit per CTA, have no partial round.
        assert_eq!(whole_units(1320, 132), 1320);
        assert_eq!(whole_units(100, 100), 100);
        assert_eq!(whole_units(0, 0), 0);
    }
}
