// Hopper (sm_90a) forward pass: TMA loads into a shared-memory ring completed on
// mbarriers, wgmma for Q·Kᵀ and P·V, warp specialisation.
//
// A CTA owns kBlockM = 64 × kConsumers query rows of one (batch, head, split).
// Warpgroup 0 is the producer: it gives most of its registers away (setmaxnreg)
// and one thread issues TMA loads of Q once and of K and V per key tile into a
// kStages-deep ring. Each consumer warpgroup owns 64 query rows end to end:
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

// An entry is (head dim, causal, ROWS): ROWS = 128 is two consumer warpgroups of
// 64 query rows per CTA; ROWS = 64 ("_m64" entries) one, which at D=64 runs two
// CTAs per SM (each with half the registers and shared memory) so that one CTA's
// prologue (Q and first-tile latency) and epilogue overlap the other's main loop,
// and at D=128 (shared memory for one) doubles the CTAs of small problems.
// kernel-ffi picks between the two rows per problem (planner::prefer_m64).
//
// Compile-time defines from the manifest, each chosen by same-run A/B timings on
// an H200 (ledger iterations 10, 12 and 16):
// FA_HOPPER_MODE_*, the consumer schedule:
//   0 serial     Q·Kᵀ, softmax, P·V one after another in each warpgroup; the two
//                consumer warpgroups overlap each other only by chance
//   1 pipelined  tile j's Q·Kᵀ and tile j−1's P·V issued together, tile j's
//                softmax overlapping that P·V (FlashAttention-3's intra-warpgroup
//                overlap)
//   2 ping-pong  pipelined, and the two consumer warpgroups take turns issuing
//                their wgmmas (named barriers), so one's softmax runs under the
//                other's matrix products (128-row entries only)
// FA_HOPPER_STAGES_*: K/V ring depth (shared memory: Q + 2 × stages × 128 × D × 2 B).
#ifndef FA_HOPPER_MODE_D64
#define FA_HOPPER_MODE_D64 0
#endif
#ifndef FA_HOPPER_MODE_D128
#define FA_HOPPER_MODE_D128 2
#endif
#ifndef FA_HOPPER_MODE_D128_CAUSAL
#define FA_HOPPER_MODE_D128_CAUSAL 2
#endif
#ifndef FA_HOPPER_MODE_M64
#define FA_HOPPER_MODE_M64 1
#endif
#ifndef FA_HOPPER_STAGES_D64
#define FA_HOPPER_STAGES_D64 4
#endif
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

template <int D, bool CAUSAL, int ROWS>
struct HopperConfig {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static_assert(ROWS == 64 || ROWS == 128, "one or two consumer warpgroups of 64 rows");
  static constexpr int kConsumers = ROWS / 64;
  static constexpr int kMode = kConsumers == 1 ? FA_HOPPER_MODE_M64
                               : D == 64       ? FA_HOPPER_MODE_D64
                                               : (CAUSAL ? FA_HOPPER_MODE_D128_CAUSAL : FA_HOPPER_MODE_D128);
  static_assert(kMode >= 0 && kMode <= 2, "mode 0 (serial), 1 (pipelined) or 2 (ping-pong)");
  static_assert(kMode != 2 || kConsumers == 2, "ping-pong takes turns between two consumer warpgroups");
  static constexpr int kCtasPerSm = kConsumers == 1 && D == 64 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = ROWS;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = kConsumers == 1 ? (D == 64 ? FA_HOPPER_STAGES_D64_M64 : FA_HOPPER_STAGES_D128_M64)
                                 : D == 64       ? FA_HOPPER_STAGES_D64
                                                 : (CAUSAL ? FA_HOPPER_STAGES_D128_CAUSAL : FA_HOPPER_STAGES_D128);
  static constexpr int kPanels = D / 64;  // 64-column (128-byte) swizzle panels per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  // Registers per thread after setmaxnreg, within 65536 per SM: 128 × 40 + 256 × 232
  // for two consumers, 128 × 24 + 128 × 232 per CTA for one.
  static constexpr int kProducerRegs = kConsumers == 1 ? 24 : 40, kConsumerRegs = 232;
  static_assert((128 * kProducerRegs + 128 * kConsumers * kConsumerRegs) * kCtasPerSm <= 65536, "register file");
  // Q, the K and V rings, 4 barriers per stage + Q's, and slack to align the base to 1024.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 8 * (4 * kStages + 1) + 1024;
  // sm_90: 227 KB per CTA, 228 KB per SM with 1 KB reserved per CTA.
  static_assert(kSmemBytes <= 232448 && (kSmemBytes + 1024) * kCtasPerSm <= 233472, "shared memory");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "a TMA box spans at most 256 rows");
};

