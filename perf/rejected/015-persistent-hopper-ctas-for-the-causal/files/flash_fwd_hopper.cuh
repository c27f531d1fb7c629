// Hopper (sm_90a) forward pass: TMA loads into a shared-memory ring completed on
// mbarriers, wgmma for Q·Kᵀ and P·V, warp specialisation.
//
// A work item is kBlockM = 64 × kConsumers query rows of one (batch, head, split);
// CTAs take one item, or (persistent) loop over several (see hopper_item).
// Warpgroup 0 is the producer: it gives most of its registers away (setmaxnreg)
// and one thread issues TMA loads of Q once per item and of K and V per key tile
// into a kStages-deep ring. Each consumer warpgroup owns 64 query rows end to end:
// S = Q·Kᵀ (wgmma, both operands in shared memory), the shared online softmax on
// the accumulators, O += P·V (wgmma, P from registers, V transposed on read),
// software-pipelined so that a tile's softmax overlaps the previous tile's P·V;
// and while one consumer warpgroup does its softmax, the other's wgmmas keep the
// tensor cores busy. Barriers per stage:
//   full_k/full_v  the producer's expect_tx arrival + TMA bytes; consumers wait
//   empty_k/empty_v every consumer thread arrives once its wgmma has read the stage
#pragma once

#include "hopper.cuh"
#include "softmax.cuh"

