//! A launch as the simulated split model and the causal schedule see it: its
//! tiles, its work units, and each query block's key tiles.

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
