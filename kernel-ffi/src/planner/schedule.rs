//! The work lists of persistent causal CTAs, where the kernel's own grid-strided
//! pairs would leave the last round uneven.

use super::LaunchGrid;
use super::grid::{Units, block_tiles};

/// A persistent causal launch's schedule (fa::HopperSched::order): for each of
/// `grid` CTAs, the query blocks it runs in order, `stride` entries a row, each
/// an `EntryFields` word and `u32::MAX` padding every row to the longest. The
/// units are the kernel's own (`Units`: pairs of one head's blocks, the longest
/// with the shortest, so that every unit costs about the same), dealt with a
/// grid stride, a head's pairs adjacent; but where the units do not fill the
/// last round, that round's blocks are dealt singly instead, longest first, each
/// to the CTA with the least work so far, so that the CTAs finish together.
///
/// Measured on an H200 (`fa-bench --variant hopper`, two builds, 3 interleaved
/// rounds, f16 / bf16): B1 H1 S8192 D128 causal (8 splits, 256 pairs on 132
/// CTAs) −10.2 / −11.2%, B8 H32 S1024 D64 −0.3 / −0.4%, B4 H16 S2048 D64 −0.4 /
/// −0.6% and D128 −0.2 / −0.8%. An earlier build that read a table for every
/// persistent causal launch was 1.3 to 2.6% slower where pairs fill every round
/// (B8 H33 S1024 D64, B1 H4 S2048 D64 in 4 splits), hence no schedule there.
/// Blocks dealt longest first from the start, without pairs, lost their K/V
/// reuse: +1 to +8% (`perf/rejected/lpt-causal-schedule/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub stride: u32,
    pub fields: EntryFields,
    pub entries: Vec<u32>,
}

/// How a schedule entry packs its item into one word (fa::HopperSched::order_at):
/// the query block from bit 0, then the split, the head and the batch, each field
/// as wide as its largest value needs. The kernel takes an entry apart with
/// shifts and masks; a block index would cost it three dependent divisions at
/// every item boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryFields {
    /// Bit positions of the split, head and batch fields.
    pub at: [u32; 3],
}

impl EntryFields {
    /// The fields of `m_blocks` query blocks in `splits` splits of `heads` heads
    /// and `batch` batches; `None` where they need more than 31 bits (bit 31 is
    /// clear in every entry, so that `u32::MAX` pads).
    pub fn new(m_blocks: u64, splits: u64, heads: u64, batch: u64) -> Option<EntryFields> {
        let bits = |n: u64| 64 - n.saturating_sub(1).leading_zeros();
        let head = bits(m_blocks) + bits(splits);
        let at = [bits(m_blocks), head, head + bits(heads)];
        (at[2] + bits(batch) <= 31).then_some(EntryFields { at })
    }

    /// The entry of block `block` of split `split`, head `head`, batch `batch`.
    pub fn pack(&self, block: u64, split: u64, head: u64, batch: u64) -> u32 {
        (block | split << self.at[0] | head << self.at[1] | batch << self.at[2]) as u32
    }

    /// (block, split, head, batch): what the kernel decodes.
    pub fn unpack(&self, e: u32) -> [u64; 4] {
        let field = |lo: u32, hi: u32| u64::from((e >> lo) & ((1u32 << (hi - lo)) - 1));
        [field(0, self.at[0]), field(self.at[0], self.at[1]), field(self.at[1], self.at[2]), u64::from(e >> self.at[2])]
    }
}

