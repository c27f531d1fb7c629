//! Split-KV planner: how many key splits make a small problem fill the GPU.
//! A pure function of the device and the shape, so it is tested without a GPU.

/// Most splits the planner will choose (the combine kernel loops over them).
pub const MAX_SPLITS: u32 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub num_splits: u32,
    /// Keys per split, a multiple of the kernel's key tile.
    pub keys_per_split: u32,
}

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
    let block_n = block_n.max(1);
    let n_blocks = seqlen_k.div_ceil(block_n).max(1);
    let slots = u64::from(sm_count.max(1)) * u64::from(ctas_per_sm.clamp(1, USEFUL_CTAS_PER_SM));
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
    fn m_blocks(&self) -> u64 {
        u64::from(self.seqlen_q.div_ceil(self.block_m.max(1)))
    }
    /// Key tiles per (batch, head), at least one.
    fn key_tiles(&self) -> u32 {
        self.seqlen_k.div_ceil(self.block_n.max(1)).max(1)
    }
}

/// A kernel entry family's constants in the simulated split model, in units of
/// one key tile's time for a lone CTA on an SM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GridCost {
    /// An SM's throughput with 1, 2, 3 or more resident CTAs sharing it equally.
    pub sm_throughput: [f64; 3],
    /// What a query block costs beyond its key tiles (Q load, pipeline fill, epilogue).
    pub block_overhead: f64,
    /// The combine launch of a split plan.
    pub combine: f64,
}

// Fitted per entry family (grid search, fewest mispicks then least relative
// error) to sweeps of forced split counts (1, 2, 3, 4, 6, 8) on an H200,
// `perf/calibration/`: 14 causal shapes from B1 H1 S1024 to B1 H16 S2048, where
// the model picks the measured best count for 27 of 28 (shape, kernel) pairs and
// one within 1%, and 14 non-causal ones from B1 H1 S256 to B1 H1 S8192 (Hopper
// kernel), all 14 picked best. Tests hold the model to 2% on every row.
pub const PORTABLE_D64_CAUSAL: GridCost =
    GridCost { sm_throughput: [1.0, 1.6, 2.0], block_overhead: 1.0, combine: 8.0 };
pub const PORTABLE_D128_CAUSAL: GridCost =
    GridCost { sm_throughput: [1.0, 1.2, 1.2], block_overhead: 1.0, combine: 4.0 };
pub const HOPPER_D64_CAUSAL: GridCost = GridCost { sm_throughput: [1.0, 1.4, 1.4], block_overhead: 2.0, combine: 3.0 };
pub const HOPPER_D128_CAUSAL: GridCost = GridCost { sm_throughput: [1.0, 1.0, 1.0], block_overhead: 3.0, combine: 4.0 };
pub const HOPPER_D64: GridCost = GridCost { sm_throughput: [1.0, 1.4, 1.4], block_overhead: 2.0, combine: 2.0 };
pub const HOPPER_D128: GridCost = GridCost { sm_throughput: [1.0, 1.0, 1.0], block_overhead: 3.0, combine: 2.0 };

/// The simulated model's constants for a launch of the Hopper or the portable
/// kernel, or `None` where the uniform model of `plan` decides (the portable
/// kernel's non-causal launches: its two-key-group entries are outside the
/// simulation).
pub fn grid_cost(hopper: bool, head_dim: usize, causal: bool) -> Option<GridCost> {
    Some(match (hopper, head_dim, causal) {
        (true, 64, true) => HOPPER_D64_CAUSAL,
        (true, _, true) => HOPPER_D128_CAUSAL,
        (true, 64, false) => HOPPER_D64,
        (true, _, false) => HOPPER_D128,
        (false, _, false) => return None,
        (false, 64, true) => PORTABLE_D64_CAUSAL,
        (false, _, true) => PORTABLE_D128_CAUSAL,
    })
}

