// Hopper (sm_90a) forward pass: TMA loads into a shared-memory ring completed on
// mbarriers, wgmma for Q·Kᵀ and P·V, warp specialisation.
//
// A work item is kBlockM = 64 × kConsumers query rows of one (batch, head, split);
// a CTA runs one, or (persistent causal entries) loops over several (hopper_item).
// Warpgroup 0 is the producer: it gives most of its registers away (setmaxnreg)
// and one thread issues TMA loads of Q once per item and of K and V per key tile
// into a kStages-deep ring. Each consumer warpgroup owns 64 query rows end to end:
// S = Q·Kᵀ (wgmma, both operands in shared memory), the shared online softmax on
// the accumulators, O += P·V (wgmma, P from registers, V transposed on read),
// a tile's Q·Kᵀ issued together with the previous tile's P·V; while one consumer
// warpgroup (or CTA) does its softmax, the other's wgmmas keep the tensor cores
// busy. Barriers per stage:
//   full_k/full_v  the producer's expect_tx arrival + TMA bytes; consumers wait
//   empty_k/empty_v every consumer warp arrives once its wgmma has read the stage
#pragma once

#include "hopper.cuh"
#include "softmax.cuh"

namespace fa {

// An entry is (head dim, causal, ROWS). ROWS = 64 ("_m64" entries): one consumer
// warpgroup, which at D=64 runs two CTAs per SM (each with half the registers and
// shared memory) so that one CTA's prologue (Q and first-tile latency) and
// epilogue overlap the other's main loop, and at D=128 (shared memory for one)
// doubles the CTAs of small problems. ROWS = 128: two consumer warpgroups (D=64:
// causal only). kernel-ffi picks between a configuration's entries per problem
// (planner::prefer_m64, planner::prefer_wide_causal_d64).
//
// The consumer schedule follows from ROWS and D:
//   pipelined  tile j's Q·Kᵀ and tile j−1's P·V issued together, then tile j's
//              softmax. Until ledger iteration 49 ptxas hoisted the wait for that
//              P·V above the softmax (its WARPGROUP.DEPBAR preceded every
//              MUFU.EX2); since the barrier probes after the softmax (iteration
//              49) it waits after about half of the exponentials, so P·V runs
//              under the rest. Issued after the mask instead, the P·V had run
//              under the softmax and every large shape got 1.5-15% slower on an
//              H200, as did FlashAttention-3's intra-warpgroup overlap forced
//              behind a loop edge (ARCHITECTURE.md)
//   ping-pong  (two consumer warpgroups, D=128) pipelined, and the warpgroups take
//              turns issuing their wgmmas (named barriers), so one's softmax runs
//              under the other's matrix products
//   exp turns  (two consumer warpgroups, D=64) each warpgroup serial (Q·Kᵀ, the
//              row max, the exponentials, P·V), the warpgroups taking turns on the
//              exponentials only, as cuDNN's sm90 kernel does: at D=64 the SFU's
//              exponentials take as long as the tile's products at full rate. At
//              D=128 this was 10% slower causal and 1-2% slower non-causal than
//              ping-pong; at D=64 ping-pong was 4-8% slower than exp turns.
// A serial schedule (two warpgroups overlapping only by chance) served D=64 with
// 128-row CTAs until ledger iteration 20; it swung by 5-10% with any change to
// the kernel's code generation.
//
// Compile-time defines from the manifest, each chosen by same-run A/B timings on
// an H200 (ledger iterations 10, 12, 16, 17):
// FA_HOPPER_STAGES_*: K/V ring depth (shared memory: Q + 2 × stages × 128 × D × 2 B;
//   FA_HOPPER_STAGES_D64_CAUSAL: the 128-row D=64 entry's, ledger iteration 44).
#ifndef FA_HOPPER_STAGES_D128
#define FA_HOPPER_STAGES_D128 2
#endif
#ifndef FA_HOPPER_STAGES_D128_CAUSAL
#define FA_HOPPER_STAGES_D128_CAUSAL 2
#endif
#ifndef FA_HOPPER_STAGES_D64_M64
#define FA_HOPPER_STAGES_D64_M64 2
#endif
#ifndef FA_HOPPER_STAGES_D128_M64
#define FA_HOPPER_STAGES_D128_M64 2
#endif
// FA_HOPPER_PERSISTENT_CAUSAL: 1 = causal entries run persistent CTAs over pairs
//   of query blocks or a host schedule (hopper_item), 0 = one CTA per query block.
#ifndef FA_HOPPER_PERSISTENT_CAUSAL
#define FA_HOPPER_PERSISTENT_CAUSAL 1
#endif
// FA_HOPPER_PERSISTENT_D128: 1 = the non-causal 128-row D=128 entry runs
//   persistent CTAs over single query blocks, 0 = one CTA per query block. (The
//   non-causal D=64 entry has a persistent twin instead, `_m64_persistent`,
//   which kernel-ffi takes for grids over a wave: persistent code cost a grid of
//   one CTA per SM 4% in instruction-cache misses, ledger iteration 41.)
#ifndef FA_HOPPER_PERSISTENT_D128
#define FA_HOPPER_PERSISTENT_D128 1
#endif

#ifndef FA_HOPPER_STAGES_D64_CAUSAL
#define FA_HOPPER_STAGES_D64_CAUSAL 2
#endif

// PERSISTENT: the entry's CTAs loop over work units (hopper_item).
template <int D, bool CAUSAL, int ROWS, bool PERSISTENT>
struct HopperConfig {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static_assert(ROWS == 64 || ROWS == 128, "64-row or 128-row CTAs");
  static constexpr int kConsumers = ROWS / 64;
  static constexpr bool kPingPong = kConsumers == 2;
  static constexpr bool kExpTurns = kPingPong && D == 64;  // see "The consumer schedule" above
  static constexpr int kCtasPerSm = kConsumers == 1 && D == 64 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = ROWS;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = kConsumers == 1 ? (D == 64 ? FA_HOPPER_STAGES_D64_M64 : FA_HOPPER_STAGES_D128_M64)
                                                 : D == 64 ? FA_HOPPER_STAGES_D64_CAUSAL
                                                 : (CAUSAL ? FA_HOPPER_STAGES_D128_CAUSAL : FA_HOPPER_STAGES_D128);
  static constexpr bool kPersistent = PERSISTENT;  // units: causal pairs of query blocks, or single blocks
  static constexpr int kPanels = D / 64;  // 64-column (128-byte) swizzle panels per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  // Registers per thread after setmaxnreg, within 65536 per SM: 128 × 40 + 256 × 232
  // for two consumers, 128 × 24 + 128 × 232 per CTA for one.
  static constexpr int kProducerRegs = kConsumers == 1 ? 24 : 40, kConsumerRegs = 232;
  static_assert((128 * kProducerRegs + 128 * kConsumers * kConsumerRegs) * kCtasPerSm <= 65536, "register file");
  // Q, the K and V rings, persistent entries' O staging tile (Q-sized: their Q
  // tile may already hold the next item's), 4 barriers per stage + Q's
  // (persistent: full and empty), and slack to align the base to 1024.
  static constexpr int kStageBytes = kPersistent ? kQBytes : 0;
  static constexpr int kSmemBytes =
      kQBytes + 2 * kStages * kKVBytes + kStageBytes + 8 * (4 * kStages + 1 + kPersistent + kExpTurns) + 1024;
  // sm_90: 227 KB per CTA, 228 KB per SM with 1 KB reserved per CTA.
  static_assert(kSmemBytes <= 232448 && (kSmemBytes + 1024) * kCtasPerSm <= 233472, "shared memory");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "a TMA box spans at most 256 rows");
};