namespace fa {

// Per configuration (head dim × causal), compile-time defines from the manifest,
// each chosen by same-run A/B timings on an H200 (ledger iterations 10 and 12):
//
// FA_HOPPER_MODE_*, the consumer schedule:
//   0 serial     Q·Kᵀ, softmax, P·V one after another in each warpgroup; the two
//                consumer warpgroups overlap each other only by chance
//   1 pipelined  tile j's Q·Kᵀ and tile j−1's P·V issued together, tile j's
//                softmax overlapping that P·V (FlashAttention-3's intra-warpgroup
//                overlap)
//   2 ping-pong  pipelined, and the two consumer warpgroups take turns issuing
//                their wgmmas (named barriers), so one's softmax runs under the
//                other's matrix products
// FA_HOPPER_CONSUMERS_*: consumer warpgroups (64 query rows each) per CTA: 2, or 1
//   with two CTAs per SM (each gets half the registers and must fit in half the
//   shared memory), so that one CTA's prologue (Q and first-tile latency) and
//   epilogue overlap the other's main loop. D=128 needs a whole SM.
// FA_HOPPER_STAGES_*: K/V ring depth (shared memory: Q + 2 × stages × 128 × D × 2 B).
// FA_HOPPER_PERSISTENT_*: 1 = as many CTAs as fit at once, each looping over its
//   units (1-D grid; the manifest's launch geometry says `persistent`), 0 = one
//   CTA per query block (3-D grid: block, batch × head, split).
#ifndef FA_HOPPER_MODE_D64
#define FA_HOPPER_MODE_D64 0
#endif
#ifndef FA_HOPPER_MODE_D64_CAUSAL
#define FA_HOPPER_MODE_D64_CAUSAL 1
#endif
// Consumer warpgroups (of 64 query rows) per CTA at D=64: 2 or 3. D=128 needs
// the registers of two (its accumulators alone take 128 per thread).
#ifndef FA_HOPPER_CONSUMERS_D64
#define FA_HOPPER_CONSUMERS_D64 2
#endif
#ifndef FA_HOPPER_MODE_D128
#define FA_HOPPER_MODE_D128 2
#endif
#ifndef FA_HOPPER_MODE_D128_CAUSAL
#define FA_HOPPER_MODE_D128_CAUSAL 2
#endif
#ifndef FA_HOPPER_CONSUMERS_D64
#define FA_HOPPER_CONSUMERS_D64 2
#endif
#ifndef FA_HOPPER_CONSUMERS_D64_CAUSAL
#define FA_HOPPER_CONSUMERS_D64_CAUSAL 1
#endif
#ifndef FA_HOPPER_STAGES_D64
#define FA_HOPPER_STAGES_D64 4
#endif
#ifndef FA_HOPPER_STAGES_D64_CAUSAL
#define FA_HOPPER_STAGES_D64_CAUSAL 3
#endif
#ifndef FA_HOPPER_STAGES_D128
#define FA_HOPPER_STAGES_D128 2
#endif
#ifndef FA_HOPPER_PERSISTENT_D64
#define FA_HOPPER_PERSISTENT_D64 0
#endif
#ifndef FA_HOPPER_PERSISTENT_D64_CAUSAL
#define FA_HOPPER_PERSISTENT_D64_CAUSAL 1
#endif
#ifndef FA_HOPPER_PERSISTENT_D128
#define FA_HOPPER_PERSISTENT_D128 0
#endif
#ifndef FA_HOPPER_PERSISTENT_D128_CAUSAL
#define FA_HOPPER_PERSISTENT_D128_CAUSAL 1
#endif
#ifndef FA_HOPPER_STAGES_D128_CAUSAL
#define FA_HOPPER_STAGES_D128_CAUSAL 2
#endif

template <int D, bool CAUSAL>
struct HopperConfig {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static constexpr int kMode = D == 64 ? (CAUSAL ? FA_HOPPER_MODE_D64_CAUSAL : FA_HOPPER_MODE_D64)
                                       : (CAUSAL ? FA_HOPPER_MODE_D128_CAUSAL : FA_HOPPER_MODE_D128);
  static_assert(kMode >= 0 && kMode <= 2, "mode 0 (serial), 1 (pipelined) or 2 (ping-pong)");
  static constexpr int kConsumers = D == 64 ? (CAUSAL ? FA_HOPPER_CONSUMERS_D64_CAUSAL : FA_HOPPER_CONSUMERS_D64) : 2;
  static_assert(kConsumers == 1 || kConsumers == 2, "1 or 2 consumer warpgroups");
  static_assert(kMode != 2 || kConsumers == 2, "ping-pong takes turns between two consumer warpgroups");
  static constexpr int kCtasPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = D == 64 ? (CAUSAL ? FA_HOPPER_STAGES_D64_CAUSAL : FA_HOPPER_STAGES_D64)
                                         : (CAUSAL ? FA_HOPPER_STAGES_D128_CAUSAL : FA_HOPPER_STAGES_D128);
  static constexpr bool kPersistent =
      D == 64 ? (CAUSAL ? FA_HOPPER_PERSISTENT_D64_CAUSAL : FA_HOPPER_PERSISTENT_D64)
              : (CAUSAL ? FA_HOPPER_PERSISTENT_D128_CAUSAL : FA_HOPPER_PERSISTENT_D128);
  static constexpr int kPanels = D / 64;  // 64-column (128-byte) swizzle panels per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  // Registers per thread after setmaxnreg, within 65536 per SM: 128 × 40 + 256 × 232
  // for one CTA, 2 × (128 × 24 + 128 × 232) for two.
  static constexpr int kProducerRegs = kConsumers == 1 ? 24 : 40, kConsumerRegs = 232;
  static_assert((128 * kProducerRegs + 128 * kConsumers * kConsumerRegs) * kCtasPerSm <= 65536, "register file");
  // Q, the K and V rings, 4 barriers per stage + Q's, and slack to align the base to 1024.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 8 * (4 * kStages + 2) + 1024;
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "a TMA box spans at most 256 rows");
};

// One work item: a query block of one (batch, head, key split).
struct HopperWork {
  bool done;   // the CTA has no k-th item
  bool valid;  // else skip it (the missing short half of a causal pair)
  int m0, b, h, kvh, split, n_begin, tiles;
};

