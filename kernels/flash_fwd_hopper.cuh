// Hopper (sm_90a) forward pass: TMA loads into a shared-memory ring completed on
// mbarriers, wgmma for Q·Kᵀ and P·V, warp specialisation. The kernel body below
// orchestrates named parts, each in its own header:
//   hopper_layout.cuh     HopperConfig (tiles, ring depth, register split) and
//                         HopperSmem (the shared-memory layout and mbarriers)
//   hopper_scheduler.cuh  hopper_item: the work items a CTA runs, in order
//   hopper_producer.cuh   warpgroup 0: barrier set-up and every TMA load
//   hopper_mainloop.cuh   the consumer warpgroups: Q·Kᵀ, softmax, P·V per tile
//   hopper_epilogue.cuh   O out through shared memory by TMA, and the log-sum-exp
// Named barriers are `NamedBarrier` (hopper.cuh).
//
// A work item is kBlockM = 64 × kConsumers query rows of one (batch, head, split);
// a CTA runs one, or (persistent entries) loops over several. Warpgroup 0 is the
// producer: it gives most of its registers away (setmaxnreg) and one thread
// issues TMA loads of Q once per item and of K and V per key tile into a
// kStages-deep ring. Each consumer warpgroup owns 64 query rows end to end; while
// one consumer warpgroup (or CTA) does its softmax, the other's wgmmas keep the
// tensor cores busy. Barriers per stage:
//   full_k/full_v  the producer's expect_tx arrival + TMA bytes; consumers wait
//   empty_k/empty_v every consumer warp arrives once its wgmma has read the stage
#pragma once

#include "hopper.cuh"
#include "hopper_layout.cuh"
#include "hopper_mainloop.cuh"
#include "hopper_producer.cuh"
#include "hopper_scheduler.cuh"
#include "softmax.cuh"

