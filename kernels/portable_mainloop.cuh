// The portable kernel's consumer mainloop: per key tile S = Q·Kᵀ on mma.sync,
// masking, the online softmax, and O += P·V with P kept in registers.
#pragma once

#include "common.cuh"
#include "flash_params.h"
#include "portable_layout.cuh"
#include "portable_loads.cuh"
#include "portable_scheduler.cuh"
#include "softmax.cuh"

namespace fa {

// The Q·Kᵀ half of a warp's matrix products on its 16·MT rows (w0 …): Q
// fragments from the group's Q tile, K fragments from its K tile, each row
// kTileCols 16-bit columns. Q fragments stay in registers, loaded once, where
// Q_IN_REGS (else they would spill): otherwise they are re-read from the
// resident Q tile per key tile.
template <typename T, typename Cfg, bool Q_IN_REGS>
struct WarpQk {
  static constexpr int C = Cfg::kTileCols, MT = Cfg::kRowTiles, BN = Cfg::kBlockN, NT = BN / 8;
  static constexpr bool kQInRegs = Q_IN_REGS;
  using KFrag = FragAddr<C>;
  using QFrags = uint32_t[kQInRegs ? MT : 1][kQInRegs ? C / 16 : 1][4];
  QFrags& qf;
  const T* const sq;
  const int w0, lane;
  // K fragments: matrices (keys +0..7, d +0..7), (keys +0..7, d +8..15), (keys +8..15, d +0..7), (…, d +8..15).
  const KFrag& k_frag;

  __device__ __forceinline__ static KFrag k_frag_addr(const KeyGroup<T, Cfg>& grp, int lane) {
    return KFrag(smem_u32(grp.k), (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  }

  __device__ __forceinline__ uint32_t q_addr(int mt, int kk) const {
    return smem_u32(sq + swizzle<C>(w0 + 16 * mt + (lane % 16), kk * 16 + (lane / 16) * 8));
  }

  // Once the Q tile has landed.
  __device__ __forceinline__ void load_q_frags() const {
    if constexpr (kQInRegs) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) ldmatrix_x4(qf[mt][kk], q_addr(mt, kk));
      }
    }
  }

  // S = Q·Kᵀ for this warp's 16·MT rows × BN keys.
  __device__ __forceinline__ void qk(float (&s)[MT][NT][4]) const {
    // Row tile mt's A fragment for k-step kk: from qf, or from this k-step's reads.
    auto q_frag = [&](int mt, int kk, const uint32_t(&qs)[MT][4]) -> const uint32_t(&)[4] {
      if constexpr (kQInRegs) {
        return qf[mt][kk];
      } else {
        return qs[mt];
      }
    };
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < NT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      uint32_t qs[MT][4];
      if constexpr (!kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qs[mt], q_addr(mt, kk));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_frag.at(np, kk));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&qa)[4] = q_frag(mt, kk, qs);
          QkStep<T>::mma(s[mt][2 * np], qa, kf[0], kf[1]);
          QkStep<T>::mma(s[mt][2 * np + 1], qa, kf[2], kf[3]);
        }
      }
    }
  }
};

// A warp's matrix products on 16-bit tiles: Q·Kᵀ (WarpQk; Q fragments in
// registers but at two row tiles of D=128), and P·V from V fragments of the
// group's V tile.
template <typename T, typename Cfg>
struct WarpMma : WarpQk<T, Cfg, Cfg::kHeadDim * Cfg::kRowTiles <= 128> {
  using Qk = WarpQk<T, Cfg, Cfg::kHeadDim * Cfg::kRowTiles <= 128>;
  static constexpr int D = Cfg::kHeadDim, MT = Cfg::kRowTiles, BN = Cfg::kBlockN, NT = BN / 8;
  using typename Qk::KFrag;
  using typename Qk::QFrags;
  using VFrag = FragAddr<D>;
  // V fragments, transposed: (keys +0..7, d +0..7), (keys +8..15, d +0..7), (keys +0..7, d +8..15), (…).
  const VFrag& v_frag;

  __device__ __forceinline__ WarpMma(QFrags& qf, const KeyGroup<T, Cfg>& grp, int w0, int lane, const KFrag& k_frag,
                                     const VFrag& v_frag)
      : Qk{qf, grp.q, w0, lane, k_frag}, v_frag(v_frag) {}

  __device__ __forceinline__ static VFrag v_frag_addr(const KeyGroup<T, Cfg>& grp, int lane) {
    return VFrag(smem_u32(grp.v), ((lane / 8) % 2) * 8 + lane % 8, lane / 16);
  }
  // P of 16-key step kk as an A fragment, from the tile's exponentials.
  __device__ __forceinline__ static void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
    fa::p_fragment<T>(pf, s, kk);
  }

  // O += P·V, P as A fragments (`p_frag(f, mt, kk)`, kk: 16-key step).
  template <typename PFrag>
  __device__ __forceinline__ void pv(float (&o)[MT][D / 8][4], PFrag&& p_frag) const {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pf[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) p_frag(pf[mt], mt, kk);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_frag.at(kk, dp));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pf[mt], vf[0], vf[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pf[mt], vf[2], vf[3]);
        }
      }
    }
  }
};

