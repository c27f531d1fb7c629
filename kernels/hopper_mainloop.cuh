// The Hopper kernel's consumer warpgroups: each owns 64 query rows end to end,
// S = Q·Kᵀ (wgmma, both operands in shared memory), the shared online softmax on
// the accumulators, O += P·V (wgmma, P from registers, V from shared memory:
// HopperOperands), in one of three schedules (flash_fwd_hopper.cuh), then the
// epilogue. One function of local state and lambdas: held in a struct's
// members instead, the same code moved the work-item decode and descriptor
// arithmetic off ptxas's uniform datapath in every entry (SASS compared per
// entry).
#pragma once

#include "fp8.cuh"
#include "hopper.cuh"
#include "hopper_epilogue.cuh"
#include "hopper_layout.cuh"
#include "hopper_scheduler.cuh"
#include "mask.cuh"
#include "row_store.cuh"
#include "softmax.cuh"

namespace fa {

// How a consumer's products take their operands, per input type T. 16-bit:
// Q·Kᵀ in k16 steps; P·V in 16-key steps, P in 16 bits, V key rows transposed
// on read (MN-major); the kept-max softmax (SoftmaxState::update_kept), whose p
// reach kHeadroom.
template <typename T, typename Cfg>
struct HopperOperands {
  static constexpr int kPvKeys = 16;  // keys per P·V wgmma
  static constexpr bool kKeptMax = true;
  static constexpr bool kPromote = false;        // P·V accumulates in O
  static constexpr int kPvCols = Cfg::kHeadDim;  // O's columns per P·V chain
  static constexpr int kQkChains = 1;            // Q·Kᵀ accumulators summed in fp32
  static constexpr int kLog2PScale = 0;          // the softmax's p are 2^kLog2PScale · p (SoftmaxState::update)
  static constexpr int kLog2Headroom = 0;        // e4m3's kept max only (exp_pack_kept)
  static constexpr bool kRedoFromK = false;      // e4m3's kept max only
  static constexpr int S = Cfg::kStages, BN = Cfg::kBlockN, PB = Cfg::kPanelBytes;
  template <int NT>
  __device__ __forceinline__ static void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
    fa::p_fragment<T>(pf, s, kk);
  }
  // V's descriptor at key step kk from its stage's K descriptor: the V stage lies
  // S·kKVBytes past K's, its head-dim panels BN·PB apart (the leading offset,
  // bits 16-29); keys 16kk…16kk+15 are 16 panel rows.
  __device__ __forceinline__ static uint64_t v_desc(const GmmaDesc& k, int kk, int) {
    constexpr uint32_t kVFromK = S * (Cfg::kKVBytes / 16) + ((BN * PB / 16) << 16);
    return k.at(kVFromK + kk * 16 * PB / 16);
  }
};
// e4m3: Q·Kᵀ in k32 steps over the same descriptors (32 bytes a step); P·V in
// 32-key steps, P as e4m3 A fragments in the accumulators' key order
// (p_fragment_e4m3), V a transposed stage in that order (Cfg::kVTransposed),
// K-major. P is quantised as 2^kLog2PScale · p (fp8.cuh), the factor in the
// exponent, not a multiply. The entries keep the row max (exp_pack_kept; the
// 16-bit kept max lets p reach kHeadroom): p may reach 2^kLog2Headroom · 1.75
// before 2^6 · p saturates; p below 2^-12 lose significand bits and p at or
// below 2^-16 (e^-11 under the row max) flush to 0. FP8 wgmma
// accumulates with about 13 significand bits, each step truncating: on O's
// running sum the losses grow with the key count (README, "FP8 (e4m3)
// inputs"), so each tile's P·V lands in its own accumulator and joins O in
// fp32 (kPromote; DeepSeek-V3's promotion), as one FMA with the tile's rescale;
// at D=256 in two chains of 128 columns (kPvCols), one after the other into
// the same accumulator, which at full width would take 128 registers beside
// O's 128. Q·Kᵀ keeps the truncation of at most 4 steps (128 of D) in a
// chain: scores within about 2^-13 of Σ|q·k| (kernel-ffi's
// check::E4M3_WGMMA_QK_EPS); at D=256 two chains are summed in fp32
// (kQkChains: in one chain of 8 steps, outlier channels put O's relative L2
// error at 3.4e-2, past fa-test's 2.5e-2).
template <typename Cfg>
struct HopperOperands<e4m3x2, Cfg> {
  static constexpr int kPvKeys = 32;
  static constexpr bool kKeptMax = false;  // not the 16-bit kept max (update_kept): see kLog2Headroom
  static constexpr bool kPromote = true;
  static constexpr int kPvCols = Cfg::kHeadDim > 128 ? 128 : Cfg::kHeadDim;
  static constexpr int kQkChains = Cfg::kHeadDim > 128 ? 2 : 1;
  // Headroom for the kept max. At D=256 a tile turned down computes S again
  // from its K stage (kRedoFromK: recompute_s, a warp's own mma.sync), as S
  // kept beside O's 128 registers spilled in the key loop.
  static constexpr int kLog2Headroom = 2;
  static constexpr bool kRedoFromK = Cfg::kHeadDim > 128;
  static constexpr int kLog2PScale = 8 - kLog2Headroom;
  static constexpr int S = Cfg::kStages, VPB = Cfg::kVPanelBytes;
  static_assert(Cfg::kVTransposed, "e4m3 P·V reads V K-major");
  template <int NT>
  __device__ __forceinline__ static void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
    p_fragment_e4m3(pf, s, kk, 1.f);
  }
  // The kept max (every schedule): tile scores s to P against the max kept
  // from earlier tiles, without the tile's own row max (its reduction, 70
  // FMNMX and 4 shuffles a thread, came before every exponential), packed as they
  // land; s stays, so that a tile the warp turns down is redone exactly from
  // it (at D=256 from S computed again: kRedoFromK). The verdict is P's own
  // (p_unsaturated), not the sums' (commit_kept's): at 2^6 · p a 32-key sum
  // may pass 448 where no p does.
  template <int NT>
  __device__ __forceinline__ static bool exp_pack_kept(SoftmaxState<1>& sm, const float (&s)[NT][4], float scale_log2,
                                                       uint32_t (&pf)[NT / 4][4]) {
    static_assert(kLog2Headroom > 0, "p past 1 needs headroom below 448");
    const float base[2] = {exp_base(sm.row_max[0][0]), exp_base(sm.row_max[0][1])};
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < NT / 4; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // p_fragment_e4m3's order: row i % 2, 16-key half i / 2
        const float(&lo)[4] = s[4 * kk + 2 * (i / 2)];
        const float(&hi)[4] = s[4 * kk + 2 * (i / 2) + 1];
        const int r = i % 2;
        const float a = fast_exp2(fmaf(lo[2 * r], scale_log2, -base[r]));
        const float b = fast_exp2(fmaf(lo[2 * r + 1], scale_log2, -base[r]));
        const float c = fast_exp2(fmaf(hi[2 * r], scale_log2, -base[r]));
        const float d = fast_exp2(fmaf(hi[2 * r + 1], scale_log2, -base[r]));
        sum[r] += a + b;
        sum[r] += c + d;
        pf[kk][i] = pack_e4m3x4(a, b, c, d);
      }
    }
