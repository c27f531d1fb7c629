// FlashAttention-2-style forward pass on mma.sync tensor cores (sm_80+). The
// kernel body below orchestrates named parts, each in its own header:
//   portable_layout.cuh     FwdConfig (tiles per entry), KeyGroup (a key group's
//                           shared tiles and barrier), WarpRows, FragAddr
//   portable_scheduler.cuh  PortableBlock, KeyRange: the CTA's rows and keys
//   portable_loads.cuh      TileLoads: Q, K and V tiles global→shared (cp.async)
//   portable_mainloop.cuh   WarpMma (Q·Kᵀ, P·V) and PortableMainloop: masking,
//                           the online softmax and the loop over key tiles
//   portable_merge.cuh      KeyGroupMerge: two key groups' O and softmax state into one
//   portable_epilogue.cuh   O (or the split's fp32 partial) and the LSE out
// and, shared with the Hopper kernel, softmax.cuh (SoftmaxState), mask.cuh and
// row_store.cuh; combine.cuh merges split partials.
//
// One CTA owns kBlockM query rows of one (batch, head) and one key split; each
// warp owns 16 × kRowTiles of those rows end to end, so the online softmax needs
// no cross-warp communication, and with two row tiles every K and V fragment a
// warp loads from shared memory feeds two mma.sync instead of one. Per key tile
// of kBlockN: S = Q·Kᵀ (fp32), online softmax in the exp2 domain, O += P·V with P
// kept in registers.
//
// With kKeyGroups = 2 (the `_kg2` entries, for grids that leave SMs idle) the CTA
// is two such groups of warps over the same rows, each with its own shared Q/K/V
// tiles and named barrier, taking alternate key tiles; at the end one merges the
// other's (O, max, sum) through shared memory. Each warp's chain of mma.sync is
// half the key loop, without a second launch to combine splits.
#pragma once

#include "common.cuh"
#include "flash_params.h"
#include "portable_epilogue.cuh"
#include "portable_layout.cuh"
#include "portable_loads.cuh"
#include "portable_mainloop.cuh"
#include "portable_merge.cuh"
#include "portable_scheduler.cuh"
#include "softmax.cuh"

namespace fa {

// Planted defects, compiled in only by `cargo xtask sanitize --defects` (one
// -DFA_DEFECT_* per build) to prove each compute-sanitizer tool catches its bug:
//   FA_DEFECT_OOB_TAIL       tail rows past seqlen_q are stored (memcheck; row_store.cuh)
//   FA_DEFECT_RACE           no barrier between P·V reads of sV and the next V load
//                            (racecheck; PortableMainloop::run)
//   FA_DEFECT_UNINIT         a split with no keys writes no partials; combine reads them (initcheck)
//   FA_DEFECT_DIVERGENT_SYNC a barrier reached by half of each warp (synccheck)
// and, for proving the CI gate: FA_PLANT_SLOWDOWN=N (a dependent chain of N FMAs
// per key tile, plant_slowdown: after P·V in PortableMainloop::run and after
// each P·V has landed in hopper_consumer) and FA_PLANT_WRONG_RESULT (a 1% wrong softmax
// scale), e.g. `cargo xtask ci --gpu --define FA_PLANT_WRONG_RESULT …`; and, for
// proving fa-test's tolerances (the e4m3 ones, README "FP8"): FA_PLANT_NO_RESCALE
// (O not rescaled when a row's max grows; SoftmaxState::step),
// FA_PLANT_MASK_OFF_BY_ONE (causal rows see one key more; KeyBand) and
// FA_PLANT_E4M3_DESCALE (v_descale dropped; Fp8Descale).

template <typename T, int D, typename Mask, typename Mod, int MT, int KG>
__device__ __forceinline__ void flash_fwd(const FlashParams& p) {
  using Cfg = FwdConfig<D, MT, KG>;
  using Tiles = DenseTiles<T, Cfg, Mask>;
  using Mainloop = PortableMainloop<T, Cfg, Tiles, Mod>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The launcher takes smem and threads from the manifest; a mismatch is a build bug.
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads) __trap();
  launch_dependents();
  const KeyGroup<T, Cfg> grp(smem_raw);
  const WarpRows<MT> wr(grp.tid);
  const PortableBlock<BM, Mask> blk(p);
#ifdef FA_PLANT_WRONG_RESULT
  const float scale_log2 = p.scale_log2 * 1.01f;  // planted: a 1% wrong softmax scale
#else
  const float scale_log2 = p.scale_log2;
#endif
  const KeyRange<BM, BN, Mask> keys(p, blk);
#ifdef FA_DEFECT_UNINIT
  if (p.num_splits > 1 && keys.begin >= keys.end) return;
#endif
#ifdef FA_DEFECT_DIVERGENT_SYNC
  if (wr.lane < 16) __syncthreads();
#endif
  const HeadTensors<T> in(p, blk);