// The consumer mainloop of a key group's warps over their key tiles of the
// split: group g takes tiles g, g + KG, …. `Tiles` (DenseTiles, SeqTiles) loads
// the block's Q, K and V tiles, names its key range and masks its scores; `Mod`
// (NoSoftcap, Softcap) changes the raw scores before the mask.
template <typename T, typename Cfg, typename Tiles, typename Mod>
struct PortableMainloop {
  static constexpr int D = Cfg::kHeadDim, MT = Cfg::kRowTiles, BM = Cfg::kBlockM, BN = Cfg::kBlockN, NT = BN / 8;
  static constexpr int kStep = Cfg::kKeyGroups * BN;  // between a group's key tiles
  using Mma = WarpMma<T, Cfg>;
  using QFrags = typename Mma::QFrags;
  using KFrag = typename Mma::KFrag;
  using VFrag = typename Mma::VFrag;
  using O = float[MT][D / 8][4];
  using S = float[MT][NT][4];
  const Tiles& tiles;
  const KeyGroup<T, Cfg>& grp;
  const WarpRows<MT>& wr;
  const int w0;
  const float scale_log2;
  const KFrag& k_frag;
  const VFrag& v_frag;
  const Mod mod;

  __device__ __forceinline__ static KFrag k_frag_addr(const KeyGroup<T, Cfg>& grp, int lane) {
    return Mma::k_frag_addr(grp, lane);
  }
  __device__ __forceinline__ static VFrag v_frag_addr(const KeyGroup<T, Cfg>& grp, int lane) {
    return Mma::v_frag_addr(grp, lane);
  }

  // O and the softmax state before the first key tile.
  __device__ __forceinline__ static void clear(O& o, SoftmaxState<MT>& softmax) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
      softmax.reset(mt);
    }
  }

  // The group's first loads, one cp.async group: Q and its first K tile.
  __device__ __forceinline__ void load_q_k0(int n_first) const {
    tiles.load_q();
    tiles.look_ahead(n_first);
    tiles.load_k(n_first);
    cp_async_commit();
  }

  // One K and one V tile per group: K(j+1) loads under P·V(j), V(j) under Q·Kᵀ(j)
  // and the softmax.
  __device__ __forceinline__ void run(O& o, SoftmaxState<MT>& softmax, QFrags& qf, S& s) const {
    const Mma mma(qf, grp, w0, wr.lane, k_frag, v_frag);
    // Warp-uniform: else this warp only loads and waits. (Tiles whose warps all
    // compute fold the tests away before code generation.)
    const bool computes = [&] {
      if constexpr (Tiles::kEveryWarpComputes) {
        return true;
      } else {
        return tiles.computes(w0);
      }
    }();
    const int n_first = tiles.begin() + grp.id * BN, n_end = tiles.end();
    if (n_first < n_end) load_q_k0(n_first);
    for (int n0 = n_first; n0 < n_end; n0 += kStep) {
      // cp.async groups in flight: [Q+K0] [V0] [K1] [V1] …
      tiles.load_v(n0);
      cp_async_commit();
      // Where the next tile's keys lie, looked up (a paged cache's block table)
      // under this tile's Q·Kᵀ and softmax, ahead of its loads.
      tiles.look_ahead(n0 + kStep);
      cp_async_wait<1>();  // K(n0) (and Q) landed
      grp.sync();
      if (Tiles::kEveryWarpComputes || computes) {
        if (n0 == n_first) mma.load_q_frags();
        mma.qk(s);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mod.apply(s[mt]);
          tiles.mask(s[mt], n0, w0 + 16 * mt + wr.g, wr.t);
          softmax.step(mt, s[mt], o[mt], scale_log2);
        }
      }

      cp_async_wait<0>();  // V(n0) landed
      grp.sync();          // and every warp is done reading sK
      if (n0 + kStep < n_end) {
        tiles.load_k(n0 + kStep);
        cp_async_commit();
      }
      // P straight from the S accumulators.
      if (Tiles::kEveryWarpComputes || computes)
        mma.pv(o, [&](uint32_t(&f)[4], int mt, int kk) { Mma::p_fragment(f, s[mt], kk); });
      plant_slowdown(o[0][0][0]);
#ifndef FA_DEFECT_RACE
      grp.sync();  // every warp is done reading sV before the next V load
#endif
    }
  }
};

}  // namespace fa