// One work item of a CTA: query rows m0 … m0 + kBlockM − 1 of (b, h, split).
struct HopperItem {
  bool done;  // the CTA has no such item
  bool skip;  // not an item (the missing half of a pair, a schedule's padding): neither loads nor stores
  int m0, b, h, kvh, split, n_begin;
  int tiles;  // key tiles; 0: rows that see no key (stored as zeros)
};

// The k-th item of this CTA. Not persistent: the one query block the 3-D grid
// names (causal: the last blocks, which see the most keys, first). Persistent:
// resident CTAs of a 1-D grid take units with a grid stride, a head's units
// adjacent so that CTAs running together share its K/V in L2. A non-causal unit
// is one query block; a causal one a pair of one (split, batch, head), the
// longest and the shortest left (m_blocks − 1 − i, then i), so that units cost
// about the same and the short block's keys (a prefix of the long one's) are
// still in L2. Where those units leave the last round partly empty (and with
// splits, where they differ in cost), kernel-ffi passes the 128-row entries
// (SCHEDULED) a schedule instead (HopperSched::order, planner::causal_order) and
// the CTA runs its row; the 64-row one has no registers to spare for both. The
// decode divides by host-computed FastDiv constants: run-time divisions sat on
// the path to the first TMA load (ledger iteration 11).
template <int BM, int BN, bool CAUSAL, bool PERSISTENT, bool SCHEDULED>
__device__ __forceinline__ HopperItem hopper_item(const FlashParams& p, const HopperSched& sc, int k) {
  HopperItem r{};
  int m_idx;
  if constexpr (PERSISTENT) {
    int sbh;  // split × (batch × heads) + batch × heads + head
    if (SCHEDULED && sc.order != nullptr) {
      r.done = k >= sc.order_stride;
      if (r.done) return r;
      const uint32_t block = __ldg(sc.order + blockIdx.x * sc.order_stride + k);
      r.skip = block == ~0u;  // padding: the CTA's row is shorter than the longest
      if (r.skip) return r;
      sbh = fast_div(sc.blocks, (int)block);
      m_idx = (int)block - sbh * sc.blocks.div;
    } else {
      const int unit = blockIdx.x + (CAUSAL ? k >> 1 : k) * gridDim.x;
      r.done = unit >= sc.units;
      if (r.done) return r;
      sbh = fast_div(sc.per_head, unit);
      const int i = unit - sbh * sc.per_head.div;
      if (CAUSAL) {
        m_idx = (k & 1) == 0 ? sc.blocks.div - 1 - i : i;
        r.skip = (k & 1) == 1 && m_idx == sc.blocks.div - 1 - i;  // an odd block count's middle block: once
        if (r.skip) return r;
      } else {
        m_idx = i;
      }
    }
    r.split = fast_div(sc.bh, sbh);
    const int bh = sbh - r.split * sc.bh.div;
    r.b = fast_div(sc.heads, bh);
    r.h = bh - r.b * sc.heads.div;
    r.kvh = fast_div(sc.group, r.h);
  } else {
    r.done = k > 0;
    r.b = blockIdx.y / p.heads;
    r.h = blockIdx.y % p.heads;
    r.kvh = r.h / (p.heads / p.kv_heads);
    r.split = blockIdx.z;
    m_idx = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  }
  r.m0 = m_idx * BM;
  r.n_begin = r.split * p.keys_per_split;
  int n_end = min(p.seqlen_k, r.n_begin + p.keys_per_split);
  if (CAUSAL) n_end = min(n_end, r.m0 + BM + (p.seqlen_k - p.seqlen_q));
  r.tiles = n_end > r.n_begin ? (n_end - r.n_begin + BN - 1) / BN : 0;
  return r;
}