/// Split counts the simulated model tries: those its constants were fitted on. It
/// tries none whose grid exceeds this many waves of resident CTAs either.
const SIM_SPLITS: [u32; 5] = [2, 3, 4, 6, 8];
const SIM_MAX_WAVES: u64 = 4;

/// Split plan for a causal launch, or any launch of the Hopper kernel. Causal
/// query blocks differ in cost (block i sees i + 1 blocks of keys), so a grid that
/// leaves SMs idle is as slow as its longest block, which splitting the keys
/// shortens; and a second resident CTA adds throughput to some kernels and not
/// others. The uniform model of `plan` sees neither (it left B1 H4 S2048 D64 causal
/// unsplit, 28 µs on an H200 where 4 splits take 19.5, and split the Hopper
/// kernel's B1 H1 S4096 D64 in 2 where 4 are 25% faster). Each candidate split
/// count is simulated: CTAs dispatched in
/// grid order, round-robin over the SMs up to their residency, then each to the
/// SM that frees a slot first; an SM's throughput shared equally among its
/// resident CTAs; plus the combine. A launch whose unsplit grid fills every
/// resident slot twice runs unsplit.
pub fn plan_simulated(sm_count: u32, g: &LaunchGrid, cost: &GridCost) -> Plan {
    let block_n = g.block_n.max(1);
    let n_blocks = g.key_tiles();
    let unsplit = Plan { num_splits: 1, keys_per_split: n_blocks * block_n };
    let slots = u64::from(sm_count.max(1)) * u64::from(g.ctas_per_sm.max(1));
    let m_blocks = g.m_blocks();
    let units = if g.persistent { u64::from(blocks_to_units(m_blocks as u32, g.causal)) } else { m_blocks } * g.heads;
    if units == 0 || units >= 2 * slots || n_blocks == 1 {
        return unsplit;
    }
    let mut best = (makespan(sm_count, g, cost, n_blocks), unsplit);
    let mut last_per = n_blocks;
    for splits in SIM_SPLITS.into_iter().filter(|&n| n <= n_blocks) {
        let per = n_blocks.div_ceil(splits);
        if per == last_per || units * u64::from(splits) > SIM_MAX_WAVES * slots {
            continue;
        }
        last_per = per;
        let plan = Plan { num_splits: n_blocks.div_ceil(per), keys_per_split: per * block_n };
        let t = makespan(sm_count, g, cost, per) + cost.combine;
        if t < best.0 - 1e-9 {
            best = (t, plan);
        }
    }
    best.1
}

/// Work units per (split, batch, head) of a persistent entry: pairs of query
/// blocks, the longest with the shortest, where causal blocks differ in cost;
/// single blocks otherwise.
pub fn blocks_to_units(m_blocks: u32, causal: bool) -> u32 {
    if causal { m_blocks.div_ceil(2) } else { m_blocks }
}

/// The query blocks of causal unit `i` of a head's `m_blocks`: the longest,
/// m_blocks − 1 − i, then the shortest, i, unless they are the same block.
fn causal_pair(m_blocks: u64, i: u64) -> impl Iterator<Item = u64> {
    let long = m_blocks - 1 - i;
    std::iter::once(long).chain((i != long).then_some(i))
}

/// A persistent causal launch's schedule (fa::HopperSched::order): for each of
/// `grid` CTAs, the query blocks it runs in order, each as split × heads ×
/// m_blocks + (batch × head) × m_blocks + block index, and `u32::MAX` padding
/// every list to the longest (`stride`); `None` where the kernel's own
/// grid-strided pairs fill every round. Units are pairs of one head's blocks,
/// the longest with the shortest (so that every unit costs about the same, and
/// the short block's keys, a prefix of the long one's, are still in L2), dealt
/// with a grid stride, a head's pairs adjacent; but where the units do not fill
/// the last round, that round's blocks are dealt singly instead, longest first,
/// each to the CTA with the least work so far, so that the CTAs finish together
/// (with splits, pairs also differ in cost: a split holds only part of a block's
/// keys).
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
    let per_head = u64::from(blocks_to_units(m_blocks as u32, true));
    let units = per_head * splits * g.heads;
    let grid = grid.max(1) as usize;
    let pair = |unit: u64| {
        let sbh = unit / per_head;
        causal_pair(m_blocks, unit % per_head).map(move |i| (sbh * m_blocks + i) as u32)
    };
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