template <typename T, int D, bool CAUSAL, int ROWS>
__device__ __forceinline__ void flash_fwd_hopper(const HopperParams& hp) {
  using Cfg = HopperConfig<D, CAUSAL, ROWS>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages, NT = BN / 8, DT = D / 8;
  const FlashParams& p = hp.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads) __trap();
  // Swizzle atoms need 1024-byte alignment; the dynamic base only promises 16.
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Cfg::kQBytes;          // stage i at sK + i × kKVBytes
  const uint32_t sV = sK + S * Cfg::kKVBytes;
  const uint32_t bars = sV + S * Cfg::kKVBytes;   // full_k[S], full_v[S], empty_k[S], empty_v[S], q
  auto full_k = [&](int i) { return bars + 8 * i; };
  auto full_v = [&](int i) { return bars + 8 * (S + i); };
  auto empty_k = [&](int i) { return bars + 8 * (2 * S + i); };
  auto empty_v = [&](int i) { return bars + 8 * (3 * S + i); };
  const uint32_t bar_q = bars + 8 * 4 * S;

  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int kvh = h / (p.heads / p.kv_heads);
  const int split = blockIdx.z;
  const int m0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;  // longest causal blocks first
  const int diag = p.seqlen_k - p.seqlen_q;  // bottom-right causal: row i sees keys j <= i + diag
  const int n_begin = split * p.keys_per_split;
  int n_end = min(p.seqlen_k, n_begin + p.keys_per_split);
  if (CAUSAL) n_end = min(n_end, m0 + BM + diag);
  const int tiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(full_k(i), 1);
      mbar_init(full_v(i), 1);
      mbar_init(empty_k(i), 128 * Cfg::kConsumers);
      mbar_init(empty_v(i), 128 * Cfg::kConsumers);
    }
    mbar_init(bar_q, 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- Producer: one thread issues every TMA load.
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0 && tiles > 0) {
      tma_prefetch_desc(&hp.k_map);
      tma_prefetch_desc(&hp.v_map);
      mbar_expect_tx(bar_q, Cfg::kQBytes);
      #pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c) tma_load_4d(sQ + c * BM * 128, &hp.q_map, bar_q, c * 64, m0, h, b);
      for (int j = 0; j < tiles; ++j) {
        const int st = j % S, n0 = n_begin + j * BN;
        // The stage's previous tile (j − S) must have been read by every consumer.
        if (j >= S) mbar_wait(empty_k(st), ((j / S) - 1) & 1);
        mbar_expect_tx(full_k(st), Cfg::kKVBytes);
        #pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_load_4d(sK + st * Cfg::kKVBytes + c * BN * 128, &hp.k_map, full_k(st), c * 64, n0, kvh, b);
        if (j >= S) mbar_wait(empty_v(st), ((j / S) - 1) & 1);
        mbar_expect_tx(full_v(st), Cfg::kKVBytes);
        #pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_load_4d(sV + st * Cfg::kKVBytes + c * BN * 128, &hp.v_map, full_v(st), c * 64, n0, kvh, b);
      }
    }
    return;
  }

  // ---- Consumers.
  regs_alloc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;                                   // consumer index: rows m0 + 64·cw …
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_lo = m0 + 64 * cw + 16 * warp + g;        // this thread's rows: row_lo, row_lo + 8
  const int wg_last_row = m0 + 64 * cw + 63;
  const float scale_log2 = p.scale_log2;

  float o[DT][4];
  #pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

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

  // Causal: tiles entirely right of this warpgroup's diagonal contribute nothing;
  // they come last, and only the barrier protocol runs for them. Ping-pong needs
  // both warpgroups to take the same number of turns, so it computes them (masked).
  constexpr bool kPingPong = Cfg::kMode == 2;
  const int live =
      CAUSAL && !kPingPong ? max(0, min(tiles, (wg_last_row + diag + 1 - n_begin + BN - 1) / BN)) : tiles;

  float s[NT][4];
  uint32_t pf[BN / 16][4];
  float correction[2];
  // S = Q·K_j, asynchronous: committed as its own wgmma group.
  auto issue_qk = [&](int st) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<T, BN>(s, q_desc(kk), k_desc(st, kk), kk > 0);
    wgmma_commit();
  };
  // O += P·V_j, asynchronous, P from registers.
  auto issue_pv = [&](int st) {
    wgmma_fence_operands(o);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs<T, D>(o, pf[kk], v_desc(st, kk));
    wgmma_commit();
  };
  auto softmax = [&](int j) {
    const int n0 = n_begin + j * BN;
    mask_tile<CAUSAL>(s, n0, row_lo - g, row_lo, t, p.seqlen_k, diag);  // from the warp's first row
    softmax_rows<false>(s, row_max, row_sum, correction, scale_log2);
  };
  auto pack_p = [&] {
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) p_fragment<T>(pf[kk], s, kk);
  };
  auto kv_phase = [&](int j) { return (uint32_t)(j / S) & 1; };
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

  if (live > 0) mbar_wait(bar_q, 0);
  if constexpr (Cfg::kMode == 0) {
    for (int j = 0; j < live; ++j) {
      const int st = j % S;
      mbar_wait(full_k(st), kv_phase(j));
      issue_qk(st);
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      mbar_arrive(empty_k(st));
      softmax(j);
      rescale(o, correction);
      pack_p();
      mbar_wait(full_v(st), kv_phase(j));
      issue_pv(st);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      mbar_arrive(empty_v(st));
    }
  } else {
    // Software pipeline: while the tensor cores run P_{j−1}·V_{j−1}, the
    // warpgroup does tile j's softmax; O is rescaled once that P·V has landed.
    if (live > 0) {
      mbar_wait(full_k(0), 0);
      take_turn();
      issue_qk(0);
      pass_turn();
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      mbar_arrive(empty_k(0));
      softmax(0);  // O is still zero: nothing to rescale
      pack_p();
    }
    for (int j = 1; j < live; ++j) {
      const int st = j % S, prev = (j - 1) % S;
      mbar_wait(full_k(st), kv_phase(j));
      mbar_wait(full_v(prev), kv_phase(j - 1));
      take_turn();
      issue_qk(st);
      issue_pv(prev);
      pass_turn();
      wgmma_wait<1>();  // S_j has landed (groups complete in order); P·V_{j−1} may still run
      wgmma_fence_operands(s);
      mbar_arrive(empty_k(st));
      softmax(j);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      mbar_arrive(empty_v(prev));
      rescale(o, correction);
      pack_p();
    }
    if (live > 0) {
      const int st = (live - 1) % S;
      mbar_wait(full_v(st), kv_phase(live - 1));
      take_turn();
      issue_pv(st);
      pass_turn();
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      mbar_arrive(empty_v(st));
    }
  }
  for (int j = live; j < tiles; ++j) {  // dead causal tiles: release them unread
    const int st = j % S;
    mbar_wait(full_k(st), kv_phase(j));
    mbar_arrive(empty_k(st));
    mbar_wait(full_v(st), kv_phase(j));
    mbar_arrive(empty_v(st));
  }

  store_rows<T, D>(p, o, row_max, row_sum, row_lo, b, h, split, t);
}

}  // namespace fa

// One stable extern "C" entry point: flash_fwd_hopper_<dtype>_d<D>[_causal][_m64].
#define FA_HOPPER_ENTRY(T, D, CAUSAL, ROWS, NAME)                                              \
  extern "C" __global__ void __launch_bounds__(fa::HopperConfig<D, CAUSAL, ROWS>::kThreads,    \
                                               fa::HopperConfig<D, CAUSAL, ROWS>::kCtasPerSm)  \
      NAME(const __grid_constant__ fa::HopperParams p) {                                       \
    fa::flash_fwd_hopper<T, D, CAUSAL, ROWS>(p);                                               \
  }