#ifdef FA_PLANT_KEPT_SATURATES
    return sm.commit_kept_if(0, sum, true);  // planted: tiles past the headroom kept, their p saturated
#else
    return sm.commit_kept_if(0, sum, p_unsaturated(pf));
#endif
  }
  // A K descriptor's address (its leading offset is 0) moved to the V stage,
  // S·kKVBytes on, in V's swizzle: D rows of VPB bytes, 8-row groups 8·VPB
  // apart; a 32-key step is 32 bytes along the rows, chunk c kPvCols rows on.
  __device__ __forceinline__ static uint64_t v_desc(const GmmaDesc& k, int kk, int c) {
    constexpr uint32_t kHigh = GmmaDesc::high<VPB>(8 * VPB);
    return GmmaDesc{k.lo, kHigh}.at(S * (Cfg::kKVBytes / 16) + kk * 2 + c * (kPvCols * VPB / 16));
  }
};

// The dequantisation factors of a consumer's items: none for 16-bit inputs;
// e4m3 inputs' per (batch, K/V head) (Fp8Descale), read once an item.
struct NoDescales {
  static constexpr bool kScaled = false;
  template <typename Item>
  __device__ __forceinline__ Fp8Descale at(const Item&, int) const;  // never called
};
struct E4m3Descales {
  static constexpr bool kScaled = true;
  const float *q, *k, *v;
  template <typename Item>
  __device__ __forceinline__ Fp8Descale at(const Item& it, int kv_heads) const {
    return Fp8Descale(q, k, v, it.b * kv_heads + it.kvh);
  }
};

