// What both kernels' e4m3 entries share: P's quantisation and key order in
// P·V, and the dequantisation factors.
//
// P enters P·V as e4m3 A fragments (mma.sync m16n8k32, wgmma k32): thread
// (g, t) supplies k = 4t … 4t+3 and 16+4t … 16+4t+3 of each 32-key step. P
// stays where the Q·Kᵀ accumulators hold it, so k = 4t + j of each 16-key half
// is key (2t, 2t+1, 8+2t, 9+2t)[j] of that half (pv_key), and V is read in
// that order: by the portable kernel as it loads fragments, by the Hopper
// kernel from a copy of V transposed in that order (transpose_v_e4m3).
#pragma once

#include "common.cuh"

namespace fa {

// P (p ≤ 1) is quantised as 2^8 · p, FA3's offset: e4m3 keeps 3 significand
// bits down to 2^-6, so p ≥ 2^-14 keeps them and p < 2^-18 flushes to 0 (about
// e^-12.5 below the row max), where unscaled p would lose them under 2^-6.
// (The Hopper kernel's offset is its operands' kLog2PScale: 6 where it keeps
// the row max.)
constexpr float kE4m3PScale = 256.f;

// The key of P·V's k index `k` within its 16-key half (0 … 15).
__host__ __device__ constexpr int pv_key(int k) { return 2 * (k / 4) + (k % 2) + 8 * ((k / 2) % 2); }
static_assert(pv_key(0) == 0 && pv_key(1) == 1 && pv_key(2) == 8 && pv_key(3) == 9 && pv_key(15) == 15,
              "thread t's k = 4t … 4t+3 are keys 2t, 2t+1, 8+2t, 9+2t");

// P of 32-key step kk as an e4m3 A fragment, times `scale` (2^8, or 1 where
// the softmax made them 2^8 · p): a0, a2 row g; a1, a3 row g + 8; a0, a1 the
// first 16 keys (8-key accumulator tiles 4kk, 4kk+1), a2, a3 the next.
template <int NT>
__device__ __forceinline__ void p_fragment_e4m3(uint32_t (&pf)[4], const float (&s)[NT][4], int kk,
                                                float scale = kE4m3PScale) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float(&lo)[4] = s[4 * kk + 2 * (i / 2)];
    const float(&hi)[4] = s[4 * kk + 2 * (i / 2) + 1];
    const int r = 2 * (i % 2);
    pf[i] = pack_e4m3x4(lo[r] * scale, lo[r + 1] * scale, hi[r] * scale, hi[r + 1] * scale);
  }
}

// Whether no value of P's e4m3 fragments reached 448 (0x7e: a p saturated, or
// rounded up to the largest finite value) or is NaN (0x7f). P holds no sign
// bits (p ≥ 0), so adding 2 to each byte carries into no other and sets bit 7
// exactly where a byte is 0x7e or more.
template <int N>
__device__ __forceinline__ bool p_unsaturated(const uint32_t (&pf)[N][4]) {
  uint32_t any = 0;
#pragma unroll
  for (int kk = 0; kk < N; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) any |= pf[kk][i] + 0x02020202u;
  }
  return (any & 0x80808080u) == 0;
}

// The dequantisation factors of one (batch, K/V head), at index i of the
// [B, Hkv] arrays; 1 where an array is not given. qk joins the softmax scale,
// v scales O (the portable kernel's with P's 2^-8 offset besides; the Hopper
// kernel's offset lives in the row max, so O / l cancels it).
struct Fp8Descale {
  float qk, v;
  __device__ __forceinline__ Fp8Descale(const float* q, const float* k, const float* vd, int i) {
    qk = (q != nullptr ? q[i] : 1.f) * (k != nullptr ? k[i] : 1.f);
#ifdef FA_PLANT_E4M3_DESCALE
    v = 1.f;  // planted: v_descale dropped
#else
    v = vd != nullptr ? vd[i] : 1.f;
#endif
  }
};

}  // namespace fa
