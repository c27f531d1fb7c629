// Storing a thread's normalised accumulator rows: which rows are stored, and
// stores straight from the accumulators (both kernels' split partials).
#pragma once

#include "common.cuh"
#include "flash_params.h"
#include "softmax.cuh"

namespace fa {

// Whether a query row is stored: rows past seqlen_q are not, unless the planted
// FA_DEFECT_OOB_TAIL asks memcheck to catch the out-of-bounds write.
__device__ __forceinline__ bool row_stored(int row, int seqlen_q) {
#ifdef FA_DEFECT_OOB_TAIL
  return true;
#else
  return row < seqlen_q;
#endif
}

// Where a block's stored rows end: a dense batch's at seqlen_q, a sequence's
// where it says.
struct RowsToSeqlen {
  __device__ __forceinline__ int end(const FlashParams& p) const { return p.seqlen_q; }
};
struct RowsTo {
  int row_end;
  __device__ __forceinline__ int end(const FlashParams&) const { return row_end; }
};

// Normalises and writes rows row_lo and row_lo + 8 (tile mt of the softmax
// state) of (b, h) that lie before `rows.end(p)`: O in the input dtype and the
// natural-log LSE, or with several splits the fp32 partial and its LSE.
template <typename T, int D, int MT, typename Rows = RowsToSeqlen>
__device__ __forceinline__ void store_rows(const FlashParams& p, const float (&o)[D / 8][4],
                                           const SoftmaxState<MT>& softmax, int mt, int row_lo, int b, int h, int split,
                                           int t, Rows rows = {}) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float inv, lse;
    softmax.finish(mt, r, inv, lse);
    const int row = row_lo + 8 * r;
    if (!row_stored(row, rows.end(p))) continue;
    const int64_t bh_row = ((int64_t)b * p.heads + h) * p.seqlen_q + row;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)row * p.o_row_stride;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * t) = Dtype<T>::pack(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      }
      if (p.lse != nullptr && t == 0) p.lse[bh_row] = lse;
    } else {
      const int64_t part = (int64_t)split * p.batch * p.heads * p.seqlen_q + bh_row;
      float* out = p.o_partial + part * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<float2*>(out + dt * 8 + 2 * t) = make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      }
      if (t == 0) p.lse_partial[part] = lse;
    }
  }
}

}  // namespace fa