namespace fa {

// An entry is (head dim, causal, ROWS). ROWS = 64 ("_m64" entries): one consumer
// warpgroup, which at D=64 runs two CTAs per SM (each with half the registers and
// shared memory) so that one CTA's prologue (Q and first-tile latency) and
// epilogue overlap the other's main loop, and at D=128 (shared memory for one)
// doubles the CTAs of small problems. ROWS = 128: two consumer warpgroups (D=64:
// causal only). ROWS = 192 (non-causal D=64 and e4m3 D=128, persistent): three
// consumer warpgroups in one CTA per SM, where two 64-row CTAs (D=64) or one
// 128-row CTA have registers for two;
// a grid's partial last round of units runs as 64-row items whose key tiles the
// warpgroups share (HopperSched::whole_units), so that it takes a third as long.
// kernel-ffi picks between a configuration's entries per problem
// (planner::prefer_m64, planner::prefer_m192, planner::prefer_wide_causal_d64).
//
// The consumer schedule follows from ROWS and D:
//   pipelined  (one or three 16-bit consumer warpgroups, the three overlapping one
//              another freely) tile j's Q·Kᵀ and tile j−1's P·V issued together, then tile j's
//              softmax. With the next tile's barriers probed after the softmax,
//              the wait for that P·V comes after about half of the exponentials,
//              so P·V runs under the rest (ptxas would otherwise hoist it above
//              them). P·V issued after the mask instead runs under the softmax:
//              1.5-15% slower on large shapes on an H200, as is FlashAttention-3's
//              intra-warpgroup overlap forced behind a loop edge (perf/DECISIONS.md)
//   ping-pong  (two consumer warpgroups, D ≥ 96 but e4m3 D=256) pipelined, and the warpgroups take
//              turns issuing their wgmmas (named barriers), so one's softmax runs
//              under the other's matrix products
//   exp turns  (two consumer warpgroups, D=64) each warpgroup serial (Q·Kᵀ, the
//              row max, the exponentials, P·V), the warpgroups taking turns on the
//              exponentials only, as cuDNN's sm90 kernel does: at D=64 the SFU's
//              exponentials take as long as the tile's products at full rate. At
//              D=128 this was 10% slower causal and 1-2% slower non-causal than
//              ping-pong; at D=64 ping-pong was 4-8% slower than exp turns.
//   serial     (e4m3: two consumer warpgroups at D=256, three at D=128) each
//              warpgroup serial (Q·Kᵀ, the softmax, P·V) and the warpgroups
//              overlapping freely: pipelined, S would be live beside O and the
//              promoted P·V's accumulator (D=256: 128 + 64 + 64 registers of
//              240; D=128, three warpgroups: 64 + 64 + 64 of 160). Turns at each
//              product's issue were 1-2% slower at D=256 on an H200; at D=128 the
//              third warpgroup fills the tensor pipe that two ping-pong ones
//              leave idle half the time (perf/DECISIONS.md).
// With 16-bit inputs, in every schedule an item's later key tiles (a split tail's excepted) take their
// exponentials against the row max kept from its earlier tiles, without the
// tile's own max (SoftmaxState::update_kept); a warp whose sums then lack
// headroom redoes the tile exactly, the pipelined schedules from S recomputed
// with mma.sync (P overwrote it), exp turns from S itself. Exp turns run an
// item's first tile through that same code, with its own max kept (first_max).
// With 16-bit inputs a serial schedule swings by 5-10% with any change to the
// kernel's code generation, so no 16-bit entry uses it.
//
// Each CTA runs its items (hopper_item: one, or a persistent CTA's many) in
// order. The K/V ring runs on across items (g0: ring position of an item's first
// tile) and Q has a full/empty pair, so the producer loads the next item's Q and
// first tiles while the consumers finish and store the current one. With one
// item per CTA the loops fold to straight-line code.
// Every CTA's start: the launch geometry checked (it comes from the manifest,
// persistent entries on a 1-D grid; a mismatch is a build bug), dependents
// let launch, and the shared-memory layout.
template <typename Cfg>
__device__ __forceinline__ HopperSmem<Cfg> hopper_start() {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads ||
      (Cfg::kPersistent && (gridDim.y != 1 || gridDim.z != 1)))
    __trap();
  launch_dependents();
  return HopperSmem<Cfg>::at(smem_raw);
}

// The CTA's work once its first item is known (`decode(k, entry(k))`: item k,
// which the scheduler names): the producer warpgroup's loads, the consumers'
// products and stores.
template <typename T, typename Out, typename Cfg, typename Mask, typename Mod, typename Descales, typename Item,
          typename Decode, typename Entry>
__device__ __forceinline__ void hopper_run(const HopperParams& hp, const HopperSmem<Cfg>& sm, const Item& first,
                                           const Decode& decode, const Entry& entry, const Descales& descales) {
  auto item = [&](int k) { return decode(k, entry(k)); };
  const int wg = threadIdx.x / 128;
  // Tiles of the first item issued with its Q before the CTA barrier (thread 0).
  const int early = !first.done && first.tiles > 0 ? min(first.tiles, Cfg::kStages) : 0;
  const HopperProducer<Cfg, Item> producer{hp, sm, first, early};
  if (threadIdx.x == 0) producer.prologue();
  __syncthreads();

  if (wg == 0) {
    // ---- Producer: one thread issues every TMA load.
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) producer.run(item);
    return;
  }

  // ---- Consumers.
  regs_alloc<Cfg::kConsumerRegs>();
  hopper_consumer<T, Out, Cfg, Mask, Mod>(hp.p, hp.o_map, sm, descales, wg, decode, entry);
}

// T: the inputs' element type (e4m3x2: e4m3 pairs, with Out the output's and
// their Descales).
template <typename T, int D, typename Mask, typename Mod, int ROWS, bool PERSISTENT, typename Out = T,
          typename Descales = NoDescales>
