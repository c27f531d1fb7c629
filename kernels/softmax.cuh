// The per-row arithmetic both forward kernels share: boundary masking, the
// online softmax in the exp2 domain, and the epilogue. Accumulators are in the
// mma.sync C layout (g = lane/4, t = lane%4): s[j][0..1] are row g, columns
// 8j+2t, 8j+2t+1; s[j][2..3] the same columns of row g+8. wgmma's accumulators
// use the same layout per warp, so the Hopper kernel calls these unchanged.
#pragma once

#include "common.cuh"
#include "flash_params.h"

namespace fa {

// exp2 on the SFU; ex2.approx(-inf) = +0, which is what masked scores need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scores of keys past the sequence end, or (causal) right of the diagonal, to
// −inf. Rows row_lo and row_lo + 8; keys n0 … n0 + 8·NT − 1. Only tiles that cross
// the sequence end or the diagonal of some row ≥ first_row get the per-element
// test; the others (all but one or two per row block) return at once.
template <bool CAUSAL, int NT>
__device__ __forceinline__ void mask_tile(float (&s)[NT][4], int n0, int first_row, int row_lo, int t, int seqlen_k,
                                          int diag) {
  const bool tail = n0 + 8 * NT > seqlen_k;
  const bool crosses = CAUSAL && n0 + 8 * NT - 1 > first_row + diag;
  if (!tail && !crosses) return;
  // Limits relative to this thread's first key, so that the loop compares
  // compile-time offsets against two values.
  const int end = seqlen_k - n0 - 2 * t, last = row_lo + diag - n0 - 2 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = nt * 8 + (e % 2);
      if (key >= end || (CAUSAL && key > last + (e / 2) * 8)) s[nt][e] = -INFINITY;
    }
  }
}

// The max a row's scores are shifted by: a row that has seen only masked keys
// keeps max −inf; shift by 0 instead, so that −inf − (−inf) never makes a NaN.
__device__ __forceinline__ float exp_base(float row_max) { return row_max == -INFINITY ? 0.f : row_max; }

// Row r (0: g, 1: g + 8) of one key tile, in two steps. The max step advances
// the running max and `correction` = 2^(old max − new max), by which O and the
// partial sum must be rescaled, and returns the shift of the row's exponentials;
// the exp step turns s into p = 2^(s·scale·log2e − shift) in place and advances
// the partial sum.
template <int NT>
__device__ __forceinline__ float row_max_step(const float (&s)[NT][4], int r, float (&row_max)[2],
                                              float (&correction)[2], float scale_log2) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
  mx = quad_max(mx) * scale_log2;
  const float new_max = fmaxf(row_max[r], mx);
  const float base = exp_base(new_max);
  correction[r] = fast_exp2(row_max[r] - base);
  row_max[r] = new_max;
  return base;
}
template <int NT>
__device__ __forceinline__ void row_exp_step(float (&s)[NT][4], int r, float base, float (&row_sum)[2],
                                             const float (&correction)[2], float scale_log2) {
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], scale_log2, -base));
    s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], scale_log2, -base));
    sum += s[nt][2 * r] + s[nt][2 * r + 1];
  }
  row_sum[r] = row_sum[r] * correction[r] + sum;
}

// One key tile of the online softmax, without touching O: s becomes
// p = 2^(s·scale·log2e − max) in place, the running max / partial sums of rows g
// and g+8 advance, and `correction` gets 2^(old max − new max), by which O must
// be rescaled before this tile's P·V is added (the Hopper kernel does that once
// the previous tile's asynchronous P·V has landed).
template <int NT>
__device__ __forceinline__ void softmax_rows(float (&s)[NT][4], float (&row_max)[2], float (&row_sum)[2],
                                             float (&correction)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row_exp_step(s, r, row_max_step(s, r, row_max, correction, scale_log2), row_sum, correction, scale_log2);
}

