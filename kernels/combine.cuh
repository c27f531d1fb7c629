// The split-KV combine kernel: merges the fp32 partial outputs and their LSE,
// written by either forward kernel with num_splits > 1, into O and the LSE.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "flash_params.h"
#include "softmax.cuh"

namespace fa {

// Whether some sequence covers row `t` of the packed queries, as the forward
// kernel's SeqInfo reads cu_seqlens_q.
__device__ __forceinline__ bool covered(const CombineParams& p, int t) {
  auto start = [&](int s) { return min(max(p.cu_seqlens_q[s], 0), p.seqlen_q); };
  int lo = 0, hi = p.seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start(mid) <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int first = start(lo), len = min(min(max(p.cu_seqlens_q[lo + 1], first), p.seqlen_q) - first, p.max_seqlen_q);
  return t >= first && t < first + len;
}

// Merges split partials by log-sum-exp: O = Σ_s w_s·O_s / Σ_s w_s with
// w_s = exp(lse_s − max_s lse_s), online over the splits. One warp per row; each
// of its first kLanes lanes owns kPerLane columns (2, 4 or 8: the fewest that
// leave no more than 32 lanes; D=96 and 192 leave 8 idle), one 8-, 16- or
// 32-byte load per split. Four splits' loads
// are in flight at once (indices clamped, weights of the extra ones 0): a pass
// for the maximum and a second for the sum cost two L2 round trips per split.
//
// VARLEN (packed queries): only rows some sequence covers were written; the
// others are left alone (SeqInfo's clamping, and a binary search for the last
// sequence starting at or before the row).
template <typename T, int D, bool VARLEN = false>
__device__ __forceinline__ void flash_combine(const CombineParams& p) {
  constexpr int kPerLane = D <= 64 ? 2 : D <= 128 ? 4 : 8, kLanes = D / kPerLane;
  static_assert(D % kPerLane == 0 && kLanes <= 32, "a float2, float4 or two float4 per lane");
  struct alignas(16) Float8 {
    float4 lo, hi;
  };
  using Vec = std::conditional_t<kPerLane == 8, Float8, std::conditional_t<kPerLane == 4, float4, float2>>;
  constexpr int kBatch = 4;
  const int64_t rows = (int64_t)p.batch * p.heads * p.seqlen_q;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  wait_for_prerequisites();  // the forward grid's partials
  if (lane >= kLanes) return;
  if constexpr (VARLEN) {
    if (!covered(p, (int)(row % p.seqlen_q))) return;
  }
  float acc[kPerLane] = {};
  float mx = -INFINITY, total = 0.f;
  for (int s0 = 0; s0 < p.num_splits; s0 += kBatch) {
    float l[kBatch];
    Vec x[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t part = (int64_t)min(s0 + j, p.num_splits - 1) * rows + row;
      l[j] = p.lse_partial[part];
      x[j] = *reinterpret_cast<const Vec*>(p.o_partial + part * D + lane * kPerLane);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float lj = s0 + j < p.num_splits ? l[j] : -INFINITY;  // a split that saw no key: −inf too
      const float nm = fmaxf(mx, lj), base = exp_base(nm);
      const float a = __expf(mx - base), w = __expf(lj - base);
      const float* xv = reinterpret_cast<const float*>(&x[j]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] = acc[i] * a + w * xv[i];
      total = total * a + w;
      mx = nm;
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;  // no split saw a key: zeros, LSE −inf
  const int qrow = row % p.seqlen_q, bh = row / p.seqlen_q;
  const int b = bh / p.heads, h = bh % p.heads;
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)qrow * p.o_row_stride +
           lane * kPerLane;
  uint32_t packed[kPerLane / 2];
#pragma unroll
  for (int i = 0; i < kPerLane / 2; ++i) packed[i] = Dtype<T>::pack(acc[2 * i] * inv, acc[2 * i + 1] * inv);
  if constexpr (kPerLane == 8) {
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else if constexpr (kPerLane == 4) {
    *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<uint32_t*>(out) = packed[0];
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = total > 0.f ? mx + __logf(total) : -INFINITY;
}

}  // namespace fa

// The combine entries of one dtype, launched with 128 threads (four rows per
// block): flash_combine[_varlen]_<dtype>_d<D>, dense and varlen, every head dim.
#define FA_COMBINE_ENTRY(T, D, VARLEN, NAME)                                          \
  extern "C" __global__ void __launch_bounds__(128) NAME(const fa::CombineParams p) { \
    fa::flash_combine<T, D, VARLEN>(p);                                               \
  }
#define FA_COMBINE_ENTRIES_D(T, DT, D)                     \
  FA_COMBINE_ENTRY(T, D, false, flash_combine_##DT##_d##D) \
  FA_COMBINE_ENTRY(T, D, true, flash_combine_varlen_##DT##_d##D)
#define FA_COMBINE_ENTRIES(T, DT) FA_EVERY_HEAD_DIM(FA_COMBINE_ENTRIES_D, T, DT)