/// Key tiles of query block `i` within split `split` of `per` tiles each.
fn block_tiles(g: &LaunchGrid, i: u64, split: u64, per: u64) -> u64 {
    let n_blocks = u64::from(g.seqlen_k.div_ceil(g.block_n.max(1)));
    if !g.causal {
        return n_blocks.saturating_sub(split * per).min(per);
    }
    let diag = i64::from(g.seqlen_k) - i64::from(g.seqlen_q); // bottom-right diagonal
    let last_key = (i as i64 + 1) * i64::from(g.block_m) + diag; // keys 0 … last_key − 1
    let tiles = if last_key <= 0 { 0 } else { (last_key as u64).div_ceil(u64::from(g.block_n.max(1))).min(n_blocks) };
    tiles.saturating_sub(split * per).min(per)
}

/// Simulated time of the launch with `per` key tiles per split, in tile units.
fn makespan(sm_count: u32, g: &LaunchGrid, cost: &GridCost, per: u32) -> f64 {
    let splits = u64::from(g.key_tiles().div_ceil(per.max(1)));
    let per = u64::from(per);
    let m_blocks = g.m_blocks();
    let block = |i: u64, split: u64| block_tiles(g, i, split, per) as f64 + cost.block_overhead;
    // CTA costs in launch order.
    let mut ctas: Vec<f64> = Vec::new();
    if g.persistent {
        // Units (split, head, pair or block), grid-strided over as many CTAs as are resident.
        let per_head = u64::from(blocks_to_units(m_blocks as u32, g.causal));
        let grid = (per_head * g.heads * splits).min(u64::from(sm_count.max(1)) * u64::from(g.ctas_per_sm.max(1)));
        ctas.resize(grid as usize, 0.0);
        let mut unit = 0usize;
        for split in 0..splits {
            for _ in 0..g.heads {
                for i in 0..per_head {
                    let w = if g.causal {
                        causal_pair(m_blocks, i).map(|b| block(b, split)).sum()
                    } else {
                        block(i, split)
                    };
                    ctas[unit % grid as usize] += w;
                    unit += 1;
                }
            }
        }
    } else {
        for split in 0..splits {
            for _ in 0..g.heads {
                ctas.extend((0..m_blocks).map(|x| block(m_blocks - 1 - x, split)));
            }
        }
    }
    simulate_sms(sm_count.max(1) as usize, g.ctas_per_sm.max(1) as usize, &cost.sm_throughput, &ctas)
}

/// Finishing time of CTAs of the given costs, dispatched in order: round-robin
/// over the SMs up to `resident` each, then each to the SM that frees a slot
/// first. An SM's resident CTAs share its throughput equally, so its state only
/// changes at its own completions, and an SM's clock advances alone.
fn simulate_sms(sms: usize, resident: usize, throughput: &[f64; 3], ctas: &[f64]) -> f64 {
    struct Sm {
        clock: f64,
        left: Vec<f64>, // remaining work of each resident CTA
    }
    let rate = |n: usize| throughput[n.clamp(1, 3) - 1] / n as f64;
    let mut sm: Vec<Sm> = (0..sms).map(|_| Sm { clock: 0.0, left: Vec::with_capacity(resident) }).collect();
    let mut next = 0;
    for _ in 0..resident {
        for s in sm.iter_mut() {
            if next < ctas.len() {
                s.left.push(ctas[next]);
                next += 1;
            }
        }
    }
    // Next completion time per SM, smallest first.
    let finish = |s: &Sm| s.left.iter().copied().fold(f64::INFINITY, f64::min) / rate(s.left.len()) + s.clock;
    let mut end = 0.0f64;
    let mut heap: std::collections::BinaryHeap<(std::cmp::Reverse<OrdF64>, usize)> = sm
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.left.is_empty())
        .map(|(i, s)| (std::cmp::Reverse(OrdF64(finish(s))), i))
        .collect();
    while let Some((std::cmp::Reverse(OrdF64(t)), i)) = heap.pop() {
        let s = &mut sm[i];
        let done = (t - s.clock) * rate(s.left.len());
        s.clock = t;
        for w in s.left.iter_mut() {
            *w -= done;
        }
        let before = s.left.len();
        s.left.retain(|&w| w > 1e-9);
        for _ in s.left.len()..before {
            if next < ctas.len() {
                s.left.push(ctas[next]);
                next += 1;
            }
        }
        end = end.max(t);
        if !s.left.is_empty() {
            heap.push((std::cmp::Reverse(OrdF64(finish(s))), i));
        }
    }
    end
}