/// The schedule of `g` (`heads` query heads a batch) on `grid` CTAs, where the
/// kernel's own grid-strided pairs would leave the last round uneven; `None`
/// where they fill every round, or where an entry's fields need more than 31 bits.
pub fn causal_order(g: &LaunchGrid, heads: u32, tiles_per_split: u32, grid: u32) -> Option<Schedule> {
    let m_blocks = g.m_blocks();
    let splits = u64::from(g.key_tiles().div_ceil(tiles_per_split.max(1)));
    let heads = u64::from(heads.max(1));
    let fields = EntryFields::new(m_blocks, splits, heads, g.heads / heads)?;
    let all = Units::new(m_blocks as u32, splits as u32, g.heads, true);
    let units = all.total;
    let grid = grid.max(1) as usize;
    // Blocks as (split, batch × heads + head, block) until the lists are dealt.
    type Block = (u64, u64, u64);
    let cost = |&(split, _, i): &Block| 4 * block_tiles(g, i, split, u64::from(tiles_per_split)) + 1;
    let full = units / grid as u64 * grid as u64;
    if full == units {
        return None;
    }
    let mut lists: Vec<Vec<Block>> =
        (0..grid).map(|c| (c as u64..full).step_by(grid).flat_map(|u| all.blocks(u)).collect()).collect();
    let mut rest: Vec<Block> = (full..units).flat_map(|u| all.blocks(u)).collect();
    // A block's cost: its key tiles, plus a quarter tile of fixed cost so that
    // blocks that see no key are spread too.
    rest.sort_by_cached_key(|b| (std::cmp::Reverse(cost(b)), *b));
    let mut load: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
        lists.iter().enumerate().map(|(c, l)| std::cmp::Reverse((l.iter().map(cost).sum(), c))).collect();
    for b in rest {
        let std::cmp::Reverse((l, c)) = load.pop().expect("grid >= 1");
        load.push(std::cmp::Reverse((l + cost(&b), c)));
        lists[c].push(b);
    }
    let stride = lists.iter().map(Vec::len).max().unwrap_or(0);
    let mut entries = Vec::with_capacity(grid * stride);
    for l in &lists {
        let packed = l.iter().map(|&(split, bh, i)| fields.pack(i, split, bh % heads, bh / heads));
        entries.extend(packed.chain(std::iter::repeat(u32::MAX)).take(stride));
    }
    Some(Schedule { stride: stride as u32, fields, entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::grid;

    #[test]
    fn entry_fields_round_trip_and_keep_bit_31_for_padding() {
        let f = EntryFields::new(8, 1, 32, 8).expect("11 bits");
        assert_eq!(f.at, [3, 3, 8]);
        assert_eq!(f.unpack(f.pack(7, 0, 31, 7)), [7, 0, 31, 7]);
        let f = EntryFields::new(65, 3, 1, 2).expect("7 + 2 + 0 + 1 bits");
        for e in [[0, 0, 0, 0], [64, 2, 0, 1], [33, 1, 0, 0]] {
            assert_eq!(f.unpack(f.pack(e[0], e[1], e[2], e[3])), e);
        }
        // 31 bits fit, 32 do not: an entry never reads as the padding.
        assert!(EntryFields::new(1 << 10, 1 << 5, 1 << 8, 1 << 8).is_some());
        assert!(EntryFields::new(1 << 10, 1 << 5, 1 << 8, (1 << 8) + 1).is_none());
        let f = EntryFields::new(1 << 10, 1 << 5, 1 << 8, 1 << 8).unwrap();
        assert_eq!(f.pack((1 << 10) - 1, 31, 255, 255), u32::MAX >> 1);
    }

    #[test]
    fn causal_order_runs_every_block_once_and_balances_the_ctas() {
        let g = |heads, s, block_m| grid(heads, s, block_m, 128, 1, true);
        assert!(causal_order(&g(264, 1024, 128), 33, 8, 132).is_none(), "B8 H33: 1056 pairs, 8 full rounds");
        assert!(causal_order(&g(4, 2048, 64), 4, 4, 256).is_none(), "B1 H4 S2048 in 4 splits: 256 pairs, one round");
        assert!(causal_order(&g(1 << 24, 1 << 17, 128), 1 << 12, 8, 132).is_none(), "entries of 41 bits");
        for (grid, bh, heads, s, block_m, per) in [
            (132, 256, 32, 1024, 128, 8),
            (132, 34, 17, 1000, 128, 8),
            (264, 63, 7, 2048, 64, 16),
            (7, 3, 3, 700, 64, 2),
            (132, 1, 1, 8192, 128, 4),
        ] {
            let lg = g(bh, s, block_m);
            let sc = causal_order(&lg, heads, per, grid).expect("a partial last round");
            assert_eq!(sc.entries.len(), grid as usize * sc.stride as usize);
            let m_blocks = u64::from(s.div_ceil(block_m));
            let splits = u64::from(s.div_ceil(128).div_ceil(per));
            let mut seen: Vec<[u64; 4]> =
                sc.entries.iter().filter(|&&e| e != u32::MAX).map(|&e| sc.fields.unpack(e)).collect();
            seen.sort_unstable();
            let mut all = Vec::new();
            for b in 0..bh / u64::from(heads) {
                for h in 0..u64::from(heads) {
                    for split in 0..splits {
                        all.extend((0..m_blocks).map(|i| [i, split, h, b]));
                    }
                }
            }
            all.sort_unstable();
            assert_eq!(seen, all, "every block exactly once: grid {grid}, B·H {bh}, S {s}");
            for row in sc.entries.chunks(sc.stride as usize) {
                let n = row.iter().take_while(|&&e| e != u32::MAX).count();
                assert!(row[n..].iter().all(|&e| e == u32::MAX), "padding only at the end of a CTA's list");
            }
        }
        // B8 H32 S1024, 128-row blocks: 9216 tiles over 132 CTAs (69.8 each). Whole
        // pairs made it 72 for 100 of them; the last round dealt singly, at most 71.
        let sc = causal_order(&g(256, 1024, 128), 32, 8, 132).expect("7.8 rounds");
        let worst = sc
            .entries
            .chunks(sc.stride as usize)
            .map(|row| row.iter().filter(|&&e| e != u32::MAX).map(|&e| sc.fields.unpack(e)[0] + 1).sum::<u64>())
            .max()
            .unwrap();
        assert!(worst <= 71, "longest CTA {worst} tiles");
    }
}
