// Masks and score modifiers, the parts that decide which scores a row keeps and
// what they are before the softmax. The mainloops take both as types: a new mask
// (or modifier) is a new type, not a branch in a mainloop.
//
// A mask policy bounds the keys a query row sees beyond the sequence end, as
// FlashAttention's `window_size = (left, right)`, bottom-right aligned like
// causal: row i sees keys j with i + lo <= j <= i + hi, lo = diag − left and
// hi = diag + right, diag = seqlen_k − seqlen_q.
//   NoMask      every key
//   CausalMask  window (∞, 0): hi = diag, a compile-time right of 0
//   LocalMask   window (left, right), both from FlashParams, which kernel-ffi
//               clamps so that no bound overflows (left ≤ seqlen_k, right ≤ seqlen_q)
// kEnd: the policy bounds a row's last key; kBegin: its first. The scheduler
// and planner take a block's key range from them (tiles outside every row's
// band are never loaded), mask_tile masks the band's edges exactly.
//
// Accumulators are in the mma.sync C layout, which wgmma's share per warp.
#pragma once

#include <math.h>

#include "flash_params.h"

namespace fa {

// FA_PLANT_MASK_OFF_BY_ONE (proving fa-test's tolerances): causal rows see one key more.
#ifdef FA_PLANT_MASK_OFF_BY_ONE
inline constexpr int kPlantedExtraKey = 1;
#else
inline constexpr int kPlantedExtraKey = 0;
#endif

template <bool END, bool BEGIN>
struct KeyBand {
  static constexpr bool kEnd = END, kBegin = BEGIN;
  int lo, hi;  // row i sees keys i + lo … i + hi (each where the policy bounds it)

  KeyBand() = default;
  __device__ __forceinline__ KeyBand(const FlashParams& p, int diag)
      : lo(diag - p.window_left), hi(BEGIN ? diag + p.window_right : diag + kPlantedExtraKey) {}

  // One past the last key rows up to `last_row` see (kEnd).
  __device__ __forceinline__ int end_after(int last_row) const { return last_row + 1 + hi; }
  // The first key row `first_row` sees (kBegin); rows after it see none before.
  __device__ __forceinline__ int first_key(int first_row) const { return first_row + lo; }

  // Keys [begin, end) of a split, narrowed to those rows first_row … last_row
  // see: the end past the last row's last key, the beginning at the key tile
  // (BN keys) of the first row's first key, so that no tile reaches into
  // another split. Every scheduler's key range.
  template <int BN>
  __device__ __forceinline__ void clip(int first_row, int last_row, int& begin, int& end) const {
    if (END) end = min(end, end_after(last_row));
    if (BEGIN) begin = max(begin, max(first_key(first_row), 0) / BN * BN);
  }
};
using NoMask = KeyBand<false, false>;
using CausalMask = KeyBand<true, false>;
using LocalMask = KeyBand<true, true>;

// Score modifiers, applied to a tile's raw scores q·k before masking; the
// softmax then scales what they return by FlashParams::scale_log2.
//   NoSoftcap  the raw score (scale_log2 = softmax scale × log2 e)
//   Softcap    Gemma 2's logit softcapping, c · tanh(score · scale / c): the tile
//              becomes tanh(score · softcap_pre), softcap_pre = scale / c, and
//              kernel-ffi passes scale_log2 = c × log2 e. tanh.approx's relative
//              error (2^−11) is a relative error in the capped score, so at most
//              about |score · scale| × 5e−4 absolute: below bf16's rounding of P
//              for scores within the cap.
struct NoSoftcap {
  __device__ __forceinline__ explicit NoSoftcap(const FlashParams&) {}
  template <int NT>
  __device__ __forceinline__ void apply(float (&)[NT][4]) const {}
};
struct Softcap {
  float pre;
  __device__ __forceinline__ explicit Softcap(const FlashParams& p) : pre(p.softcap_pre) {}
  template <int NT>
  __device__ __forceinline__ void apply(float (&s)[NT][4]) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) asm("tanh.approx.f32 %0, %1;" : "=f"(s[nt][e]) : "f"(s[nt][e] * pre));
    }
  }
};

// Scores outside the mask to −inf: keys past the sequence end and outside each
// row's band. Rows row_lo and row_lo + 8; keys n0 … n0 + 8·NT − 1. Only tiles
// that cross the sequence end, or a band edge of some row of the block (the end
// from `first_row` on; the beginning: this thread's rows), get the per-element
// test; the others (all but one or two per row block) return at once.
template <typename Mask, int NT>
__device__ __forceinline__ void mask_tile(float (&s)[NT][4], int n0, int first_row, int row_lo, int t, int seqlen_k,
                                          const Mask& m) {
  const bool tail = n0 + 8 * NT > seqlen_k;
  const bool crosses =
      (Mask::kEnd && n0 + 8 * NT - 1 > first_row + m.hi) || (Mask::kBegin && n0 < m.first_key(row_lo + 8));
  if (!tail && !crosses) return;
  // Limits relative to this thread's first key, so that the loop compares
  // compile-time offsets against a few values.
  const int end = seqlen_k - n0 - 2 * t, last = row_lo + m.hi - n0 - 2 * t, first = row_lo + m.lo - n0 - 2 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = nt * 8 + (e % 2);
      if (key >= end || (Mask::kEnd && key > last + (e / 2) * 8) || (Mask::kBegin && key < first + (e / 2) * 8))
        s[nt][e] = -INFINITY;
    }
  }
}

// Scores of keys outside each row's keys to −inf: this thread's rows g
// (s[·][0..1]) and g + 8 (s[·][2..3]) see keys up to last_lo and last_hi, and
// (BEGIN) from first_lo and first_hi; keys n0 … n0 + 8·NT − 1. For rows whose
// limits are not a row index apart (the `_varlen` entries' packed query heads).
template <bool BEGIN, int NT>
__device__ __forceinline__ void mask_tile_rows(float (&s)[NT][4], int n0, int t, int first_lo, int first_hi,
                                               int last_lo, int last_hi) {
  const int f0 = first_lo - n0 - 2 * t, f1 = first_hi - n0 - 2 * t;
  const int lo = last_lo - n0 - 2 * t, hi = last_hi - n0 - 2 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = nt * 8 + (e % 2);
      if (key > (e < 2 ? lo : hi) || (BEGIN && key < (e < 2 ? f0 : f1))) s[nt][e] = -INFINITY;
    }
  }
}

}  // namespace fa

// One entry per mask policy and score modifier: ENTRY(T, D, MASK, MOD, NAME)
// with NAME suffixed as kernel-ffi names them (`Scores::suffix`).
#define FA_ENTRIES_EVERY_SCORES(ENTRY, T, D, NAME)        \
  ENTRY(T, D, NoMask, NoSoftcap, NAME)                    \
  ENTRY(T, D, CausalMask, NoSoftcap, NAME##_causal)       \
  ENTRY(T, D, LocalMask, NoSoftcap, NAME##_local)         \
  ENTRY(T, D, NoMask, Softcap, NAME##_softcap)            \
  ENTRY(T, D, CausalMask, Softcap, NAME##_causal_softcap) \
  ENTRY(T, D, LocalMask, Softcap, NAME##_local_softcap)