  // The thread's register arrays: O and the softmax state of its rows (16·MT from
  // w0), the mainloop's fragments and per-tile scratch, the merge's scales. They
  // are declared here, in this order, and the parts take them by reference:
  // declared inside the parts, or gathered in structs, the same code compiles to
  // different SASS (the order of ptxas's register assignment).
  float o[MT][D / 8][4];
  SoftmaxState<MT> softmax;
  Mainloop::clear(o, softmax);
  typename Mainloop::QFrags qf;
  const int w0 = wr.w0();
  const TileLoads<T, Cfg> loads(p, grp, in);
  const Tiles tiles{p, blk, keys, loads};
  const typename Mainloop::KFrag k_frag = Mainloop::k_frag_addr(grp, wr.lane);
  const typename Mainloop::VFrag v_frag = Mainloop::v_frag_addr(grp, wr.lane);
  const Mainloop mainloop{tiles, grp, wr, w0, scale_log2, k_frag, v_frag, Mod(p)};
  {
    float s[MT][BN / 8][4];
    mainloop.run(o, softmax, qf, s);
  }

  if constexpr (KG == 2) {
    float mine[MT][2], theirs[MT][2];
    if (!KeyGroupMerge<Cfg>(smem_raw, grp.tid).run(grp.id, o, softmax, mine, theirs)) return;
  }

  portable_epilogue<T, Cfg>(p, DenseRows(p, blk), blk.split, grp, wr, w0, o, softmax);
}

// A serving call's block (the `_varlen` entries): the same parts over a
// sequence's packed query heads (VarlenBlock, SeqTiles, SeqRows), 16-row tiles
// per warp and one key group.
template <typename T, int D, typename Mask, typename Mod>
__device__ __forceinline__ void flash_fwd_varlen(const VarlenParams& vp) {
  using Cfg = FwdConfig<D, 1, 1>;
  using Tiles = SeqTiles<T, Cfg, Mask>;
  using Mainloop = PortableMainloop<T, Cfg, Tiles, Mod>;
  const FlashParams& p = vp.p;
  const SeqParams& sp = vp.seq;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads) __trap();
  launch_dependents();
  const VarlenBlock<Cfg::kBlockM, Mask> blk(p, sp);
  if (blk.m0 >= blk.rows) return;  // past the sequence's rows: nothing to write
  const VarlenKeyRange<Cfg::kBlockM, Cfg::kBlockN, Mask> keys(p, sp, blk);
#ifdef FA_DEFECT_UNINIT
  if (p.num_splits > 1 && keys.begin >= keys.end) return;
#endif
  const KeyGroup<T, Cfg> grp(smem_raw);
  const WarpRows<1> wr(grp.tid);
  float o[1][D / 8][4];
  SoftmaxState<1> softmax;
  Mainloop::clear(o, softmax);
  typename Mainloop::QFrags qf;
  const int w0 = wr.w0();
  const Tiles tiles(p, sp, blk, keys, grp);
  const typename Mainloop::KFrag k_frag = Mainloop::k_frag_addr(grp, wr.lane);
  const typename Mainloop::VFrag v_frag = Mainloop::v_frag_addr(grp, wr.lane);
  const Mainloop mainloop{tiles, grp, wr, w0, p.scale_log2, k_frag, v_frag, Mod(p)};
  {
    float s[1][Cfg::kBlockN / 8][4];
    mainloop.run(o, softmax, qf, s);
  }
  portable_epilogue<T, Cfg>(p, SeqRows<VarlenBlock<Cfg::kBlockM, Mask>>{p, sp, blk}, blk.split, grp, wr, w0, o,
                            softmax);
}

}  // namespace fa

// One stable extern "C" forward entry:
// flash_fwd_<dtype>_d<D>[_causal|_local][_softcap][_m64|_kg2]. MASK: NoMask,
// CausalMask or LocalMask; MOD: NoSoftcap or Softcap (mask.cuh). MT: 16-row tiles
// per warp; KG: key groups.
#define FA_FWD_ENTRY(T, D, MASK, MOD, MT, KG, NAME)                                                                   \
  extern "C" __global__ void __launch_bounds__(fa::FwdConfig<D, MT, KG>::kThreads, 1) NAME(const fa::FlashParams p) { \
    fa::flash_fwd<T, D, fa::MASK, fa::MOD, MT, KG>(p);                                                                \
  }
