//! The work lists of persistent causal CTAs, where the kernel's own grid-strided
//! pairs would leave the last round uneven.

use super::LaunchGrid;
use super::grid::{Units, block_tiles};

/// A persistent causal launch's schedule (fa::HopperSched::order): for each of
/// `grid` CTAs, the query blocks it runs in order, each as split × heads ×
/// m_blocks + (batch × head) × m_blocks + block index, and `u32::MAX` padding
/// every list to the longest (`stride`); `None` where the kernel's own
/// grid-strided pairs fill every round. The units are the kernel's own
/// (`Units`: pairs of one head's blocks, the longest with the shortest, so that
/// every unit costs about the same), dealt with a grid stride, a head's pairs
/// adjacent; but where the units do not fill the last round, that round's
/// blocks are dealt singly instead, longest first, each to the CTA with the
/// least work so far, so that the CTAs finish together.
///
/// Measured on an H200 (`fa-bench --variant hopper`, two builds, 3 interleaved
/// rounds, f16 / bf16): B1 H1 S8192 D128 causal (8 splits, 256 pairs on 132
/// CTAs) −10.2 / −11.2%, B8 H32 S1024 D64 −0.3 / −0.4%, B4 H16 S2048 D64 −0.4 /
/// −0.6% and D128 −0.2 / −0.8%. An earlier build that read a table for every
/// persistent causal launch was 1.3 to 2.6% slower where pairs fill every round
/// (B8 H33 S1024 D64, B1 H4 S2048 D64 in 4 splits), hence `None` there. Blocks
/// dealt longest first from the start, without pairs, lost their K/V reuse: +1 to
/// +8% (`perf/rejected/lpt-causal-schedule/`).
pub fn causal_order(g: &LaunchGrid, tiles_per_split: u32, grid: u32) -> Option<(u32, Vec<u32>)> {
    let m_blocks = g.m_blocks();
    let splits = u64::from(g.key_tiles().div_ceil(tiles_per_split.max(1)));
    let all = Units::new(m_blocks as u32, splits as u32, g.heads, true);
    let units = all.total;
    let grid = grid.max(1) as usize;
    let pair = |unit: u64| all.blocks(unit).map(move |(split, bh, i)| ((split * g.heads + bh) * m_blocks + i) as u32);
    // A block's cost: its key tiles, plus a quarter tile of fixed cost so that
    // blocks that see no key are spread too.
    let cost = |b: u32| {
        let (sbh, i) = (u64::from(b) / m_blocks, u64::from(b) % m_blocks);
        4 * block_tiles(g, i, sbh / g.heads.max(1), u64::from(tiles_per_split)) + 1
    };
    let full = units / grid as u64 * grid as u64;
    if full == units {
        return None;
    }
    let mut lists: Vec<Vec<u32>> = (0..grid).map(|c| (c as u64..full).step_by(grid).flat_map(pair).collect()).collect();
    let mut rest: Vec<u32> = (full..units).flat_map(pair).collect();
    rest.sort_by_cached_key(|&b| (std::cmp::Reverse(cost(b)), b));
    let mut load: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
        lists.iter().enumerate().map(|(c, l)| std::cmp::Reverse((l.iter().map(|&b| cost(b)).sum(), c))).collect();
    for b in rest {
        let std::cmp::Reverse((l, c)) = load.pop().expect("grid >= 1");
        lists[c].push(b);
        load.push(std::cmp::Reverse((l + cost(b), c)));
    }
    let stride = lists.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(grid * stride);
    for l in &lists {
        order.extend(l.iter().copied().chain(std::iter::repeat(u32::MAX)).take(stride));
    }
    Some((stride as u32, order))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::grid;

    #[test]
    fn causal_order_runs_every_block_once_and_balances_the_ctas() {
        let g = |heads, s, block_m| grid(heads, s, block_m, 128, 1, true);
        assert!(causal_order(&g(264, 1024, 128), 8, 132).is_none(), "B8 H33: 1056 pairs, 8 full rounds");
        assert!(causal_order(&g(4, 2048, 64), 4, 256).is_none(), "B1 H4 S2048 in 4 splits: 256 pairs, one round");
        for (grid, heads, s, block_m, per) in [
            (132, 256, 1024, 128, 8),
            (132, 34, 1000, 128, 8),
            (264, 63, 2048, 64, 16),
            (7, 3, 700, 64, 2),
            (132, 1, 8192, 128, 4),
        ] {
            let lg = g(heads, s, block_m);
            let (stride, order) = causal_order(&lg, per, grid).expect("a partial last round");
            assert_eq!(order.len(), grid as usize * stride as usize);
            let m_blocks = u64::from(s.div_ceil(block_m));
            let splits = u64::from(s.div_ceil(128).div_ceil(per));
            let mut seen: Vec<u32> = order.iter().copied().filter(|&b| b != u32::MAX).collect();
            seen.sort_unstable();
            let all: Vec<u32> = (0..(splits * heads * m_blocks) as u32).collect();
            assert_eq!(seen, all, "every block exactly once: grid {grid}, heads {heads}, S {s}");
            for row in order.chunks(stride as usize) {
                let n = row.iter().take_while(|&&b| b != u32::MAX).count();
                assert!(row[n..].iter().all(|&b| b == u32::MAX), "padding only at the end of a CTA's list");
            }
        }
        // B8 H32 S1024, 128-row blocks: 9216 tiles over 132 CTAs (69.8 each). Whole
        // pairs made it 72 for 100 of them; the last round dealt singly, at most 71.
        let lg = g(256, 1024, 128);
        let (stride, order) = causal_order(&lg, 8, 132).expect("7.8 rounds");
        let worst = order
            .chunks(stride as usize)
            .map(|row| row.iter().filter(|&&b| b != u32::MAX).map(|&b| u64::from(b % 8) + 1).sum::<u64>())
            .max()
            .unwrap();
        assert!(worst <= 71, "longest CTA {worst} tiles");
    }
}