// Each CTA runs its items (hopper_item: one, or a persistent CTA's many) in
// order. The K/V ring runs on across items (g0: ring position of an item's first
// tile) and Q has a full/empty pair, so the producer loads the next item's Q and
// first tiles while the consumers finish and store the current one. With one
// item per CTA the loops fold to straight-line code.
template <typename T, int D, bool CAUSAL, int ROWS, bool PERSISTENT>
__device__ __forceinline__ void flash_fwd_hopper(const HopperParams& hp) {
  using Cfg = HopperConfig<D, CAUSAL, ROWS, PERSISTENT>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages, NT = BN / 8, DT = D / 8;
  constexpr bool kPersistent = Cfg::kPersistent;
  const FlashParams& p = hp.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The launch geometry comes from the manifest (persistent: a 1-D grid); a mismatch is a build bug.
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads ||
      (kPersistent && (gridDim.y != 1 || gridDim.z != 1)))
    __trap();
  // Swizzle atoms need 1024-byte alignment; the dynamic base only promises 16.
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Cfg::kQBytes;          // stage i at sK + i × kKVBytes
  const uint32_t sV = sK + S * Cfg::kKVBytes;
  const uint32_t sO = sV + S * Cfg::kKVBytes;     // persistent only; else O is staged in sQ
  const uint32_t bars = sO + Cfg::kStageBytes;     // full_k[S], full_v[S], empty_k[S], empty_v[S], q, empty_q
  auto full_k = [&](int i) { return bars + 8 * i; };
  auto full_v = [&](int i) { return bars + 8 * (S + i); };
  auto empty_k = [&](int i) { return bars + 8 * (2 * S + i); };
  auto empty_v = [&](int i) { return bars + 8 * (3 * S + i); };
  const uint32_t bar_q = bars + 8 * 4 * S, empty_q = bar_q + 8;  // empty_q: persistent only
  const uint32_t scale_slot = empty_q + 8 * kPersistent;            // kExpTurns only: p.scale_log2
  // The first item is decoded once, up front, by every thread.
  constexpr bool kScheduled = CAUSAL && kPersistent && Cfg::kConsumers == 2;
  const HopperItem first = hopper_item<BM, BN, CAUSAL, kPersistent, kScheduled>(p, hp.sched, 0);
  auto item = [&](int k) {
    return k == 0 ? first : hopper_item<BM, BN, CAUSAL, kPersistent, kScheduled>(p, hp.sched, k);
  };
  const int diag = p.seqlen_k - p.seqlen_q;  // bottom-right causal: row i sees keys j <= i + diag

  // TMA loads, all issued by thread 0 (the producer): an item's Q, and key tile
  // j of an item into ring position g once the tile there before it has been read.
  auto load_q = [&](const HopperItem& it) {
    mbar_expect_tx(bar_q, Cfg::kQBytes);
    #pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c) tma_load_4d(sQ + c * BM * 128, &hp.q_map, bar_q, c * 64, it.m0, it.h, it.b);
  };
  auto load_kv = [&](const HopperItem& it, int g, int j) {
    const int st = g % S, n0 = it.n_begin + j * BN;
    if (g >= S) mbar_wait(empty_k(st), ((g / S) - 1) & 1);
    mbar_expect_tx(full_k(st), Cfg::kKVBytes);
    #pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c)
      tma_load_4d(sK + st * Cfg::kKVBytes + c * BN * 128, &hp.k_map, full_k(st), c * 64, n0, it.kvh, it.b);
    if (g >= S) mbar_wait(empty_v(st), ((g / S) - 1) & 1);
    mbar_expect_tx(full_v(st), Cfg::kKVBytes);
    #pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c)
      tma_load_4d(sV + st * Cfg::kKVBytes + c * BN * 128, &hp.v_map, full_v(st), c * 64, n0, it.kvh, it.b);
  };

  const int wg = threadIdx.x / 128;
  // Tiles of the first item issued with its Q before the CTA barrier (thread 0).
  const int early = !first.done && first.tiles > 0 ? min(first.tiles, S) : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(full_k(i), 1);
      mbar_init(full_v(i), 1);
      mbar_init(empty_k(i), 4 * Cfg::kConsumers);  // one arrival per consumer warp
      mbar_init(empty_v(i), 4 * Cfg::kConsumers);
    }
    mbar_init(bar_q, 1);
    if (kPersistent) mbar_init(empty_q, 4 * Cfg::kConsumers);
    if (Cfg::kExpTurns) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scale_slot), "f"(p.scale_log2) : "memory");
    mbar_init_fence();
    // The first item's Q and first S tiles wait for no stage: their latency
    // starts before the CTA barrier and the register hand-over.
    if (early > 0) {
      tma_prefetch_desc(&hp.k_map);
      tma_prefetch_desc(&hp.v_map);
      load_q(first);
      for (int j = 0; j < early; ++j) load_kv(first, j, j);
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ---- Producer: one thread issues every TMA load.
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      int g0 = 0, q_loads = 0;
      for (int k = 0; kPersistent || k == 0; ++k) {
        const HopperItem it = item(k);
        if (it.done) break;
        if (it.skip || it.tiles == 0) continue;
        const bool issued = q_loads == 0 && early > 0;  // item 0, loaded above
        // The previous item's Q must have had its last Q·Kᵀ.
        if (kPersistent && q_loads > 0) mbar_wait(empty_q, (q_loads - 1) & 1);
        if (!issued) load_q(it);
        ++q_loads;
        for (int j = issued ? early : 0; j < it.tiles; ++j) load_kv(it, g0 + j, j);
        g0 += it.tiles;
      }
    }
    return;
  }

  // ---- Consumers.
  regs_alloc<Cfg::kConsumerRegs>();
  // Consumer index: rows m0 + 64·cw …. A constant with one consumer, and the
  // causal mask's branch below tests the item's first row, not the warp's: a
  // value ptxas sees derived from threadIdx in the loop's control flow moved its
  // descriptor and stage arithmetic off the uniform datapath (the causal m64 loop
  // was 683 SASS instructions against the non-causal one's 582). Broadcast from
  // lane 0, the index is warp-uniform to ptxas too: computed per thread, it put
  // the Q descriptors in vector registers and an R2UR before each Q·Kᵀ wgmma.
  const int cw = Cfg::kConsumers == 1 ? 0 : __shfl_sync(0xffffffffu, wg - 1, 0);
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale_log2;

  // Descriptors (see GmmaDesc): Q rows of this warpgroup, K rows, V transposed.
  // A k-step of 16 columns advances 32 bytes inside a 128-byte swizzled row;
  // past 64 columns it moves to the next panel.
  GmmaDesc q_base = GmmaDesc::make(sQ + 64 * cw * 128, 0, 1024);
  const GmmaDesc k_base = GmmaDesc::make(sK, 0, 1024);
  // Through a shuffle, which ptxas cannot recompute. Left derivable from the
  // shared window's special register, it rebuilt the Q descriptor in every key
  // tile, ten dependent uniform instructions ahead of the first Q·Kᵀ wgmma
  // (ledger iterations 47 and 50; in iteration 46 the one-consumer entries lost
  // up to 1.4% with it, while two try_waits in series at the top of each tile
  // still hid the rebuild).
  q_base.lo = __shfl_sync(0xffffffffu, q_base.lo, 0);
  auto q_desc = [&](int kk) { return q_base.at(((kk / 4) * BM * 128 + (kk % 4) * 32) / 16); };

  // A K/V ring slot as the consumers carry it from tile to tile: stage, parity,
  // its full_k barrier (full_v, empty_k, empty_v lie 8·S bytes apart) and its K
  // tile's descriptor. Derived from the ring position in every tile instead,
  // ptxas recomputed the shared-memory base and the division there.
  struct Slot {
    int st;
    uint32_t phase, bar;
    GmmaDesc k;
  };
  constexpr uint32_t kStageUnits = Cfg::kKVBytes / 16;
  auto slot_at = [&](int pos) {
    const int st = pos % S;
    return Slot{st, (uint32_t)(pos / S) & 1, full_k(st), k_base.plus(st * kStageUnits)};
  };
  auto next_slot = [&](const Slot& x) {
    const bool wrap = x.st == S - 1;
    return Slot{wrap ? 0 : x.st + 1, x.phase ^ (uint32_t)wrap, wrap ? x.bar - 8 * (S - 1) : x.bar + 8,
                x.k.plus(wrap ? 0u - (S - 1) * kStageUnits : kStageUnits)};
  };
  auto k_desc = [&](const Slot& x, int kk) { return x.k.at(((kk / 4) * BN * 128 + (kk % 4) * 32) / 16); };
  // V transposed: its stage lies S·kKVBytes past K's, its head-dim panels BN·128
  // apart (the leading offset, bits 16-29); keys 16kk…16kk+15 are 16 rows of 128 bytes.
  constexpr uint32_t kVFromK = S * kStageUnits + ((BN * 128 / 16) << 16);
  auto v_desc = [&](const Slot& x, int kk) { return x.k.at(kVFromK + kk * 16 * 128 / 16); };
  auto slot_full_v = [](const Slot& x) { return x.bar + 8 * S; };
  auto slot_empty_k = [](const Slot& x) { return x.bar + 16 * S; };
  auto slot_empty_v = [](const Slot& x) { return x.bar + 24 * S; };

  constexpr bool kPingPong = Cfg::kPingPong;
  constexpr bool kExpTurns = Cfg::kExpTurns;
  float o[DT][4];
  float row_max[2], row_sum[2], correction[2];
  float s[NT][4];
  uint32_t pf[BN / 16][4];
  // S = Q·K_j, asynchronous: committed as its own wgmma group.
  auto issue_qk = [&](const Slot& st) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<T, BN>(s, q_desc(kk), k_desc(st, kk), kk > 0);
    wgmma_commit();
  };
  // O += P·V_j, asynchronous, P from registers.
  auto issue_pv = [&](const Slot& st) {
    wgmma_fence_operands(o);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs<T, D>(o, pf[kk], v_desc(st, kk));
    wgmma_commit();
  };
  // P·V from ring slot x has landed: O may be read, and the V stage is free.
  auto pv_landed = [&](const Slot& x) {
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    mbar_arrive_warp(slot_empty_v(x));
  };
  auto pack_p = [&] {
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) p_fragment<T>(pf[kk], s, kk);
  };

  // Unsplit epilogue: the warpgroup's O rows, normalised, go through its own rows
  // of a Q-shaped tile in the same 128-byte swizzle, then out in 16-byte stores, a
  // warp writing whole rows. Stored straight from the accumulators, each warp
  // instruction wrote 4 bytes into each of 8 rows: the epilogue took 1.6 µs of a
  // 35 µs CTA (B4 H16 S2048 D=128, clock64 stamps). The tile is Q's own (free once
  // the warpgroup's last Q·Kᵀ has landed; the other warpgroup may still read its
  // own rows) except in persistent CTAs, whose producer may already be loading the
  // next item's Q: they stage in sO, after a barrier that orders this item's
  // writes after the previous item's reads (the warpgroup's EpilogueWg barrier).
  auto wg_sync = [&] {
    if constexpr (Cfg::kConsumers == 1) {
      named_bar_sync<NamedBarrier::EpilogueWg0, 128>();  // a constant id: ptxas reserves 4 barriers, not 16
    } else {
      named_bar_sync(epilogue_of(cw), 128);
    }
  };
  auto store_staged = [&](const HopperItem& it) {
    if constexpr (kPersistent) wg_sync();
    const uint32_t rows = (kPersistent ? sO : sQ) + 64 * cw * 128;  // + panel × BM × 128 + row × 128 + chunk × 16
    auto chunk_addr = [&](int row, int chunk) {
      return rows + (chunk / 8) * BM * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
    };
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      float inv, lse;
      row_finish(row_max, row_sum, r, inv, lse);
      const int row = 16 * warp + g + 8 * r;  // within the warpgroup's 64
      #pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const uint32_t v = Dtype<T>::pack(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(chunk_addr(row, dt) + 4 * t), "r"(v) : "memory");
      }
      const int grow = it.m0 + 64 * cw + row;
      if (p.lse != nullptr && t == 0 && row_stored(grow, p.seqlen_q))
        p.lse[((int64_t)it.b * p.heads + it.h) * p.seqlen_q + grow] = lse;
    }
    wg_sync();
    constexpr int kChunks = D / 8;                // 16-byte chunks per row
    constexpr int kRowsPerPass = 128 / kChunks;
    const int tid = threadIdx.x % 128, chunk = tid % kChunks;
    T* out = static_cast<T*>(p.o) + it.b * p.o_batch_stride + it.h * p.o_head_stride + chunk * 8;
    #pragma unroll
    for (int r0 = 0; r0 < 64; r0 += kRowsPerPass) {
      const int row = r0 + tid / kChunks, grow = it.m0 + 64 * cw + row;
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(chunk_addr(row, chunk)));
      if (row_stored(grow, p.seqlen_q)) *reinterpret_cast<uint4*>(out + (int64_t)grow * p.o_row_stride) = v;
    }
  };

  int g0 = 0, q_loads = 0;
  bool chained = false;  // this item's first turn was handed over by the previous item's end
  for (int k = 0; kPersistent || k == 0; ++k) {
    const HopperItem it = item(k);
    if (it.done) break;
    if (it.skip) continue;
    const int row_lo = it.m0 + 64 * cw + 16 * warp + g;  // this thread's rows: row_lo, row_lo + 8
    const int wg_last_row = it.m0 + 64 * cw + 63;
    #pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    // Causal: tiles entirely right of this warpgroup's diagonal contribute nothing;
    // they come last, and only the barrier protocol runs for them. Ping-pong needs
    // both warpgroups to take the same number of turns, so it computes them (masked).
    const int live = CAUSAL && !kPingPong
                         ? max(0, min(it.tiles, (wg_last_row + diag + 1 - it.n_begin + BN - 1) / BN))
                         : it.tiles;
    auto mask = [&](int j) { mask_tile<CAUSAL>(s, it.n_begin + j * BN, it.m0, row_lo, t, p.seqlen_k, diag); };
    auto softmax = [&](int j) {
      mask(j);
      softmax_rows(s, row_max, row_sum, correction, scale_log2);
    };
    // Tile j's S has landed: its K stage is free, and after the item's last
    // Q·Kᵀ (persistent) so is Q.
    auto qk_landed = [&](const Slot& x, int j) {
      wgmma_fence_operands(s);
      mbar_arrive_warp(slot_empty_k(x));
      if (kPersistent && j == live - 1) mbar_arrive_warp(empty_q);
    };
    // Ping-pong turns: each wgmma issue point (exp turns: each tile's exponentials)
    // is one turn; warpgroup 0 goes first.
    // Warpgroup c waits at turn_of(c) and hands over at the other's. Turns run
    // on across a persistent CTA's consecutive items: warpgroup 1's hand-over
    // after an item's last P·V gives warpgroup 0 the next item's first turn, so
    // that one warpgroup's epilogue runs under the other's products. Where no item
    // with turns follows, that hand-over would be consumed by no one, and the next
    // item with turns (if any) starts a new run, warpgroup 1 giving warpgroup 0 its
    // first turn: the arrivals without a counterpart (warpgroup 0's at a run's
    // start, warpgroup 1's at its end) go to TurnSink, which no one waits on (256
    // per run: it simply completes). Branch-free on cw and without a turn counter:
    // either, in a persistent CTA's item loop, moved the main loop's descriptor
    // arithmetic off the uniform datapath (ARCHITECTURE.md).
    auto take_turn = [&] {
      if constexpr (kPingPong) named_bar_sync(turn_of(cw), 256);
    };
    auto pass_turn = [&] {
      if constexpr (kPingPong) named_bar_arrive(turn_of(cw ^ 1), 256);
    };
    if (kPingPong && live > 0 && !chained)
      named_bar_arrive(cw == 1 ? NamedBarrier::TurnWg0 : NamedBarrier::TurnSink, 256);
    // Whether this CTA's next item takes turns (then this one's last hand-over is its first).
    const bool chain_next = [&] {
      if constexpr (!kPingPong || !kPersistent) {
        return false;
      } else {
        const HopperItem nx = item(k + 1);
        return !nx.done && !nx.skip && nx.tiles > 0;
      }
    }();
    chained = chain_next && live > 0;

    // Every item with tiles loads Q once; a warpgroup with no live tile never reads it.
    if (it.tiles > 0) {
      if (live > 0) mbar_wait(bar_q, q_loads & 1);
      ++q_loads;
      if (kPersistent && live == 0) mbar_arrive_warp(empty_q);
    }
    Slot cur = slot_at(g0);  // tile j's
    if constexpr (kExpTurns) {
      // The ring advances at the end of a tile, where its arithmetic runs under the
      // P·V wait (at the top, behind a branch, it delayed the next Q·Kᵀ by 2%).
      for (int j = 0; j < live; ++j, cur = next_slot(cur)) {
        mbar_wait(cur.bar, cur.phase);
        issue_qk(cur);
        wgmma_wait<0>();
        qk_landed(cur, j);
        mask(j);
        softmax_max(s, row_max, correction, scale_log2);
        take_turn();
        // The scale read from shared memory after the barrier: ptxas moves no
        // exponential above it (with the parameter's copy it hoisted most of them).
        float turn_scale;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(turn_scale) : "r"(scale_slot) : "memory");
        softmax_exp_pack<T>(s, row_max, row_sum, correction, turn_scale, pf);
        rescale(o, correction);
        // Warpgroup 1's last hand-over of an item goes on to the next one (see above).
        named_bar_arrive(j < live - 1 || cw == 0 ? turn_of(cw ^ 1)
                         : chain_next            ? NamedBarrier::TurnWg0
                                                 : NamedBarrier::TurnSink,
                         256);
        mbar_wait(slot_full_v(cur), cur.phase);
        issue_pv(cur);
        pv_landed(cur);
      }
    } else {
      // Software pipeline: Q·K_j and P_{j−1}·V_{j−1} go to the tensor cores
      // together; O is rescaled once that P·V has landed (see "pipelined" above).
      if (live > 0) {
        mbar_wait(cur.bar, cur.phase);
        take_turn();
        issue_qk(cur);
        pass_turn();
        wgmma_wait<0>();
        qk_landed(cur, 0);
        softmax(0);  // O is still zero: nothing to rescale
        pack_p();
      }
      // After a tile's softmax (not at the top of the next, ahead of its waits):
      // the next ring slot is worked out, and the next tile's K and this tile's V
      // are probed, their latency under the P·V wait; the top of the next tile
      // waits only on a probe that failed.
      Slot next = next_slot(cur);
      bool k_ready = false, v_ready = false;
      for (int j = 1; j < live; ++j) {
        const Slot prev = cur;
        cur = next;
        if (!k_ready) mbar_wait(cur.bar, cur.phase);
        if (!v_ready) mbar_wait(slot_full_v(prev), prev.phase);
        take_turn();
        issue_qk(cur);
        issue_pv(prev);
        pass_turn();
        wgmma_wait<1>();  // S_j has landed (groups complete in order); P·V_{j−1} may still run
        qk_landed(cur, j);
        softmax(j);
        next = next_slot(cur);
        k_ready = mbar_test(next.bar, next.phase);
        v_ready = mbar_test(slot_full_v(cur), cur.phase);
        pv_landed(prev);
        rescale(o, correction);
        pack_p();
      }
      if (live > 0) {
        mbar_wait(slot_full_v(cur), cur.phase);
        take_turn();
        issue_pv(cur);
        if constexpr (kPingPong)
          named_bar_arrive(cw == 0 ? NamedBarrier::TurnWg1 : chain_next ? NamedBarrier::TurnWg0 : NamedBarrier::TurnSink,
                           256);
        pv_landed(cur);
      }
    }
    for (int j = live; j < it.tiles; ++j) {  // dead causal tiles: release them unread
      const Slot x = slot_at(g0 + j);
      mbar_wait(x.bar, x.phase);
      mbar_arrive_warp(slot_empty_k(x));
      mbar_wait(slot_full_v(x), x.phase);
      mbar_arrive_warp(slot_empty_v(x));
    }
    g0 += it.tiles;
    if (p.num_splits == 1) {
      store_staged(it);
    } else {
      store_rows<T, D>(p, o, row_max, row_sum, row_lo, it.b, it.h, it.split, t);
    }
  }
}

}  // namespace fa

