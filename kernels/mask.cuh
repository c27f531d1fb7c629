// Boundary masking of score accumulators (mma.sync C layout, which wgmma's
// accumulators share per warp): keys past the sequence end and, causal, right of
// the diagonal.
#pragma once

#include <math.h>

namespace fa {

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

// Scores of keys past each row's last visible key to −inf: this thread's rows
// g (s[·][0..1]) and g + 8 (s[·][2..3]) see keys up to last_lo and last_hi; keys
// n0 … n0 + 8·NT − 1. For rows whose limits are not a row index apart (the
// `_varlen` entries' packed query heads).
template <int NT>
__device__ __forceinline__ void mask_tile_to(float (&s)[NT][4], int n0, int t, int last_lo, int last_hi) {
  const int lo = last_lo - n0 - 2 * t, hi = last_hi - n0 - 2 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (nt * 8 + (e % 2) > (e < 2 ? lo : hi)) s[nt][e] = -INFINITY;
    }
  }
}

}  // namespace fa
