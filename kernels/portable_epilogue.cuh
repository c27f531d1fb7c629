// The portable kernel's epilogue: normalise, then write O (or the split's fp32
// partial) and the LSE. Both go through shared memory: each thread stages its
// normalised pairs of its warp's rows, then the warp copies its rows out in
// 16-byte chunks, whole rows per instruction, instead of stores touching 8 rows
// each.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "flash_params.h"
#include "portable_layout.cuh"
#include "portable_scheduler.cuh"
#include "row_store.cuh"
#include "softmax.cuh"

namespace fa {

// This warp's rows w0 … w0 + 16·MT − 1 of the block, from its O accumulators and
// softmax state.
template <typename T, typename Cfg, bool CAUSAL>
__device__ __forceinline__ void portable_epilogue(const FlashParams& p, const PortableBlock<Cfg::kBlockM, CAUSAL>& blk,
                                                  const KeyGroup<T, Cfg>& grp, const WarpRows<Cfg::kRowTiles>& wr,
                                                  int w0, const float (&o)[Cfg::kRowTiles][Cfg::kHeadDim / 8][4],
                                                  const SoftmaxState<Cfg::kRowTiles>& softmax) {
  constexpr int D = Cfg::kHeadDim, DT = D / 8, MT = Cfg::kRowTiles, KG = Cfg::kKeyGroups;
  const int lane = wr.lane, g = wr.g, t = wr.t;
  const int b = blk.b, h = blk.h, split = blk.split, m0 = blk.m0;
  T* sQ = grp.q;
  // Each thread stages its normalised pairs (`put(row, dt, x, y)`; `lse_out(row,
  // lse)` for t = 0), then the warp copies its rows (`copy(row, chunk)`, kChunks
  // per row).
  auto stage = [&](auto&& put, auto&& lse_out) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float inv, lse;
        softmax.finish(mt, r, inv, lse);
        const int row = w0 + 16 * mt + g + 8 * r;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) put(row, dt, o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        if (t == 0 && row_stored(m0 + row, p.seqlen_q)) lse_out(row, lse);
      }
    }
    __syncwarp();
  };
  auto copy_rows = [&](auto chunks, auto&& copy) {
    constexpr int kChunks = decltype(chunks)::value, kRowsPerPass = 32 / kChunks;
#pragma unroll
    for (int r0 = 0; r0 < 16 * MT; r0 += kRowsPerPass) {
      const int row = w0 + r0 + lane / kChunks;
      if (row_stored(m0 + row, p.seqlen_q)) copy(row, lane % kChunks);
    }
  };
  if (p.num_splits > 1) {
    // Two-tile entries, which the planner never splits, store the partials from
    // the accumulators (staging them spilled the D=128 one on sm_89).
    if constexpr (MT == 2) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        store_rows<T, D>(p, o[mt], softmax, mt, m0 + w0 + 16 * mt + g, b, h, split, t);
      }
      return;
    }
    // The fp32 partials are staged in all of the group's tiles (BM rows of D
    // floats fit: 2·BN ≥ BM), once every warp of the group is done with K and
    // V; 16-byte chunks swizzled by row, so the 8-byte writes of 8 rows at a time
    // take two wavefronts.
    grp.sync();
    float* tile = reinterpret_cast<float*>(grp.smem);
    auto at = [&](int row, int chunk) { return tile + row * D + ((chunk ^ (row & 7)) << 2); };
    const int64_t bh0 = ((int64_t)b * p.heads + h) * p.seqlen_q;
    const int64_t part0 = (int64_t)split * p.batch * p.heads * p.seqlen_q + bh0 + m0;  // row m0's partial
    stage([&](int row, int dt, float x,
              float y) { *reinterpret_cast<float2*>(at(row, 2 * dt + t / 2) + 2 * (t % 2)) = make_float2(x, y); },
          [&](int row, float lse) { p.lse_partial[part0 + row] = lse; });
    copy_rows(std::integral_constant<int, D / 4>{}, [&](int row, int chunk) {
      *reinterpret_cast<float4*>(p.o_partial + (part0 + row) * D + 4 * chunk) =
          *reinterpret_cast<const float4*>(at(row, chunk));
    });
    return;
  }
  // Unsplit, O is staged in the warp's own rows of the Q tile (swizzled like Q, so
  // the 4-byte writes are conflict-free; as the Hopper kernel's epilogue). Two
  // groups: the hand-over slots lie in these tiles, so
  // group 0's warps first finish reading them.
  if constexpr (KG == 2) grp.sync();
  stage([&](int row, int dt, float x,
            float y) { *reinterpret_cast<uint32_t*>(sQ + swizzle<D>(row, 8 * dt + 2 * t)) = Dtype<T>::pack(x, y); },
        [&](int row, float lse) {
          if (p.lse != nullptr) p.lse[((int64_t)b * p.heads + h) * p.seqlen_q + m0 + row] = lse;
        });
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
  copy_rows(std::integral_constant<int, D / 8>{}, [&](int row, int chunk) {
    *reinterpret_cast<uint4*>(out + (int64_t)(m0 + row) * p.o_row_stride + 8 * chunk) =
        *reinterpret_cast<const uint4*>(sQ + swizzle<D>(row, 8 * chunk));
  });
}

}  // namespace fa