// Rows of tile j's V stage `st` past the item's keys, which hold another
// sequence's values or whatever a cache holds there, to zeros: P is zero there,
// but 0 · NaN is not. A dense item's tiles end at the tensor's end, which TMA
// fills with zeros, so it has none. The consumer warpgroup clears them before
// its P·V reads the stage (the other, if any, writes the same zeros).
template <typename Cfg>
__device__ __forceinline__ void clear_v_tail(const HopperItem&, const HopperSmem<Cfg>&, int, int, int) {}
template <typename Cfg>
__device__ __forceinline__ void clear_v_tail(const VarlenItem& it, const HopperSmem<Cfg>& sm, int st, int j, int cw) {
  constexpr int BN = Cfg::kBlockN, PB = Cfg::kPanelBytes;
  const int r0 = it.info.k_len - (it.n_begin + j * BN);  // the first row past the keys
  if (r0 >= BN) return;
  const uint32_t rows = sm.v + st * Cfg::kKVBytes + r0 * PB;  // each panel's: PB bytes a row, BN rows a panel
  const int chunks = (BN - r0) * (PB / 16);                   // 16 bytes each, per panel
#pragma unroll
  for (int c = 0; c < Cfg::kPanels; ++c) {
    for (int i = threadIdx.x % 128; i < chunks; i += 128)
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(rows + c * BN * PB + 16 * i), "r"(0) : "memory");
  }
  fence_async_smem();
  consumer_sync<Cfg>(cw);
}

// Consumer warpgroup wg (1 to 3) runs every item of this CTA (`decode(k,
// entry(k))`, the scheduler's) in order; the K/V ring runs on across items (g0:
// ring position of an item's first tile). T and Out: the input and output
// element types; Mask and Mod: the mask policy and score modifier (mask.cuh);
// Descales: the inputs' dequantisation factors.
template <typename T, typename Out, typename Cfg, typename Mask, typename Mod, typename Descales, typename Decode,
          typename Entry>
