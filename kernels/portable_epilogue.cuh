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

// Rows a constant stride apart: row r at base + (row0 + r) · stride.
template <typename P>
struct StridedRows {
  P base;
  int row0;
  int64_t stride;
  __device__ __forceinline__ P at(int r) const { return base + (int64_t)(row0 + r) * stride; }
};

// Where a dense block's rows go: row r is query row m0 + r of (b, h). The
// addresses are formed where the epilogue needs them (`partials`, `outs`):
// formed earlier and held, they lengthen register lifetimes across the staging.
struct DenseRows {
  const FlashParams& p;
  const int b, h, m0;

  template <int BM, typename Mask>
  __device__ __forceinline__ DenseRows(const FlashParams& p, const PortableBlock<BM, Mask>& blk)
      : p(p), b(blk.b), h(blk.h), m0(blk.m0) {}

  __device__ __forceinline__ bool stored(int r) const { return row_stored(m0 + r, p.seqlen_q); }
  // Its index in [batch, heads, seqlen_q]: the LSE's row.
  __device__ __forceinline__ int64_t index(int r) const { return ((int64_t)b * p.heads + h) * p.seqlen_q + m0 + r; }
  // Its index in [splits, batch, heads, seqlen_q]: the partials' row.
  __device__ __forceinline__ StridedRows<int64_t> partials(int split) const {
    const int64_t bh0 = ((int64_t)b * p.heads + h) * p.seqlen_q;
    return {(int64_t)split * p.batch * p.heads * p.seqlen_q + bh0 + m0, 0, 1};
  }
  // Its first element in out.
  template <typename T>
  __device__ __forceinline__ StridedRows<T*> outs() const {
    T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
    return {out, m0, p.o_row_stride};
  }
};

// Where a serving block's packed rows go: row r is token (m0 + r) / group of
// query head kvh · group + (m0 + r) % group, a row of its sequence in out.
template <typename Block>
struct SeqRows {
  const FlashParams& p;
  const SeqParams& sp;
  const Block& blk;

  // (query head, row of q's batch) of packed row r.
  __device__ __forceinline__ int2 place(int r) const {
    const int i = blk.m0 + r, token = blk.token(i, sp);
    return make_int2(blk.kvh * sp.group.div + (i - token * sp.group.div), blk.info.q_row0 + token);
  }
  __device__ __forceinline__ bool stored(int r) const { return row_stored(blk.m0 + r, blk.rows); }
  __device__ __forceinline__ int64_t index(int r) const {
    const int2 at = place(r);
    return ((int64_t)blk.info.q_batch * p.heads + at.x) * p.seqlen_q + at.y;
  }

  struct Partials {
    const SeqRows& rows;
    int64_t split0;
    __device__ __forceinline__ int64_t at(int r) const { return split0 + rows.index(r); }
  };
  __device__ __forceinline__ Partials partials(int split) const {
    return {*this, (int64_t)split * p.batch * p.heads * p.seqlen_q};
  }

  template <typename T>
  struct Outs {
    const SeqRows& rows;
    __device__ __forceinline__ T* at(int r) const {
      const FlashParams& p = rows.p;
      const int2 where = rows.place(r);
      return static_cast<T*>(p.o) + rows.blk.info.q_batch * p.o_batch_stride + where.x * p.o_head_stride +
             (int64_t)where.y * p.o_row_stride;
    }
  };
  template <typename T>
  __device__ __forceinline__ Outs<T> outs() const {
    return {*this};
  }
};

// This warp's rows w0 … w0 + 16·MT − 1 of the block, from its O accumulators
// (pairs at Cfg::pair_col) and softmax state, to where `rows` (DenseRows,
// SeqRows) puts them as T, staged in the group's tiles (of input type In).
template <typename T, typename Cfg, typename Rows, typename In>
__device__ __forceinline__ void portable_epilogue(const FlashParams& p, const Rows& rows, int split,
                                                  const KeyGroup<In, Cfg>& grp, const WarpRows<Cfg::kRowTiles>& wr,
                                                  int w0, const float (&o)[Cfg::kRowTiles][Cfg::kHeadDim / 8][4],
                                                  const SoftmaxState<Cfg::kRowTiles>& softmax) {
  constexpr int D = Cfg::kHeadDim, DT = D / 8, MT = Cfg::kRowTiles, KG = Cfg::kKeyGroups;
  const int lane = wr.lane, g = wr.g, t = wr.t;
  T* sQ = reinterpret_cast<T*>(grp.smem);
  // Each thread stages its normalised pairs (`put(row, dt, x, y)`: pair dt; `lse_out(row,
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
        if (t == 0 && rows.stored(row)) lse_out(row, lse);
      }
    }
    __syncwarp();
  };
  // A row takes the largest power of two of lanes, at most 32, that divides its
  // chunks; each lane several chunks where more remain (D=96, 192, and D=256's
  // fp32 partials).
  auto copy_rows = [&](auto chunks, auto&& copy) {
    constexpr int kChunks = decltype(chunks)::value, kLanes = (kChunks & -kChunks) < 32 ? (kChunks & -kChunks) : 32;
    constexpr int kRowsPerPass = 32 / kLanes;
#pragma unroll
    for (int r0 = 0; r0 < 16 * MT; r0 += kRowsPerPass) {
      const int row = w0 + r0 + lane / kLanes;
      if (rows.stored(row)) {
#pragma unroll
        for (int c = 0; c < kChunks / kLanes; ++c) copy(row, lane % kLanes + c * kLanes);
      }
    }
  };
  if (p.num_splits > 1) {
    // Two-tile entries, which the planner never splits, store the partials from
    // the accumulators (staging them spilled the D=128 one on sm_89).
    if constexpr (MT == 2) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        store_rows<T, D>(p, o[mt], softmax, mt, rows.m0 + w0 + 16 * mt + g, rows.b, rows.h, split, t);
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
    const auto part = rows.partials(split);
    stage(
        [&](int row, int dt, float x, float y) {
          const int2 c = Cfg::pair_chunk4(dt, t);
          *reinterpret_cast<float2*>(at(row, c.x) + c.y) = make_float2(x, y);
        },
        [&](int row, float lse) { p.lse_partial[part.at(row)] = lse; });
    copy_rows(std::integral_constant<int, D / 4>{}, [&](int row, int chunk) {
      *reinterpret_cast<float4*>(p.o_partial + part.at(row) * D + 4 * chunk) =
          *reinterpret_cast<const float4*>(at(row, chunk));
    });
    return;
  }
  // Unsplit, O is staged in the warp's own rows of the Q tile (swizzled like Q, so
  // the 4-byte writes are conflict-free; as the Hopper kernel's epilogue). Two
  // groups: the hand-over slots lie in these tiles, so
  // group 0's warps first finish reading them.
  if constexpr (KG == 2) grp.sync();
  stage(
      [&](int row, int dt, float x, float y) {
        *reinterpret_cast<uint32_t*>(sQ + swizzle<D>(row, Cfg::pair_col(dt, t))) = Dtype<T>::pack(x, y);
      },
      [&](int row, float lse) {
        if (p.lse != nullptr) p.lse[rows.index(row)] = lse;
      });
  const auto out = rows.template outs<T>();
  copy_rows(std::integral_constant<int, D / 8>{}, [&](int row, int chunk) {
    *reinterpret_cast<uint4*>(out.at(row) + 8 * chunk) =
        *reinterpret_cast<const uint4*>(sQ + swizzle<D>(row, 8 * chunk));
  });
}

}  // namespace fa