__device__ __forceinline__ void flash_fwd_hopper(const HopperParams& hp, const Descales& descales = {}) {
  using Cfg = HopperConfig<D, Mask::kEnd, ROWS, PERSISTENT, kElementBytes<T>>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  constexpr bool kPersistent = Cfg::kPersistent;
  const HopperSmem<Cfg> sm = hopper_start<Cfg>();
  // The first item is decoded once, up front, by every thread.
  constexpr bool kScheduled = Mask::kEnd && !Mask::kBegin && kPersistent && Cfg::kConsumers == 2;
  constexpr bool kTail = Cfg::kSplitTail;
  auto entry = [&](int k) { return hopper_entry<kPersistent, kScheduled>(hp.sched, k); };
  const HopperItem first = hopper_item<BM, BN, Mask, kPersistent, kScheduled, kTail>(hp.p, hp.sched, 0, entry(0));
  // Item k from its schedule entry (hopper_entry), which callers load ahead.
  auto decode = [&](int k, uint32_t e) {
    return k == 0 ? first : hopper_item<BM, BN, Mask, kPersistent, kScheduled, kTail>(hp.p, hp.sched, k, e);
  };
  hopper_run<T, Out, Cfg, Mask, Mod>(hp, sm, first, decode, entry, descales);
}

// A serving call's CTA (the `_varlen` entries): one item of 128 rows of one
// sequence's query head (two consumer warpgroups), its rows and keys where
// SeqParams says. Q and K/V tiles come in by TMA at the sequence's offsets
// (paged: a tile lies in one page); O goes out from the accumulators, bounded
// by the sequence (store_item).
template <typename T, int D, typename Mask, typename Mod>
__device__ __forceinline__ void flash_fwd_hopper_varlen(const HopperVarlenParams& vp) {
  static_assert(kElementBytes<T> == 2, "serving calls take 16-bit inputs (clear_v_tail: V in key rows)");
  using Cfg = HopperConfig<D, Mask::kEnd, 128, false>;
  const HopperSmem<Cfg> sm = hopper_start<Cfg>();
  const VarlenItem first = varlen_item<Cfg::kBlockM, Cfg::kBlockN, Mask>(vp.hp.p, vp.seq);
  if (first.skip) return;  // a block past its sequence's rows
  auto entry = [](int) { return 0u; };
  auto decode = [&](int k, uint32_t) {
    VarlenItem none{};
    none.done = true;
    return k == 0 ? first : none;
  };
  hopper_run<T, T, Cfg, Mask, Mod>(vp.hp, sm, first, decode, entry, NoDescales{});
}

}  // namespace fa

// One stable extern "C" entry point:
// flash_fwd_hopper_<dtype>_d<D>[_causal|_local][_softcap][_m64][_persistent].
#define FA_HOPPER_ENTRY(T, D, MASK, MOD, ROWS, PERSISTENT, NAME)                                                  \
  extern "C" __global__ void __launch_bounds__(fa::HopperConfig<D, fa::MASK::kEnd, ROWS, PERSISTENT>::kThreads,   \
                                               fa::HopperConfig<D, fa::MASK::kEnd, ROWS, PERSISTENT>::kCtasPerSm) \
      NAME(const __grid_constant__ fa::HopperParams p) {                                                          \
    fa::flash_fwd_hopper<T, D, fa::MASK, fa::MOD, ROWS, PERSISTENT>(p);                                           \
  }

// One serving entry: flash_fwd_hopper_varlen_<dtype>_d<D>[_causal|_local][_softcap].
#define FA_HOPPER_VARLEN_ENTRY(T, D, MASK, MOD, NAME)                                                        \
  extern "C" __global__ void __launch_bounds__(fa::HopperConfig<D, fa::MASK::kEnd, 128, false>::kThreads, 1) \
      NAME(const __grid_constant__ fa::HopperVarlenParams p) {                                               \
    fa::flash_fwd_hopper_varlen<T, D, fa::MASK, fa::MOD>(p);                                                 \
  }