// The k-th item of this CTA. Not persistent: the one query block the 3-D grid
// names (causal: the last blocks, which see the most keys, first). Persistent:
// units are handed out with a grid stride; unit u is query block u mod per_head
// of (batch, head, split) u / per_head, so CTAs that run together share a head's
// K/V in L2; causal units are pairs of query blocks, the longest and the shortest
// left (m_blocks − 1 − i and i), so every unit costs the same and the static
// schedule stays balanced. Divisions are by host-computed FastDiv constants: a
// run-time division is ~20 dependent instructions, and these sit between the
// CTA's start and its first TMA load.
template <int BM, int BN, bool CAUSAL, bool PERSISTENT>
__device__ __forceinline__ HopperWork hopper_item(const FlashParams& p, const HopperSched& s, int k) {
  HopperWork r{};
  constexpr bool kPairs = CAUSAL && PERSISTENT;
  const int unit = PERSISTENT ? blockIdx.x + (kPairs ? k >> 1 : k) * gridDim.x : 0;
  r.done = PERSISTENT ? unit >= s.units : k > 0;
  if (r.done) return r;
  const int t = PERSISTENT ? fast_div(s.per_head, unit) : 0;
  const int i = PERSISTENT ? unit - t * s.per_head.div : (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
  const int split = PERSISTENT ? fast_div(s.bh, t) : blockIdx.z;
  const int bh = PERSISTENT ? t - split * s.bh.div : blockIdx.y;
  r.b = fast_div(s.heads, bh);
  r.h = bh - r.b * s.heads.div;
  r.kvh = fast_div(s.group, r.h);
  r.split = split;
  const int m_idx = kPairs ? ((k & 1) == 0 ? s.m_blocks - 1 - i : i) : i;
  r.valid = !(kPairs && (k & 1) == 1 && m_idx == s.m_blocks - 1 - i);
  r.m0 = m_idx * BM;
  r.n_begin = split * p.keys_per_split;
  int n_end = min(p.seqlen_k, r.n_begin + p.keys_per_split);
  if (CAUSAL) n_end = min(n_end, r.m0 + BM + (p.seqlen_k - p.seqlen_q));
  r.tiles = n_end > r.n_begin ? (n_end - r.n_begin + BN - 1) / BN : 0;
  return r;
}

// Each CTA loops over its items (hopper_item: one, or a persistent CTA's many).
// The K/V ring and its phases run on across items, and Q has its own full/empty
// pair, so the producer loads the next item's Q and first tiles while the
// consumers still finish (and store) the current one.
template <typename T, int D, bool CAUSAL>
__device__ __forceinline__ void flash_fwd_hopper(const HopperParams& hp) {
  using Cfg = HopperConfig<D, CAUSAL>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages, NT = BN / 8, DT = D / 8;
  const FlashParams& p = hp.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Launch geometry comes from the manifest (persistent: a 1-D grid); a mismatch is a build bug.
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads ||
      (Cfg::kPersistent && (gridDim.y != 1 || gridDim.z != 1)))
    __trap();
  // Swizzle atoms need 1024-byte alignment; the dynamic base only promises 16.
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Cfg::kQBytes;          // stage i at sK + i × kKVBytes
  const uint32_t sV = sK + S * Cfg::kKVBytes;
  const uint32_t bars = sV + S * Cfg::kKVBytes;   // full_k[S], full_v[S], empty_k[S], empty_v[S], full_q, empty_q
  auto full_k = [&](int i) { return bars + 8 * i; };
  auto full_v = [&](int i) { return bars + 8 * (S + i); };
  auto empty_k = [&](int i) { return bars + 8 * (2 * S + i); };
  auto empty_v = [&](int i) { return bars + 8 * (3 * S + i); };
  const uint32_t full_q = bars + 8 * 4 * S, empty_q = full_q + 8;
  // Ring position g (tiles since the CTA started): stage and phase parity.
  auto stage = [](int g) { return g % S; };
  auto phase = [](int g) { return (uint32_t)(g / S) & 1; };

  const int diag = p.seqlen_k - p.seqlen_q;  // bottom-right causal: row i sees keys j <= i + diag
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(full_k(i), 1);
      mbar_init(full_v(i), 1);
      mbar_init(empty_k(i), 128 * Cfg::kConsumers);
      mbar_init(empty_v(i), 128 * Cfg::kConsumers);
    }
    mbar_init(full_q, 1);
    mbar_init(empty_q, 128 * Cfg::kConsumers);
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- Producer: one thread issues every TMA load.
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    tma_prefetch_desc(&hp.k_map);
    tma_prefetch_desc(&hp.v_map);
    int g = 0, q_uses = 0;
    for (int k = 0; Cfg::kPersistent || k == 0; ++k) {
      const HopperWork wk = hopper_item<BM, BN, CAUSAL, Cfg::kPersistent>(p, hp.sched, k);
      if (wk.done) break;
      if (!wk.valid || wk.tiles == 0) continue;
      // Q's previous item must have had its last Q·Kᵀ.
      if (q_uses > 0) mbar_wait(empty_q, (q_uses - 1) & 1);
      ++q_uses;
      mbar_expect_tx(full_q, Cfg::kQBytes);
      #pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c) tma_load_4d(sQ + c * BM * 128, &hp.q_map, full_q, c * 64, wk.m0, wk.h, wk.b);
      for (int j = 0; j < wk.tiles; ++j, ++g) {
        const int st = stage(g), n0 = wk.n_begin + j * BN;
        // The stage's previous tile (g − S) must have been read by every consumer.
        if (g >= S) mbar_wait(empty_k(st), phase(g - S));
        mbar_expect_tx(full_k(st), Cfg::kKVBytes);
        #pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_load_4d(sK + st * Cfg::kKVBytes + c * BN * 128, &hp.k_map, full_k(st), c * 64, n0, wk.kvh, wk.b);
        if (g >= S) mbar_wait(empty_v(st), phase(g - S));
        mbar_expect_tx(full_v(st), Cfg::kKVBytes);
        #pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_load_4d(sV + st * Cfg::kKVBytes + c * BN * 128, &hp.v_map, full_v(st), c * 64, n0, wk.kvh, wk.b);
      }
    }
    return;
  }

  // ---- Consumers.
  regs_alloc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;  // consumer index: rows m0 + 64·cw …
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g_ = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale_log2;
  constexpr bool kPingPong = Cfg::kMode == 2;

  // Descriptors (see gmma_desc): Q rows of this warpgroup, K rows, V transposed.
  // A k-step of 16 columns advances 32 bytes inside a 128-byte swizzled row;
  // past 64 columns it moves to the next panel.
  const uint32_t q_rows = sQ + 64 * cw * 128;
  auto q_desc = [&](int kk) { return gmma_desc(q_rows + (kk / 4) * BM * 128 + (kk % 4) * 32, 0, 1024); };
  auto k_desc = [&](int st, int kk) {
    return gmma_desc(sK + st * Cfg::kKVBytes + (kk / 4) * BN * 128 + (kk % 4) * 32, 0, 1024);
  };
  // Keys 16kk…16kk+15 are 16 rows of 128 bytes; the head dim's panels lie BN·128 apart.
  auto v_desc = [&](int st, int kk) { return gmma_desc(sV + st * Cfg::kKVBytes + kk * 16 * 128, BN * 128, 1024); };

  float o[DT][4];
  float s[NT][4];
  uint32_t pf[BN / 16][4];
  float row_max[2], row_sum[2], correction[2];
  // S = Q·K, asynchronous: committed as its own wgmma group.
  auto issue_qk = [&](int st) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<T, BN>(s, q_desc(kk), k_desc(st, kk), kk > 0);
    wgmma_commit();
  };
  // O += P·V, asynchronous, P from registers.
  auto issue_pv = [&](int st) {
    wgmma_fence_operands(o);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs<T, D>(o, pf[kk], v_desc(st, kk));
    wgmma_commit();
  };
  auto pack_p = [&] {
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) p_fragment<T>(pf[kk], s, kk);
  };

  // Ring position of the item's first tile, items with Q loaded so far. A CTA that
  // is not persistent has exactly one item, so the loop and these fold to constants
  // (ledger iteration 14 ran its non-causal entries through the loop: 4-10% slower).
  int g0_run = 0, q_uses = 0;
  for (int k = 0; Cfg::kPersistent || k == 0; ++k) {
    const int g0 = Cfg::kPersistent ? g0_run : 0;
    const HopperWork wk = hopper_item<BM, BN, CAUSAL, Cfg::kPersistent>(p, hp.sched, k);
    if (wk.done) break;
    if (!wk.valid) continue;
    const int row_lo = wk.m0 + 64 * cw + 16 * warp + g_;  // this thread's rows: row_lo, row_lo + 8
    // Causal: tiles entirely right of this warpgroup's diagonal contribute nothing;
    // they come last, and only the barrier protocol runs for them. Ping-pong needs
    // both warpgroups to take the same number of turns, so it computes them (masked).
    const int wg_last_row = wk.m0 + 64 * cw + 63;
    const int live = CAUSAL && !kPingPong
                         ? max(0, min(wk.tiles, (wg_last_row + diag + 1 - wk.n_begin + BN - 1) / BN))
                         : wk.tiles;
    #pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    auto softmax = [&](int j) {
      const int n0 = wk.n_begin + j * BN;
      const bool tail = n0 + BN > p.seqlen_k;
      const bool crosses = CAUSAL && n0 + BN - 1 > wk.m0 + 64 * cw + 16 * warp + diag;
      if (tail || crosses) mask_tile<CAUSAL>(s, n0, row_lo, t, p.seqlen_k, diag);
      softmax_rows(s, row_max, row_sum, correction, scale_log2);
    };
    // Q is free for the next item once this warpgroup's last Q·Kᵀ has landed.
    auto qk_landed = [&](int j) {
      wgmma_fence_operands(s);
      mbar_arrive(empty_k(stage(g0 + j)));
      if (Cfg::kPersistent && j == live - 1) mbar_arrive(empty_q);
    };
    // Ping-pong turns: each wgmma issue point is one turn; warpgroup 0 goes first.
    // Warpgroup c waits at barrier 1 + c and hands over at the other's; the last
    // hand-over of warpgroup 1 is left out so that every arrival is consumed.
    const int turns = live > 0 ? live + 1 : 0;
    int turn = 0;
    auto take_turn = [&] {
      if constexpr (kPingPong) named_bar_sync(1 + cw, 256);
    };
    auto pass_turn = [&] {
      if constexpr (kPingPong) {
        if (!(cw == 1 && ++turn == turns)) named_bar_arrive(1 + (cw ^ 1), 256);
      }
    };
    if (kPingPong && cw == 1 && turns > 0) named_bar_arrive(1, 256);

    if (wk.tiles > 0) {
      mbar_wait(full_q, q_uses & 1);
      ++q_uses;
      if (Cfg::kPersistent && live == 0) mbar_arrive(empty_q);
    }
    if constexpr (Cfg::kMode == 0) {
      for (int j = 0; j < live; ++j) {
        const int st = stage(g0 + j);
        mbar_wait(full_k(st), phase(g0 + j));
        issue_qk(st);
        wgmma_wait<0>();
        qk_landed(j);
        softmax(j);
        rescale(o, correction);
        pack_p();
        mbar_wait(full_v(st), phase(g0 + j));
        issue_pv(st);
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        mbar_arrive(empty_v(st));
      }
    } else {
      // Software pipeline: while the tensor cores run P_{j−1}·V_{j−1}, the
      // warpgroup does tile j's softmax; O is rescaled once that P·V has landed.
      if (live > 0) {
        mbar_wait(full_k(stage(g0)), phase(g0));
        take_turn();
        issue_qk(stage(g0));
        pass_turn();
        wgmma_wait<0>();
        qk_landed(0);
        softmax(0);  // O is still zero: nothing to rescale
        pack_p();
      }
      for (int j = 1; j < live; ++j) {
        const int st = stage(g0 + j), prev = stage(g0 + j - 1);
        mbar_wait(full_k(st), phase(g0 + j));
        mbar_wait(full_v(prev), phase(g0 + j - 1));
        take_turn();
        issue_qk(st);
        issue_pv(prev);
        pass_turn();
        wgmma_wait<1>();  // S_j has landed (groups complete in order); P·V_{j−1} may still run
        qk_landed(j);
        softmax(j);
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        mbar_arrive(empty_v(prev));
        rescale(o, correction);
        pack_p();
      }
      if (live > 0) {
        const int st = stage(g0 + live - 1);
        mbar_wait(full_v(st), phase(g0 + live - 1));
        take_turn();
        issue_pv(st);
        pass_turn();
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        mbar_arrive(empty_v(st));
      }
    }
    for (int j = live; j < wk.tiles; ++j) {  // dead causal tiles: release them unread
      const int st = stage(g0 + j);
      mbar_wait(full_k(st), phase(g0 + j));
      mbar_arrive(empty_k(st));
      mbar_wait(full_v(st), phase(g0 + j));
      mbar_arrive(empty_v(st));
    }
    g0_run += wk.tiles;
    store_rows<T, D>(p, o, row_max, row_sum, row_lo, wk.b, wk.h, wk.split, t);
  }
}

}  // namespace fa