/// f64 ordered for the simulation's heap (its times are finite).
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

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
/// between 2.2 and 2.9 waves. (Hopper D=64 non-causal has only 64-row CTAs, two
/// per SM: 1.6-25% faster than 128-row ones up to 4096 keys, even to 5% slower at
/// 8192; causal D=64 chooses by `prefer_wide_causal_d64`.)
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

/// Whether a 64-row entry should run as its two-key-group twin (`_kg2`: eight warps,
/// each group of four walking every other key block of the CTA's split), given the
/// one-group entry's grid (query blocks × batch × heads × splits) and key blocks
/// per CTA. Only a grid of at most one CTA per SM gains: there the second group
/// doubles the warps per SM and halves the serial key loop, without a combine
/// launch; where CTAs share SMs anyway, the two-group merge is pure cost. And each
/// group needs two key blocks to beat its start-up.
///
/// Measured on an H200 (`fa-bench --variant portable --key-groups 1|2`, 3 rounds
/// in one run, f16 and bf16 alike): one CTA per SM of 8 or 16
/// key blocks 5-11% faster (B2 H8 S512 D64 9.33 → 8.54 µs, B1 H16 S512 D128 13.48
/// → 12.47, B1 H8 S1024 D128 22.77 → 20.36, B1 H1 S2048 D64 in 4 splits 11.37 →
/// 10.81); of 4 blocks within ±3% (B1 H16 S256 D64 −3%, B1 H32 S256 D128 ±1%,
/// B1 H8 S512 D128 in 2 splits −0.5%); of 2 blocks 7% slower (B1 H4 S512 D128 in
/// 4 splits); two CTAs per SM 33% slower (B2 H16 S512 D64, 256 CTAs).
pub fn prefer_key_groups(grid_ctas: u64, sm_count: u32, blocks_per_cta: u32) -> bool {
    grid_ctas <= u64::from(sm_count) && blocks_per_cta >= 4
}