#define FA_HOPPER_VARLEN_ENTRIES_D(T, DT, D) \
  FA_ENTRIES_EVERY_SCORES(FA_HOPPER_VARLEN_ENTRY, T, D, flash_fwd_hopper_varlen_##DT##_d##D)

// The masked and modified entries of head dim D in persistent 128-row CTAs
// (units of one query block; causal ones pairs or a host schedule).
#define FA_HOPPER_MASKED_ENTRIES(T, DT, D)                                                                       \
  FA_HOPPER_ENTRY(T, D, CausalMask, NoSoftcap, 128, FA_HOPPER_PERSISTENT_CAUSAL,                                 \
                  flash_fwd_hopper_##DT##_d##D##_causal)                                                         \
  FA_HOPPER_ENTRY(T, D, LocalMask, NoSoftcap, 128, true, flash_fwd_hopper_##DT##_d##D##_local)                   \
  FA_HOPPER_ENTRY(T, D, NoMask, Softcap, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_##DT##_d##D##_softcap) \
  FA_HOPPER_ENTRY(T, D, CausalMask, Softcap, 128, FA_HOPPER_PERSISTENT_CAUSAL,                                   \
                  flash_fwd_hopper_##DT##_d##D##_causal_softcap)                                                 \
  FA_HOPPER_ENTRY(T, D, LocalMask, Softcap, 128, true, flash_fwd_hopper_##DT##_d##D##_local_softcap)

// Every Hopper entry of one dtype: D=64 in 64-row CTAs (two per SM), non-causal
// also persistent and in persistent 192-row CTAs, causal also in 128-row CTAs
// (exp turns); D=96 and 128 in 128-row CTAs, plus 64-row ones for non-causal
// problems that do not fill the GPU; D=192 in 128-row CTAs; the serving entries
// in 128-row CTAs. The windowed (`_local`) and softcapped entries run
// persistent 128-row CTAs (units of one query block; causal softcapped ones
// pairs or a host schedule, as causal). D=256: every mask and modifier in
// 128-row CTAs, one per query block.
#define FA_HOPPER_ENTRIES(T, DT)                                                                                      \
  FA_HOPPER_ENTRY(T, 64, NoMask, NoSoftcap, 64, false, flash_fwd_hopper_##DT##_d64_m64)                               \
  FA_HOPPER_ENTRY(T, 64, NoMask, NoSoftcap, 64, true, flash_fwd_hopper_##DT##_d64_m64_persistent)                     \
  FA_HOPPER_ENTRY(T, 64, NoMask, NoSoftcap, 192, true, flash_fwd_hopper_##DT##_d64)                                   \
  FA_HOPPER_ENTRY(T, 64, CausalMask, NoSoftcap, 64, FA_HOPPER_PERSISTENT_CAUSAL,                                      \
                  flash_fwd_hopper_##DT##_d64_causal_m64)                                                             \
  FA_HOPPER_ENTRY(T, 64, CausalMask, NoSoftcap, 128, FA_HOPPER_PERSISTENT_CAUSAL, flash_fwd_hopper_##DT##_d64_causal) \
  FA_HOPPER_ENTRY(T, 64, LocalMask, NoSoftcap, 128, true, flash_fwd_hopper_##DT##_d64_local)                          \
  FA_HOPPER_ENTRY(T, 64, NoMask, Softcap, 128, true, flash_fwd_hopper_##DT##_d64_softcap)                             \
  FA_HOPPER_ENTRY(T, 64, CausalMask, Softcap, 128, FA_HOPPER_PERSISTENT_CAUSAL,                                       \
                  flash_fwd_hopper_##DT##_d64_causal_softcap)                                                         \
  FA_HOPPER_ENTRY(T, 64, LocalMask, Softcap, 128, true, flash_fwd_hopper_##DT##_d64_local_softcap)                    \
  FA_HOPPER_ENTRY(T, 96, NoMask, NoSoftcap, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_##DT##_d96)              \
  FA_HOPPER_ENTRY(T, 96, NoMask, NoSoftcap, 64, false, flash_fwd_hopper_##DT##_d96_m64)                               \
  FA_HOPPER_MASKED_ENTRIES(T, DT, 96)                                                                                 \
  FA_HOPPER_ENTRY(T, 128, NoMask, NoSoftcap, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_##DT##_d128)            \
  FA_HOPPER_ENTRY(T, 128, NoMask, NoSoftcap, 64, false, flash_fwd_hopper_##DT##_d128_m64)                             \
  FA_HOPPER_MASKED_ENTRIES(T, DT, 128)                                                                                \
  FA_HOPPER_ENTRY(T, 192, NoMask, NoSoftcap, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_##DT##_d192)            \
  FA_HOPPER_MASKED_ENTRIES(T, DT, 192)                                                                                \
  FA_HOPPER_ENTRY(T, 256, NoMask, NoSoftcap, 128, false, flash_fwd_hopper_##DT##_d256)                                \
  FA_HOPPER_ENTRY(T, 256, CausalMask, NoSoftcap, 128, false, flash_fwd_hopper_##DT##_d256_causal)                     \
  FA_HOPPER_ENTRY(T, 256, LocalMask, NoSoftcap, 128, false, flash_fwd_hopper_##DT##_d256_local)                       \
  FA_HOPPER_ENTRY(T, 256, NoMask, Softcap, 128, false, flash_fwd_hopper_##DT##_d256_softcap)                          \
  FA_HOPPER_ENTRY(T, 256, CausalMask, Softcap, 128, false, flash_fwd_hopper_##DT##_d256_causal_softcap)               \
  FA_HOPPER_ENTRY(T, 256, LocalMask, Softcap, 128, false, flash_fwd_hopper_##DT##_d256_local_softcap)                 \
  FA_EVERY_HEAD_DIM(FA_HOPPER_VARLEN_ENTRIES_D, T, DT)

// One e4m3 entry: flash_fwd_hopper_e4m3_<out dtype>_d<D>[_causal][_m192], 128-row CTAs
// (D=128 persistent as the 16-bit ones; D=256 one per query block) or, non-causal
// D=128, persistent 192-row ones; the descales beside the 16-bit entries'
// parameters, V transposed (HopperFp8Params). No D=64: there the exponentials
// bound it, and the 16-bit entries run dequantised e4m3 inputs faster
// (docs/PERFORMANCE.md).
#define FA_HOPPER_E4M3_ENTRY(OUT, D, MASK, ROWS, PERSISTENT, NAME)                                                    \
  extern "C" __global__ void __launch_bounds__(fa::HopperConfig<D, fa::MASK::kEnd, ROWS, PERSISTENT, 1>::kThreads, 1) \
      NAME(const __grid_constant__ fa::HopperFp8Params p) {                                                           \
    fa::flash_fwd_hopper<fa::e4m3x2, D, fa::MASK, fa::NoSoftcap, ROWS, PERSISTENT, OUT>(                              \
        p.hp, fa::E4m3Descales{p.q_descale, p.k_descale, p.v_descale});                                               \
  }
// Every e4m3 entry with output type OUT (DT its name).
#define FA_HOPPER_E4M3_ENTRIES(OUT, DT)                                                                     \
  FA_HOPPER_E4M3_ENTRY(OUT, 128, NoMask, 128, FA_HOPPER_PERSISTENT_D128, flash_fwd_hopper_e4m3_##DT##_d128) \
  FA_HOPPER_E4M3_ENTRY(OUT, 128, NoMask, 192, true, flash_fwd_hopper_e4m3_##DT##_d128_m192)                 \
  FA_HOPPER_E4M3_ENTRY(OUT, 128, CausalMask, 128, FA_HOPPER_PERSISTENT_CAUSAL,                              \
                       flash_fwd_hopper_e4m3_##DT##_d128_causal)                                            \
  FA_HOPPER_E4M3_ENTRY(OUT, 256, NoMask, 128, false, flash_fwd_hopper_e4m3_##DT##_d256)                     \
  FA_HOPPER_E4M3_ENTRY(OUT, 256, CausalMask, 128, false, flash_fwd_hopper_e4m3_##DT##_d256_causal)
