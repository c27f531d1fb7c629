// The portable kernel's global→shared tile loads (cp.async).
#pragma once

#include "common.cuh"
#include "flash_params.h"
#include "portable_layout.cuh"
#include "portable_scheduler.cuh"

namespace fa {

// Copies ROWS-row tiles of a [rows, D] matrix into a swizzled shared tile with
// cp.async, each thread always moving the same 16-byte column chunk of rows
// r, r + kRowsPerPass, …: its shared addresses are fixed (the swizzle term depends
// on r % 8 only, and kRowsPerPass is a multiple of 8), and its global address
// advances by a constant. Everything but one multiply per tile is set up once.
template <typename T, int ROWS, int D, int THREADS>
struct TileCopy {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = ROWS / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "each thread keeps one chunk column and one swizzle phase");
  uint32_t smem;        // this thread's chunk of its first row
  const T* gmem;        // row `row` of the matrix at this thread's chunk column
  int64_t pass_stride;  // elements between this thread's rows in consecutive passes
  int row;

  // `tid`: this thread's index among the THREADS that copy.
  __device__ __forceinline__ TileCopy(T* tile, const T* base, int64_t row_stride, unsigned tid) {
    row = tid / kChunks;
    const int ch = tid % kChunks;
    smem = smem_u32(tile + swizzle<D>(row, ch * 8));
    gmem = base + (int64_t)row * row_stride + ch * 8;
    pass_stride = (int64_t)kRowsPerPass * row_stride;
  }

  // Rows [row0, row0 + ROWS); `offset` = row0 × row_stride; into the tile
  // the constructor's. Rows ≥ rows_valid are zero-filled
  // so that 0 × garbage can never turn into NaN in P·V.
  __device__ __forceinline__ void copy(int64_t offset, int row0, int rows_valid) const {
    const T* src = gmem + offset;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = row0 + row + i * kRowsPerPass < rows_valid;
      cp_async_16(smem + i * kRowsPerPass * D * 2, valid ? src : gmem, valid ? 16 : 0);
      src += pass_stride;
    }
  }
};

// A block's (batch, head) of Q and (batch, kv head) of K and V in global memory.
template <typename T>
struct HeadTensors {
  const T* const q;
  const T* const k;
  const T* const v;

  template <int BM, bool CAUSAL>
  __device__ __forceinline__ HeadTensors(const FlashParams& p, const PortableBlock<BM, CAUSAL>& blk)
      : q(static_cast<const T*>(p.q) + blk.b * p.q_batch_stride + blk.h * p.q_head_stride),
        k(static_cast<const T*>(p.k) + blk.b * p.k_batch_stride + blk.kvh * p.k_head_stride),
        v(static_cast<const T*>(p.v) + blk.b * p.v_batch_stride + blk.kvh * p.v_head_stride) {}
};

// A key group's loads: its Q tile and its K and V tiles. Rows past the sequence
// ends are zero-filled.
template <typename T, typename Cfg>
struct TileLoads {
  static constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, GT = Cfg::kGroupThreads;
  const FlashParams& p;
  T* const sq;
  const unsigned gtid;
  const T* const q;  // the (batch, head)'s Q
  const TileCopy<T, BN, D, GT> k_copy, v_copy;

  __device__ __forceinline__ TileLoads(const FlashParams& p, const KeyGroup<T, Cfg>& grp, const HeadTensors<T>& in)
      : p(p),
        sq(grp.q),
        gtid(grp.tid),
        q(in.q),
        k_copy(grp.k, in.k, p.k_row_stride, grp.tid),
        v_copy(grp.v, in.v, p.v_row_stride, grp.tid) {}

  // Query rows m0 … m0 + BM − 1.
  __device__ __forceinline__ void load_q(int m0) const {
    TileCopy<T, BM, D, GT>(sq, q, p.q_row_stride, gtid).copy((int64_t)m0 * p.q_row_stride, m0, p.seqlen_q);
  }
  // Keys n … n + BN − 1.
  __device__ __forceinline__ void load_k(int n) const { k_copy.copy((int64_t)n * p.k_row_stride, n, p.seqlen_k); }
  __device__ __forceinline__ void load_v(int n) const { v_copy.copy((int64_t)n * p.v_row_stride, n, p.seqlen_k); }
};

}  // namespace fa
