//! A launch as the simulated split model and the causal schedule see it: its
//! tiles, its work units, and each query block's key tiles; and the units a
//! split-tail launch runs whole.

/// A launch as the simulated split model sees it: the chosen entry's tiles and
/// residency, and the problem's rows and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchGrid {
    pub causal: bool,
    /// Batch × heads.
    pub heads: u64,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub block_m: u32,
    pub block_n: u32,
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

/// Work units per (split, batch, head) of a persistent entry: pairs of query
/// blocks, the longest with the shortest, where causal blocks differ in cost;
/// single blocks otherwise.
pub fn blocks_to_units(m_blocks: u32, causal: bool) -> u32 {
    if causal { m_blocks.div_ceil(2) } else { m_blocks }
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

/// The query blocks of causal unit `i` of a head's `m_blocks`: the longest,
/// m_blocks − 1 − i, then the shortest, i, unless they are the same block.
pub(super) fn causal_pair(m_blocks: u64, i: u64) -> impl Iterator<Item = u64> {
    let long = m_blocks - 1 - i;
    std::iter::once(long).chain((i != long).then_some(i))
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
    use super::whole_units;

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