__device__ __forceinline__ void hopper_consumer(const FlashParams& p, const TmaDesc& o_map, const HopperSmem<Cfg>& sm,
                                                const Descales& descales, int wg, const Decode& decode,
                                                const Entry& entry) {
  using Ops = HopperOperands<T, Cfg>;
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages;
  constexpr int QK_STEPS = Cfg::kTileCols / 16, PV_STEPS = BN / Ops::kPvKeys;
  constexpr int NT = BN / 8, DT = D / 8;
  constexpr int PV_CHUNKS = D / Ops::kPvCols, CT = Ops::kPvCols / 8;        // P·V chains, O's 8-column tiles per chain
  constexpr int PB = Cfg::kPanelBytes, PC = Cfg::kPanelCols, KP = PC / 16;  // a panel row's bytes, columns, k-steps
  constexpr bool kPersistent = Cfg::kPersistent;
  const uint32_t bar_q = sm.full_q(), empty_q = sm.empty_q(), scale_slot = sm.scale_slot();
  // Bottom-right causal: row i sees keys j <= i + diag (a dense CTA's items all
  // share this one, read once here; a serving item's is its sequence's).
  const int dense_diag = p.seqlen_k - p.seqlen_q;
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
  const Mod mod(p);

  // Descriptors (see GmmaDesc): Q rows of this warpgroup, K rows, V transposed.
  // A k-step of 16 columns advances 32 bytes inside a swizzled panel row; past
  // the panel's columns it moves to the next panel.
  GmmaDesc q_base = GmmaDesc::make<PB>(sm.q + 64 * cw * PB, 0, 8 * PB);
  const GmmaDesc k_base = GmmaDesc::make<PB>(sm.k, 0, 8 * PB);
  // Through a shuffle, which ptxas cannot recompute. Left derivable from the
  // shared window's special register, ptxas rebuilds the Q descriptor in every
  // key tile, ten dependent uniform instructions ahead of the first Q·Kᵀ wgmma.
  q_base.lo = __shfl_sync(0xffffffffu, q_base.lo, 0);
  auto q_desc_of = [&](const GmmaDesc& qb, int kk) { return qb.at(((kk / KP) * BM * PB + (kk % KP) * 32) / 16); };
  auto q_desc = [&](int kk) { return q_desc_of(q_base, kk); };

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
    return Slot{st, (uint32_t)(pos / S) & 1, sm.full_k(st), k_base.plus(st * kStageUnits)};
  };
  auto next_slot = [&](const Slot& x) {
    const bool wrap = x.st == S - 1;
    return Slot{wrap ? 0 : x.st + 1, x.phase ^ (uint32_t)wrap, wrap ? x.bar - 8 * (S - 1) : x.bar + 8,
                x.k.plus(wrap ? 0u - (S - 1) * kStageUnits : kStageUnits)};
  };
  // K from the tile's key row0 on (a panel row is a key).
  auto k_desc = [&](const Slot& x, int kk, int row0 = 0) {
    return x.k.at(((kk / KP) * BN * PB + (kk % KP) * 32 + row0 * PB) / 16);
  };
  auto v_desc = [&](const Slot& x, int kk, int c) { return Ops::v_desc(x.k, kk, c); };
  auto slot_full_v = [](const Slot& x) { return x.bar + 8 * S; };
  auto slot_empty_k = [](const Slot& x) { return x.bar + 16 * S; };
  auto slot_empty_v = [](const Slot& x) { return x.bar + 24 * S; };

  constexpr bool kPingPong = Cfg::kPingPong;
  constexpr bool kExpTurns = Cfg::kExpTurns;
  float o[DT][4];
  SoftmaxState<1> softmax;
  float correction[2];
  float s[NT][4];
  uint32_t pf[PV_STEPS][4];
  // Where P·V lands: O itself, or (HopperOperands::kPromote) a tile's own
  // accumulator of one chain's columns, added to O in fp32 once it has landed.
  float o_tile[Ops::kPromote ? CT : 1][4];
  // S = Q·K_j, asynchronous: committed as its own wgmma group.
  auto issue_qk = [&](const Slot& st) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < QK_STEPS; ++kk) wgmma_ss<T, BN>(s, q_desc(kk), k_desc(st, kk), kk > 0);
    wgmma_commit();
  };
  // S = Q·K_j in two chains of k-steps (HopperOperands::kQkChains) summed in
  // fp32, synchronously, half the keys at a time: each half's second chain
  // lands beside its first (in the other half's columns of S, then in o_tile,
  // free between P·Vs in the serial schedule), so that no more than 32
  // registers beside S and O (128) are live.
  constexpr int QK_CHAIN = QK_STEPS / Ops::kQkChains, HT = NT / 2;
  static_assert(Ops::kQkChains == 1 || (Ops::kQkChains == 2 && Cfg::kSerial && CT >= HT), "two chains");
  // The redo from the K stage holds it until the verdict, as only the serial loop does.
  static_assert(!Ops::kRedoFromK || (Cfg::kSerial && !Cfg::kSplitTail), "redo from K: serial, whole items");
  auto qk_chained = [&](const Slot& st) {
    auto half = [](float(&a)[NT][4], int i) -> float(&)[HT][4] { return *reinterpret_cast<float(*)[HT][4]>(&a[i]); };
    auto tmp = [&]() -> float(&)[HT][4] { return *reinterpret_cast<float(*)[HT][4]>(&o_tile[0]); };
    auto chains = [&](int h, float(&first)[HT][4], float(&second)[HT][4]) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < QK_STEPS; ++kk) {
        const uint64_t k = k_desc(st, kk, h * BN / 2);
        if (kk < QK_CHAIN) {
          wgmma_ss<T, BN / 2>(first, q_desc(kk), k, kk > 0);
        } else {
          wgmma_ss<T, BN / 2>(second, q_desc(kk), k, kk > QK_CHAIN);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(first);
      wgmma_fence_operands(second);
#pragma unroll
      for (int i = 0; i < HT; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) first[i][e] += second[i][e];
      }
    };
    chains(0, half(s, 0), half(s, HT));
    chains(1, half(s, HT), tmp());
  };
  // O += P·V_j, asynchronous, P from registers (promoted: O's columns of chain
  // c into o_tile, from zero).
  auto issue_pv = [&](const Slot& st, int c = 0) {
    if constexpr (Ops::kPromote) {
      wgmma_fence_operands(o_tile);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < PV_STEPS; ++kk) wgmma_rs<T, Ops::kPvCols>(o_tile, pf[kk], v_desc(st, kk, c), kk > 0);
    } else {
      wgmma_fence_operands(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < PV_STEPS; ++kk) wgmma_rs<T, D>(o, pf[kk], v_desc(st, kk, 0));
    }
    wgmma_commit();
  };
  // Chain c of a P·V has landed. Promoted, O's columns of it (of the tiles
  // before, at their max) take the tile's correction (the last update's) and
  // its P·V: O·c + P·V, the tile's rescale with it.
  auto chain_landed = [&](int c) {
    wgmma_wait<0>();
    if constexpr (Ops::kPromote) {
      wgmma_fence_operands(o_tile);
#pragma unroll
      for (int i = 0; i < CT; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#ifdef FA_PLANT_NO_RESCALE
          o[c * CT + i][e] += o_tile[i][e];  // planted: O not rescaled when a row's max grows
#else
          o[c * CT + i][e] = fmaf(o[c * CT + i][e], correction[e / 2], o_tile[i][e]);
#endif
        }
      }
    }
  };
  // The P·V from ring slot x, issued (issue_pv: its first chain), lands; the
  // chains after the first are issued and land one at a time. Then O may be
  // read, and the V stage is free.
  auto pv_landed = [&](const Slot& x) {
#pragma unroll
    for (int c = 0; c < PV_CHUNKS; ++c) {
      if (c > 0) issue_pv(x, c);
      chain_landed(c);
    }
    wgmma_fence_operands(o);
    mbar_arrive_warp(slot_empty_v(x));
    plant_slowdown(o[0][0]);
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk) Ops::p_fragment(pf[kk], s, kk);
  };
  // This warp's 16 rows of S = Q·K_xᵀ again, synchronously (mma.sync from the Q
  // and K tiles in shared memory, swizzled: panel_chunk), for the rare tile
  // whose kept max lacks headroom (generic: instantiated only where the operands
  // keep the max).
  auto recompute_s = [&](const auto& x) {
    auto swizzled = [](uint32_t tile, int panel_bytes, int row, int col) {
      return tile + (col / PC) * panel_bytes + row * PB + panel_chunk<PC>(row, (col % PC) / 8) * 16;
    };
    const uint32_t q_rows = sm.q + (64 * cw + 16 * warp) * PB, k_tile = sm.k + x.st * Cfg::kKVBytes;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll 1
    for (int kk = 0; kk < QK_STEPS; ++kk) {  // not unrolled: a rare path, kept small
      uint32_t a[4];
      ldmatrix_x4(a, swizzled(q_rows, BM * PB, lane % 16, 16 * kk + (lane / 16) * 8));
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, swizzled(k_tile, BN * PB, 16 * np + lane % 8 + (lane / 16) * 8, 16 * kk + ((lane / 8) % 2) * 8));
        if constexpr (Ops::kQkChains > 1) {  // each step's products summed in fp32, not in the MMA's accumulator
          float lo[4] = {0.f, 0.f, 0.f, 0.f}, hi[4] = {0.f, 0.f, 0.f, 0.f};
          QkStep<T>::mma(lo, a, b[0], b[1]);
          QkStep<T>::mma(hi, a, b[2], b[3]);
#pragma unroll
          for (int e = 0; e < 4; ++e) s[2 * np][e] += lo[e], s[2 * np + 1][e] += hi[e];
        } else {
          QkStep<T>::mma(s[2 * np], a, b[0], b[1]);
          QkStep<T>::mma(s[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
  };
  // An item's O and softmax state start empty.
  auto reset_rows = [&] {
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    softmax.reset(0);
  };
  // A tile this warpgroup does not read (another's, or right of its causal
  // diagonal), once its K has landed: its K stage is released, and its V stage
  // once that has landed too.
  auto release_landed = [&](const Slot& x) {
    mbar_arrive_warp(slot_empty_k(x));
    mbar_wait(slot_full_v(x), x.phase);
    mbar_arrive_warp(slot_empty_v(x));
  };

  // An item's softmax scale, and the factor O takes before it is stored: the
  // inputs' descales folded in (e4m3), else the call's scale and 1.
  struct ItemScales {
    float softmax, out;
  };
  auto item_scales = [&](const auto& it) {
    ItemScales r{scale_log2, 1.f};
    if constexpr (Descales::kScaled) {
      const Fp8Descale d = descales.at(it, p.kv_heads);
      r.softmax *= d.qk;
      r.out = d.v;
    }
    return r;
  };
  auto scale_out = [&](const ItemScales& sc) {
    if constexpr (Descales::kScaled) {
      const float both_rows[2] = {sc.out, sc.out};
      SoftmaxState<1>::rescale(o, both_rows);
    }
  };

  // The tile's scores to P against the exact running max at softmax scale
  // `scale`; O takes the correction now, or (promoted) as the tile's P·V lands
  // (chain_landed).
  auto exact_update = [&](float scale) {
    softmax.update<Ops::kLog2PScale>(0, s, correction, scale);
    if constexpr (!Ops::kPromote) softmax.rescale(o, correction);
  };

  // A split-tail item (HopperItem::split_tail): the three consumer warpgroups
  // share its 64 rows (the first warpgroup's rows of the Q tile), warpgroup cw
  // taking key tiles cw, cw + 3, … and releasing the others unread, each tile
  // serial (Q·Kᵀ, softmax, P·V): the other warpgroups' tiles overlap it. Every
  // warpgroup waits for the item's Q, so that one without a tile arrives on
  // empty_q in this item's phase. Then warpgroups 1 and 2 hand their O and
  // softmax state to warpgroup 0 through shared memory (thread i's next to
  // thread i's: the same rows and columns), which folds each in as one more key
  // tile and stores the rows.
  auto split_tail_item = [&](const HopperItem& it, int g0, int& q_loads) {
    const int row_lo = it.m0 + 16 * warp + g;
    const ItemScales sc = item_scales(it);
    reset_rows();
    if (it.tiles > 0) {
      mbar_wait(bar_q, q_loads & 1);
      ++q_loads;
      if (it.tiles <= cw) mbar_arrive_warp(empty_q);
    }
    const GmmaDesc q0 = GmmaDesc::make<PB>(sm.q, 0, 8 * PB);
    Slot cur = slot_at(g0);
    for (int j = 0; j < it.tiles; ++j, cur = next_slot(cur)) {
      mbar_wait(cur.bar, cur.phase);
      if (j % 3 != cw) {
        release_landed(cur);
        continue;
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < QK_STEPS; ++kk) wgmma_ss<T, BN>(s, q_desc_of(q0, kk), k_desc(cur, kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      mbar_arrive_warp(slot_empty_k(cur));
      if (j + 3 >= it.tiles) mbar_arrive_warp(empty_q);  // this warpgroup's last Q·Kᵀ
      mod.apply(s);
      mask_tile(s, it.n_begin + j * BN, it.m0, row_lo, t, it.keys(p), Mask(p, it.diag(dense_diag)));
      exact_update(sc.softmax);
      pack_p();
      mbar_wait(slot_full_v(cur), cur.phase);
      issue_pv(cur);
      pv_landed(cur);
    }
    constexpr int F = Cfg::kMergeFloats;
    const int tid = threadIdx.x % 128;
    auto slot_addr = [&](int from, int i) { return sm.merge + 4 * (((from - 1) * F + i) * 128 + tid); };
    if (cw > 0) {
#pragma unroll
      for (int i = 0; i < DT * 4; ++i)
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(slot_addr(cw, i)), "f"(o[i / 4][i % 4]) : "memory");
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(slot_addr(cw, DT * 4 + r)), "f"(softmax.row_max[0][r])
                     : "memory");
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(slot_addr(cw, DT * 4 + 2 + r)), "f"(softmax.row_sum[0][r])
                     : "memory");
      }
    }
    named_bar_sync(NamedBarrier::Merge, 384);
    if (cw == 0) {
#pragma unroll
      for (int from = 1; from < 3; ++from) {
        float mine[2], theirs[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float other_max, other_sum;
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(other_max) : "r"(slot_addr(from, DT * 4 + r)) : "memory");
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(other_sum) : "r"(slot_addr(from, DT * 4 + 2 + r)) : "memory");
          softmax.merge(0, r, other_max, other_sum, mine[r], theirs[r]);
        }
#pragma unroll
        for (int i = 0; i < DT * 4; ++i) {
          float x;
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(slot_addr(from, i)) : "memory");
          o[i / 4][i % 4] = o[i / 4][i % 4] * mine[(i % 4) / 2] + x * theirs[(i % 4) / 2];
        }
      }
    }
    named_bar_sync(NamedBarrier::Merge, 384);  // the area is free for the next item
    if (cw != 0) return;
    scale_out(sc);
    store_item<Out, Cfg>(p, o_map, sm, it, 0, warp, g, t, row_lo, o, softmax);
  };

  int g0 = 0, q_loads = 0;
  bool chained = false;  // this item's first turn was handed over by the previous item's end
  // Item k and the next one decoded, item k + 2's schedule entry in flight: an
  // item's decode waits on no global load, and runs once. Lane l loads item
  // k + 2 + l's entry, and lane 0's is taken: a load of one address ptxas moves
  // to the uniform datapath right away (R2UR), which waits for it there.
  auto it = decode(0, 0), nx = decode(1, entry(1));
  uint32_t ahead = entry(2 + lane);
  for (int k = 0; kPersistent || k == 0;
       ++k, it = nx, nx = decode(k + 1, __shfl_sync(0xffffffffu, ahead, 0)), ahead = entry(k + 2 + lane)) {
    if (it.done) break;
    if (it.skip) continue;
    if constexpr (Cfg::kSplitTail) {
      if (it.split_tail) {
        split_tail_item(it, g0, q_loads);
        g0 += it.tiles;
        continue;
      }
    }
    const int row_lo = it.m0 + 64 * cw + 16 * warp + g;  // this thread's rows: row_lo, row_lo + 8
    const int wg_last_row = it.m0 + 64 * cw + 63;
    reset_rows();
    const ItemScales sc = item_scales(it);

    // Causal: tiles entirely right of this warpgroup's diagonal contribute nothing;
    // they come last, and only the barrier protocol runs for them. Ping-pong needs
    // both warpgroups to take the same number of turns, so it computes them (masked).
    // The item's mask is formed where it is used: held across the loop, it
    // changed the SASS of every entry (ptxas's register assignment).
    const int live =
        Mask::kEnd && !kPingPong
            ? max(0, min(it.tiles, (Mask(p, it.diag(dense_diag)).end_after(wg_last_row) - it.n_begin + BN - 1) / BN))
            : it.tiles;
    // Tile j's scores modified and masked.
    auto mask = [&](int j) {
      mod.apply(s);
      mask_tile(s, it.n_begin + j * BN, it.m0, row_lo, t, it.keys(p), Mask(p, it.diag(dense_diag)));
    };
    // A mask that drops a row's leading keys (kBegin) leaves rows that have seen
    // no key yet at max −inf; the kept-max update would shift them by 0 and
    // could lose a later tile to underflow, so a warp with such a row takes the
    // exact update (SoftmaxState::update_kept). Warp-uniform.
    // Operands without the 16-bit kept max (HopperOperands::kKeptMax) take it
    // here every tile; e4m3's keeps its own (exp_pack_kept) further on.
    auto unseen = [&] { return Mask::kBegin && softmax.any_unseen(0); };
    auto needs_exact = [&] { return !Ops::kKeptMax || unseen(); };
    auto mask_softmax = [&](int j) {
      mask(j);
      softmax.update<Ops::kLog2PScale>(0, s, correction, sc.softmax);
    };
    // Tile j's P: with e4m3's headroom (HopperOperands::kLog2Headroom)
    // against the kept max (exp_pack_kept), leaving O's correction at 1,
    // unless the tile is an item's first, a row has seen no key, or the warp
    // turns it down; then, as without headroom, the exact update from S,
    // which the packing left in place or (kRedoFromK) the warp computes again
    // from K stage x.
    auto kept_or_exact = [&](int j, const Slot& x) {
      if constexpr (Ops::kLog2Headroom > 0) {
        if (j > 0 && !unseen()) {
          if (Ops::exp_pack_kept(softmax, s, sc.softmax, pf)) {
            correction[0] = correction[1] = 1.f;
            return;
          }
          if constexpr (Ops::kRedoFromK) {
            recompute_s(x);
            mask(j);
          }
        }
      }
      exact_update(sc.softmax);
      pack_p();
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
    // arithmetic off the uniform datapath (perf/DECISIONS.md).
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
        // An item's first tile keeps the max of its own scores, taken ahead of
        // the turn (which holds only exponentials).
        const bool exact = needs_exact();
        if (j == 0) softmax.first_max(0, s, scale_log2);
        take_turn();
        // The scale read from shared memory after the barrier: ptxas moves no
        // exponential above it (with the parameter's copy it hoisted most of them).
        float turn_scale;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(turn_scale) : "r"(scale_slot) : "memory");
        // Every tile's exponentials against the kept max (the first tile's own
        // always fits), P packed as they land (the last P·V has landed).
        float sum[2];
        softmax.exp_pack<T>(0, s, turn_scale, pf, sum);
        // The turn passes before the verdict, whose sums and vote would hold the
        // other warpgroup's exponentials back. Warpgroup 1's last hand-over of
        // an item goes on to the next one (see above).
        named_bar_arrive(j < live - 1 || cw == 0 ? turn_of(cw ^ 1)
                         : chain_next            ? NamedBarrier::TurnWg0
                                                 : NamedBarrier::TurnSink,
                         256);
        // A later tile without headroom is redone exactly, outside the turn.
        if (exact || !softmax.commit_kept(0, sum)) {
          softmax.update_max(0, s, correction, turn_scale);
          softmax.update_exp_pack<T>(0, s, correction, turn_scale, pf);
          softmax.rescale(o, correction);
        }
        mbar_wait(slot_full_v(cur), cur.phase);
        clear_v_tail<Cfg>(it, sm, cur.st, j, cw);
        issue_pv(cur);
        pv_landed(cur);
      }
    } else if constexpr (Cfg::kSerial) {
      // Each tile in order, Q·Kᵀ, the softmax, P·V: S and the P·V accumulator
      // are never live together (see "serial" in flash_fwd_hopper.cuh). With
      // headroom (HopperOperands::exp_pack_kept), an item's first tile and a
      // tile the warp turns down take the exact update, and a kept tile leaves
      // O's correction at 1. A tile redone from its K stage (kRedoFromK)
      // holds the stage until its P.
      for (int j = 0; j < live; ++j, cur = next_slot(cur)) {
        mbar_wait(cur.bar, cur.phase);
        if constexpr (Ops::kQkChains == 1) {
          issue_qk(cur);
          wgmma_wait<0>();
        } else {
          qk_chained(cur);
        }
        if constexpr (!Ops::kRedoFromK) qk_landed(cur, j);
        mask(j);
        kept_or_exact(j, cur);
        if constexpr (Ops::kRedoFromK) qk_landed(cur, j);
        mbar_wait(slot_full_v(cur), cur.phase);
        clear_v_tail<Cfg>(it, sm, cur.st, j, cw);
        issue_pv(cur);
        pv_landed(cur);
      }
    } else {
      // Software pipeline: Q·K_j and P_{j−1}·V_{j−1} go to the tensor cores
      // together; where a tile is redone, O is rescaled once that P·V has landed
      // (see "pipelined" above).
      if (live > 0) {
        mbar_wait(cur.bar, cur.phase);
        take_turn();
        issue_qk(cur);
        pass_turn();
        wgmma_wait<0>();
        qk_landed(cur, 0);
        mask_softmax(0);  // O is still zero: nothing to rescale
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
        wgmma_fence_operands(s);
        mask(j);
        const bool exact = needs_exact();
        const bool kept = !exact && softmax.update_kept(0, s, sc.softmax);
        // The 16-bit kept max may need the K stage again (recompute_s: its P
        // overwrites S_j); e4m3 redoes a tile from S_j in registers.
        if (kept || !Ops::kKeptMax) qk_landed(cur, j);
        next = next_slot(cur);
        k_ready = mbar_test(next.bar, next.phase);
        v_ready = mbar_test(slot_full_v(cur), cur.phase);
        pv_landed(prev);
        if constexpr (Ops::kLog2Headroom > 0) {
          kept_or_exact(j, cur);  // once P·V(j−1) has landed: its P was that product's operand
        } else {
          if (Ops::kKeptMax) pack_p();  // redone below where the tile is not kept
          if (!kept) {  // the exact update: without headroom, from this warp's S_j again (P overwrote it)
            if constexpr (Ops::kKeptMax) {
              if (!exact) {
                recompute_s(cur);
                mask(j);
              }
            }
            exact_update(sc.softmax);
            pack_p();
            if constexpr (Ops::kKeptMax) qk_landed(cur, j);
          }
        }
      }
      if (live > 0) {
        mbar_wait(slot_full_v(cur), cur.phase);
        clear_v_tail<Cfg>(it, sm, cur.st, live - 1, cw);
        take_turn();
        issue_pv(cur);
        if constexpr (kPingPong)
          named_bar_arrive(cw == 0      ? NamedBarrier::TurnWg1
                           : chain_next ? NamedBarrier::TurnWg0
                                        : NamedBarrier::TurnSink,
                           256);
        pv_landed(cur);
      }
    }
    for (int j = live; j < it.tiles; ++j) {  // dead causal tiles
      const Slot x = slot_at(g0 + j);
      mbar_wait(x.bar, x.phase);
      release_landed(x);
    }
    g0 += it.tiles;
    scale_out(sc);
    store_item<Out, Cfg>(p, o_map, sm, it, cw, warp, g, t, row_lo, o, softmax);
  }
  o_store_drain();
}

}  // namespace fa