// One stable extern "C" entry point: flash_fwd_hopper_<dtype>_d<D>[_causal][_m64][_persistent].
#define FA_HOPPER_ENTRY(T, D, CAUSAL, ROWS, PERSISTENT, NAME)                                              \
  extern "C" __global__ void __launch_bounds__(fa::HopperConfig<D, CAUSAL, ROWS, PERSISTENT>::kThreads,    \
                                               fa::HopperConfig<D, CAUSAL, ROWS, PERSISTENT>::kCtasPerSm)  \
      NAME(const __grid_constant__ fa::HopperParams p) {                                                   \
    fa::flash_fwd_hopper<T, D, CAUSAL, ROWS, PERSISTENT>(p);                                               \
  }

// Every Hopper entry of one dtype: D=64 in 64-row CTAs (two per SM), non-causal
// also persistent, causal also in 128-row CTAs (exp turns); D=128 in 128-row
// CTAs, plus 64-row ones for non-causal problems that do not fill the GPU.
#define FA_HOPPER_ENTRIES(T, DT)                                                                              \
  FA_HOPPER_ENTRY(T, 64, false, 64, false, flash_fwd_hopper_##DT##_d64_m64)                                   \
  FA_HOPPER_ENTRY(T, 64, false, 64, true, flash_fwd_hopper_##DT##_d64_m64_persistent)                         \
  FA_HOPPER_ENTRY(T, 64, true, 64, FA_HOPPER_PERSISTENT_CAUSAL, flash_fwd_hopper_##DT##_d64_causal_m64)       \
  FA_HOPPER_ENTRY(T, 64, true, 128, FA_HOPPER_PERSISTENT_CAUSAL, flash_fwd_hopper_##DT##_d64_causal)          \
  FA_HOPPER_ENTRY(T, 128, false, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_##DT##_d128)                \
  FA_HOPPER_ENTRY(T, 128, false, 64, false, flash_fwd_hopper_##DT##_d128_m64)                                 \
  FA_HOPPER_ENTRY(T, 128, true, 128, FA_HOPPER_PERSISTENT_CAUSAL, flash_fwd_hopper_##DT##_d128_causal)