/// Matrix-product FLOPs of an attention forward by the usual convention (the
/// one FlashAttention papers and the bench's TFLOP/s use): 4·B·H·Sq·Sk·D, halved
/// for causal.
pub fn attention_flops(
    batch: usize,
    heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    causal: bool,
) -> f64 {
    let f = 4.0 * (batch * heads) as f64 * seqlen_q as f64 * seqlen_k as f64 * head_dim as f64;
    if causal { f / 2.0 } else { f }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const H200_SMS: u32 = 132;
    const L4_SMS: u32 = 58;

    fn ctas(b: u64, h: u64, sq: u64) -> u64 {
        b * h * sq.div_ceil(64)
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
    fn degenerate_inputs_do_not_panic() {
        assert_eq!(plan(0, 0, 0, 0, 0).num_splits, 1);
        assert_eq!(plan(132, 1, 1, 0, 64).num_splits, 1);
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

    fn grid(heads: u64, s: u32, block_m: u32, block_n: u32, ctas_per_sm: u32, persistent: bool) -> LaunchGrid {
        LaunchGrid { causal: true, heads, seqlen_q: s, seqlen_k: s, block_m, block_n, ctas_per_sm, persistent }
    }

    /// The model's time for a split count, as `plan_simulated` costs it.
    fn modelled(g: &LaunchGrid, cost: &GridCost, splits: u32) -> f64 {
        let per = g.seqlen_k.div_ceil(g.block_n).div_ceil(splits);
        makespan(H200_SMS, g, cost, per) + if splits > 1 { cost.combine } else { 0.0 }
    }

    /// One shape of the calibration sweep: its grid as each launch saw it, and
    /// (launched splits, median µs) per forced split count.
    struct Swept {
        variant: String,
        head_dim: usize,
        grid: LaunchGrid,
        timed: Vec<(u32, f64)>,
    }

    /// The sweeps the simulated model's constants were fitted to, with the
    /// residency of each entry on an H200.
    fn sweep() -> Vec<Swept> {
        let mut out: BTreeMap<String, Swept> = BTreeMap::new();
        let csv = include_str!("../../perf/calibration/splits-h200.csv");
        for line in csv.lines().filter(|l| !l.starts_with('#')).skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let [variant, dtype, b, h, s, d, causal, requested, launched, block_m, _method, us] = f[..] else {
                panic!("bad row {line}")
            };
            if requested == "auto" {
                continue;
            }
            let n = |x: &str| x.parse::<u32>().unwrap();
            let (causal, hopper) = (causal == "1", variant == "hopper");
            let grid = LaunchGrid {
                causal,
                heads: u64::from(n(b) * n(h)),
                seqlen_q: n(s),
                seqlen_k: n(s),
                block_m: n(block_m),
                block_n: if hopper { 128 } else { 64 },
                ctas_per_sm: match (hopper, n(d)) {
                    (true, 64) => 2,
                    (true, _) => 1,
                    (false, 64) => 3,
                    (false, _) => 2,
                },
                persistent: hopper && causal,
            };
            let key = format!("{variant} {dtype} {grid:?}");
            let row = out.entry(key).or_insert_with(|| Swept {
                variant: variant.into(),
                head_dim: n(d) as usize,
                grid,
                timed: Vec::new(),
            });
            row.timed.push((n(launched), us.parse().unwrap()));
        }
        out.into_values().collect()
    }

    #[test]
    fn simulated_model_picks_within_two_percent_of_the_measured_best() {
        let mut checked = 0;
        for Swept { variant, head_dim, grid: g, timed } in sweep() {
            let Some(cost) = grid_cost(variant == "hopper", head_dim, g.causal) else {
                continue; // portable non-causal: the uniform model
            };
            let best = timed.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
            let (pick, us) = timed
                .iter()
                .copied()
                .min_by(|a, b| modelled(&g, &cost, a.0).total_cmp(&modelled(&g, &cost, b.0)))
                .unwrap();
            assert!(us <= 1.02 * best, "{variant} {g:?}: model picks {pick} splits ({us} µs), best {best} µs");
            checked += 1;
        }
        assert_eq!(checked, 42, "14 causal shapes × 2 kernels + 14 non-causal on the Hopper kernel");
    }

    #[test]
    fn causal_plans_split_only_grids_that_leave_slots_idle() {
        // Measured on an H200: B1 H4 S2048 D64 causal, 28.0 µs unsplit, 19.5 in 4 splits.
        let g = grid(4, 2048, 64, 64, 3, false);
        assert_eq!(plan_simulated(H200_SMS, &g, &PORTABLE_D64_CAUSAL), Plan { num_splits: 4, keys_per_split: 512 });
        // Hopper D=128, B1 H4 S2048: 36 µs unsplit, 42 in the uniform model's 2 splits, 25 in 4.
        let g = grid(4, 2048, 128, 128, 1, true);
        assert_eq!(plan_simulated(H200_SMS, &g, &HOPPER_D128_CAUSAL).num_splits, 4);
        // Grids that fill every slot stay unsplit.
        for (heads, s) in [(16, 2048), (32, 1024), (64, 8192)] {
            let g = grid(heads, s, 64, 64, 3, false);
            assert_eq!(plan_simulated(H200_SMS, &g, &PORTABLE_D64_CAUSAL).num_splits, 1, "{g:?}");
        }
        // An L4 (58 SMs, two 64-row D=128 CTAs per SM): B1 H16 S1024 fills its 116
        // slots twice over; B1 H1 S4096's 64 CTAs leave half of them idle.
        let g = grid(16, 1024, 64, 64, 2, false);
        assert_eq!(plan_simulated(L4_SMS, &g, &PORTABLE_D128_CAUSAL).num_splits, 1);
        let g = grid(1, 4096, 64, 64, 2, false);
        assert!(plan_simulated(L4_SMS, &g, &PORTABLE_D128_CAUSAL).num_splits > 1);
    }

    #[test]
    fn simulated_plans_cover_all_keys_without_empty_splits() {
        for (sq, sk) in [(1u32, 1u32), (1, 4096), (4096, 1), (1000, 3000), (3000, 1000), (2048, 2048), (0, 64)] {
            for heads in [1u64, 3, 40] {
                for (bm, bn, resident, persistent) in [(64, 64, 3, false), (128, 128, 1, true), (64, 128, 2, true)] {
                    for causal in [false, true] {
                        let g = LaunchGrid {
                            causal,
                            heads,
                            seqlen_q: sq,
                            seqlen_k: sk,
                            block_m: bm,
                            block_n: bn,
                            ctas_per_sm: resident,
                            persistent,
                        };
                        let p = plan_simulated(L4_SMS, &g, &HOPPER_D64_CAUSAL);
                        assert!((1..=8).contains(&p.num_splits), "{g:?} {p:?}");
                        assert_eq!(p.keys_per_split % bn, 0);
                        let covered = u64::from(p.num_splits) * u64::from(p.keys_per_split);
                        assert!(covered >= u64::from(sk), "{g:?} {p:?}");
                        let before_last = u64::from(p.num_splits - 1) * u64::from(p.keys_per_split);
                        assert!(before_last < u64::from(sk.max(1)), "{g:?} {p:?}");
                    }
                }
            }
        }
        let zero = LaunchGrid {
            causal: true,
            heads: 0,
            seqlen_q: 0,
            seqlen_k: 0,
            block_m: 0,
            block_n: 0,
            ctas_per_sm: 0,
            persistent: true,
        };
        assert_eq!(plan_simulated(0, &zero, &PORTABLE_D64_CAUSAL).num_splits, 1);
    }

    #[test]
    fn simulated_sms_share_throughput() {
        // Two equal CTAs on one SM that runs 1.5x with two: each takes 2 / 1.5 × its work.
        assert!((simulate_sms(1, 2, &[1.0, 1.5, 1.5], &[3.0, 3.0]) - 4.0).abs() < 1e-9);
        // One slot per SM: the third CTA waits for the first SM to free up.
        assert!((simulate_sms(2, 1, &[1.0; 3], &[1.0, 2.0, 5.0]) - 6.0).abs() < 1e-9);
        assert_eq!(simulate_sms(4, 2, &[1.0; 3], &[]), 0.0);
    }

    #[test]
    fn hopper_only_where_it_measured_faster() {
        // Measured on an H200: portable faster at one 64-key block, Hopper from 96 keys.
        assert!(!prefer_hopper(32) && !prefer_hopper(64));
        for keys in [96, 128, 256, 512, 2048, 8192] {
            assert!(prefer_hopper(keys), "{keys}");
        }
    }

    #[test]
    fn causal_attention_counts_half_the_flops() {
        assert_eq!(attention_flops(1, 1, 2048, 2048, 128, true), attention_flops(1, 1, 2048, 2048, 128, false) / 2.0);
        assert_eq!(attention_flops(2, 8, 512, 256, 64, false), 4.0 * 16.0 * 512.0 * 256.0 * 64.0);
    }
}