// The serving entries: flash_fwd_varlen_<dtype>_d<D>[_causal|_local][_softcap].
#define FA_VARLEN_ENTRY(T, D, MASK, MOD, NAME)                                                                       \
  extern "C" __global__ void __launch_bounds__(fa::FwdConfig<D, 1, 1>::kThreads, 1) NAME(const fa::VarlenParams p) { \
    fa::flash_fwd_varlen<T, D, fa::MASK, fa::MOD>(p);                                                                \
  }
#define FA_VARLEN_ENTRIES_D(T, DT, D) FA_ENTRIES_EVERY_SCORES(FA_VARLEN_ENTRY, T, D, flash_fwd_varlen_##DT##_d##D)
#define FA_VARLEN_ENTRIES(T, DT) FA_EVERY_HEAD_DIM(FA_VARLEN_ENTRIES_D, T, DT)
// The masked and modified entries of head dim D in one 16-row tile per warp.
#define FA_FWD_MASKED_ENTRIES(T, DT, D)                                                 \
  FA_FWD_ENTRY(T, D, CausalMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d##D##_causal)       \
  FA_FWD_ENTRY(T, D, LocalMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d##D##_local)         \
  FA_FWD_ENTRY(T, D, NoMask, Softcap, 1, 1, flash_fwd_##DT##_d##D##_softcap)            \
  FA_FWD_ENTRY(T, D, CausalMask, Softcap, 1, 1, flash_fwd_##DT##_d##D##_causal_softcap) \
  FA_FWD_ENTRY(T, D, LocalMask, Softcap, 1, 1, flash_fwd_##DT##_d##D##_local_softcap)
// Every forward entry of one dtype: two 16-row tiles per warp, or one (`_m64`,
// for problems that would not fill the GPU), or one with two key groups (`_kg2`,
// for grids that leave SMs idle); causal D=64 one tile only (two lost 7%). The
// softcapped entries take the causal entries' tiles; the windowed (`_local`)
// ones one tile (at D=128 two spilled 48 bytes on sm_80-89). D=96: two tiles
// unmasked (and `_m64`), one for every other mask and modifier. D=192 and 256:
// 64-row CTAs of one tile per warp, every mask and modifier (FwdConfig).
#define FA_FWD_ENTRIES(T, DT)                                                           \
  FA_FWD_ENTRY(T, 64, NoMask, NoSoftcap, 2, 1, flash_fwd_##DT##_d64)                    \
  FA_FWD_ENTRY(T, 64, NoMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d64_m64)                \
  FA_FWD_ENTRY(T, 64, NoMask, NoSoftcap, 1, 2, flash_fwd_##DT##_d64_kg2)                \
  FA_FWD_MASKED_ENTRIES(T, DT, 64)                                                      \
  FA_FWD_ENTRY(T, 128, NoMask, NoSoftcap, 2, 1, flash_fwd_##DT##_d128)                  \
  FA_FWD_ENTRY(T, 128, NoMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d128_m64)              \
  FA_FWD_ENTRY(T, 128, NoMask, NoSoftcap, 1, 2, flash_fwd_##DT##_d128_kg2)              \
  FA_FWD_ENTRY(T, 128, CausalMask, NoSoftcap, 2, 1, flash_fwd_##DT##_d128_causal)       \
  FA_FWD_ENTRY(T, 128, CausalMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d128_causal_m64)   \
  FA_FWD_ENTRY(T, 128, LocalMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d128_local)         \
  FA_FWD_ENTRY(T, 128, NoMask, Softcap, 2, 1, flash_fwd_##DT##_d128_softcap)            \
  FA_FWD_ENTRY(T, 128, CausalMask, Softcap, 2, 1, flash_fwd_##DT##_d128_causal_softcap) \
  FA_FWD_ENTRY(T, 128, LocalMask, Softcap, 1, 1, flash_fwd_##DT##_d128_local_softcap)   \
  FA_FWD_ENTRY(T, 96, NoMask, NoSoftcap, 2, 1, flash_fwd_##DT##_d96)                    \
  FA_FWD_ENTRY(T, 96, NoMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d96_m64)                \
  FA_FWD_MASKED_ENTRIES(T, DT, 96)                                                      \
  FA_FWD_ENTRY(T, 192, NoMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d192)                  \
  FA_FWD_MASKED_ENTRIES(T, DT, 192)                                                     \
  FA_FWD_ENTRY(T, 256, NoMask, NoSoftcap, 1, 1, flash_fwd_##DT##_d256)                  \
  FA_FWD_MASKED_ENTRIES(T, DT, 256)