// The same in two halves, so that a kernel can take turns on the SFU between
// them: both rows' max steps, then (softmax_exp_pack) both rows' exponentials, a
// 16-key chunk at a time, each pair summed and packed into P as it lands (the
// sums of row_exp_step, in the same order), which spreads the exponentials among
// the other instructions instead of bunching them behind them.
template <int NT>
__device__ __forceinline__ void softmax_max(const float (&s)[NT][4], float (&row_max)[2], float (&correction)[2],
                                            float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) row_max_step(s, r, row_max, correction, scale_log2);
}
template <typename T, int NT>
__device__ __forceinline__ void softmax_exp_pack(const float (&s)[NT][4], const float (&row_max)[2],
                                                 float (&row_sum)[2], const float (&correction)[2], float scale_log2,
                                                 uint32_t (&pf)[NT / 2][4]) {
  const float base[2] = {exp_base(row_max[0]), exp_base(row_max[1])};
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float* x = &s[2 * kk + half][2 * r];
        const float a = fast_exp2(fmaf(x[0], scale_log2, -base[r])), b = fast_exp2(fmaf(x[1], scale_log2, -base[r]));
        sum[r] += a + b;
        pf[kk][2 * half + r] = Dtype<T>::pack(a, b);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * correction[r] + sum[r];
}

template <int DT>
__device__ __forceinline__ void rescale(float (&o)[DT][4], const float (&correction)[2]) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= correction[0];
    o[dt][1] *= correction[0];
    o[dt][2] *= correction[1];
    o[dt][3] *= correction[1];
  }
}

// Both at once, for a kernel whose P·V is synchronous.
template <int NT, int DT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&o)[DT][4], float (&row_max)[2],
                                             float (&row_sum)[2], float scale_log2) {
  float correction[2];
  softmax_rows(s, row_max, row_sum, correction, scale_log2);
  rescale(o, correction);
}

// P of key columns 16kk..16kk+15 as an m16n8k16 A fragment: the accumulators of
// 8-key tiles 2kk and 2kk+1 are exactly that layout, converted to 16 bits.
template <typename T, int NT>
__device__ __forceinline__ void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
  pf[0] = Dtype<T>::pack(s[2 * kk][0], s[2 * kk][1]);
  pf[1] = Dtype<T>::pack(s[2 * kk][2], s[2 * kk][3]);
  pf[2] = Dtype<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pf[3] = Dtype<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Whether a query row is stored: rows past seqlen_q are not, unless the planted
// FA_DEFECT_OOB_TAIL asks memcheck to catch the out-of-bounds write.
__device__ __forceinline__ bool row_stored(int row, int seqlen_q) {
#ifdef FA_DEFECT_OOB_TAIL
  return true;
#else
  return row < seqlen_q;
#endif
}

// The normaliser 1/l of row r (g or g + 8) of this thread's quad and its
// natural-log LSE; a row that saw no key gets 0 (its output is zeros) and −inf.
__device__ __forceinline__ void row_finish(const float (&row_max)[2], const float (&row_sum)[2], int r, float& inv,
                                           float& lse) {
  const float l = quad_sum(row_sum[r]);
  inv = l > 0.f ? 1.f / l : 0.f;
  lse = l > 0.f ? (row_max[r] + __log2f(l)) * 0.69314718056f : -INFINITY;
}

// Normalises and writes rows row_lo and row_lo + 8: O in the input dtype and the
// natural-log LSE, or with several splits the fp32 partial and its LSE.
template <typename T, int D>
__device__ __forceinline__ void store_rows(const FlashParams& p, const float (&o)[D / 8][4], const float (&row_max)[2],
                                           const float (&row_sum)[2], int row_lo, int b, int h, int split, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float inv, lse;
    row_finish(row_max, row_sum, r, inv, lse);
    const int row = row_lo + 8 * r;
    if (!row_stored(row, p.seqlen_q)) continue;
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
