// The online softmax in the exp2 domain, which both forward kernels share.
// Accumulators are in the mma.sync C layout (g = lane/4, t = lane%4): s[j][0..1]
// are row g, columns 8j+2t, 8j+2t+1; s[j][2..3] the same columns of row g+8.
// wgmma's accumulators use the same layout per warp, so the Hopper kernel calls
// these unchanged.
#pragma once

#include "common.cuh"

namespace fa {

// exp2 on the SFU; ex2.approx(-inf) = +0, which is what masked scores need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The max a row's scores are shifted by: a row that has seen only masked keys
// keeps max −inf; shift by 0 instead, so that −inf − (−inf) never makes a NaN.
__device__ __forceinline__ float exp_base(float row_max) { return row_max == -INFINITY ? 0.f : row_max; }

// The online-softmax state of this thread's rows in MT 16-row accumulator tiles
// (two per tile, r = 0: g, 1: g + 8), and its operations per key tile. An update
// also gives the correction 2^(old max − new max) of each row, by which O must be
// rescaled before the tile's P·V is added; a kernel whose P·V is asynchronous
// keeps it until that P·V has landed (rescale). The correction is the caller's
// array, not a member, and the members are in this order, because either change
// alters the order of ptxas's register assignment, and so the SASS (a member
// correction: the portable kernel's; the other order: both kernels').
template <int MT>
struct SoftmaxState {
  float row_sum[MT][2];  // this thread's partial sums (a quad's four add up in finish)
  float row_max[MT][2];  // running max, in scaled log2 units

  __device__ __forceinline__ void reset(int mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  // Row r of tile mt for one key tile, in two steps. The max step advances the
  // running max and the correction, by which the partial sum must be rescaled
  // too, and returns the shift of the row's exponentials; the exp step turns s
  // into p = 2^(s·scale·log2e − shift) in place and advances the partial sum.
  // OFFSET (log2 units): the running max is kept OFFSET below the scores' own,
  // so p and the sums come out 2^OFFSET times theirs (and the LSE, the max plus
  // log2 of the sum, is unchanged).
  template <int OFFSET = 0, int NT>
  __device__ __forceinline__ float max_step(int mt, const float (&s)[NT][4], int r, float (&correction)[2],
                                            float scale_log2) {
    float mx = tile_max(s, r, scale_log2);
    if constexpr (OFFSET != 0) mx -= OFFSET;
    const float new_max = fmaxf(row_max[mt][r], mx);
    const float base = exp_base(new_max);
    correction[r] = fast_exp2(row_max[mt][r] - base);
    row_max[mt][r] = new_max;
    return base;
  }
  template <int NT>
  __device__ __forceinline__ void exp_step(int mt, float (&s)[NT][4], int r, float base, const float (&correction)[2],
                                           float scale_log2) {
    row_sum[mt][r] = row_sum[mt][r] * correction[r] + exp_row(s, r, base, scale_log2);
  }
  // Row r's max over this key tile, in scaled log2 units.
  template <int NT>
  __device__ __forceinline__ static float tile_max(const float (&s)[NT][4], int r, float scale_log2) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    return quad_max(mx) * scale_log2;
  }
  // An item's first key tile's row max, straight after reset, as the kept max
  // (update_kept, or exp_pack then commit_kept): the tile's own p are then at
  // most 1, so it always fits, and its exponentials run every later tile's code.
  template <int NT>
  __device__ __forceinline__ void first_max(int mt, const float (&s)[NT][4], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) row_max[mt][r] = tile_max(s, r, scale_log2);
  }
  // Row r's scores to p = 2^(s·scale·log2e − base) in place; returns their sum.
  template <int NT>
  __device__ __forceinline__ static float exp_row(float (&s)[NT][4], int r, float base, float scale_log2) {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], scale_log2, -base));
      s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], scale_log2, -base));
      sum += s[nt][2 * r] + s[nt][2 * r + 1];
    }
    return sum;
  }

  // Tile mt's scores s of one key tile, without touching O: s becomes
  // p = 2^(s·scale·log2e − max + OFFSET) in place (max_step), and the running
  // max and partial sums advance.
  template <int OFFSET = 0, int NT>
  __device__ __forceinline__ void update(int mt, float (&s)[NT][4], float (&correction)[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      exp_step(mt, s, r, max_step<OFFSET>(mt, s, r, correction, scale_log2), correction, scale_log2);
  }

  // Tile mt's scores against the max kept from earlier tiles, without waiting for
  // the tile's own row max (its reduction and shuffles were the softmax's longest
  // dependency chain): s becomes p = 2^(s·scale·log2e − row_max) in place. The
  // max stays put, so O needs no rescale. Returns whether every partial row sum
  // of the warp is at most kHeadroom, so that every p is too (f16 holds it),
  // and only then advances the sums; else the caller redoes the tile exactly
  // with update. An item's first key tile must be exact: every mask here keeps
  // a prefix of an item's keys (causal, sequence end), so a row that sees any
  // key sees that tile, and its max, a real score, keeps the row a sum when a
  // later tile's p underflow. A mask that drops a row's leading keys
  // (LocalMask) breaks that: its callers take the exact update while any row of
  // the warp has seen no key (any_unseen).
  static constexpr float kHeadroom = 32768.f;
  template <int NT>
  __device__ __forceinline__ bool update_kept(int mt, float (&s)[NT][4], float scale_log2) {
    float sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) sum[r] = exp_row(s, r, exp_base(row_max[mt][r]), scale_log2);
    return commit_kept(mt, sum);
  }
  // Whether any row of tile mt, in any lane of the warp, has seen no key yet.
  __device__ __forceinline__ bool any_unseen(int mt) const {
    return __any_sync(0xffffffffu, row_max[mt][0] == -INFINITY || row_max[mt][1] == -INFINITY);
  }
  // The warp's verdict on a kept-max tile, and its sums where it holds. A row
  // that had seen only masked keys was shifted by 0 (exp_base): its max now.
  __device__ __forceinline__ bool commit_kept(int mt, const float (&sum)[2]) {
    return commit_kept_if(mt, sum, !(sum[0] > kHeadroom) && !(sum[1] > kHeadroom));
  }
  // The same with this thread's own verdict, where p have a bound other than
  // their sums' (e4m3's: p_unsaturated).
  __device__ __forceinline__ bool commit_kept_if(int mt, const float (&sum)[2], bool mine) {
    const bool fits = __all_sync(0xffffffffu, mine);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = fits ? exp_base(row_max[mt][r]) : row_max[mt][r];
      row_sum[mt][r] += fits ? sum[r] : 0.f;
    }
    return fits;
  }

  // The same in two halves, so that a kernel can take turns on the SFU between
  // them: both rows' max steps, then (update_exp_pack) both rows' exponentials, a
  // 16-key chunk at a time, each pair summed and packed into P as it lands (the
  // sums of exp_step, in the same order), which spreads the exponentials among
  // the other instructions instead of bunching them behind them.
  template <int NT>
  __device__ __forceinline__ void update_max(int mt, const float (&s)[NT][4], float (&correction)[2],
                                             float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) max_step(mt, s, r, correction, scale_log2);
  }
  template <typename T, int NT>
  __device__ __forceinline__ void update_exp_pack(int mt, const float (&s)[NT][4], const float (&correction)[2],
                                                  float scale_log2, uint32_t (&pf)[NT / 2][4]) {
    float sum[2];
    exp_pack<T>(mt, s, scale_log2, pf, sum);
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[mt][r] = row_sum[mt][r] * correction[r] + sum[r];
  }
  // Both rows' exponentials against the running (or kept) max, a 16-key chunk at
  // a time, each pair summed and packed into P as it lands. s is left as it was,
  // so a kept-max tile that commit_kept turns down is redone from it.
  template <typename T, int NT>
  __device__ __forceinline__ void exp_pack(int mt, const float (&s)[NT][4], float scale_log2, uint32_t (&pf)[NT / 2][4],
                                           float (&sum)[2]) const {
    const float base[2] = {exp_base(row_max[mt][0]), exp_base(row_max[mt][1])};
    sum[0] = sum[1] = 0.f;
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
  }

  // O's two rows by an update's correction.
  template <int DT>
  __device__ __forceinline__ static void rescale(float (&o)[DT][4], const float (&correction)[2]) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= correction[0];
      o[dt][1] *= correction[0];
      o[dt][2] *= correction[1];
      o[dt][3] *= correction[1];
    }
  }

  // Both at once, for a kernel whose P·V is synchronous: tile mt's O is rescaled
  // right away.
  template <int NT, int DT>
  __device__ __forceinline__ void step(int mt, float (&s)[NT][4], float (&o)[DT][4], float scale_log2) {
    float correction[2];
    update(mt, s, correction, scale_log2);
#ifndef FA_PLANT_NO_RESCALE
    rescale(o, correction);
#endif
  }

  // Folds another thread's state of row r of tile mt (max, partial sum) into
  // this one, as if its keys were one more key tile: both maxima to the larger.
  // `mine` and `theirs` get 2^(each max − new max), by which each side's O is
  // scaled before they are added. `other_sum` by reference: it is read after the
  // exponentials (by value, its load moves ahead of them and the SASS changes).
  __device__ __forceinline__ void merge(int mt, int r, float other_max, const float& other_sum, float& mine,
                                        float& theirs) {
    const float new_max = fmaxf(row_max[mt][r], other_max);
    const float base = exp_base(new_max);
    mine = fast_exp2(row_max[mt][r] - base);
    theirs = fast_exp2(other_max - base);
    row_max[mt][r] = new_max;
    row_sum[mt][r] = row_sum[mt][r] * mine + other_sum * theirs;
  }

  // The normaliser 1/l of row r of tile mt (the quad's sum) and its natural-log
  // LSE; a row that saw no key gets 0 (its output is zeros) and −inf.
  __device__ __forceinline__ void finish(int mt, int r, float& inv, float& lse) const {
    const float l = quad_sum(row_sum[mt][r]);
    inv = l > 0.f ? 1.f / l : 0.f;
    lse = l > 0.f ? (row_max[mt][r] + __log2f(l)) * 0.69314718056f : -INFINITY;
  }

  // finish for both rows of tile mt at once and branch-free, as the Hopper
  // kernel's unsplit epilogue takes it: both quad sums, then the SFU's
  // reciprocal and logarithm, taken unconditionally and selected. Within an ulp
  // of finish's, far below the output's rounding (l is 0 or about 1 and up:
  // the row max's own term); finish's division and guarded logarithm put a
  // refinement and a branch between the rows. (As finish, the portable D=128
  // causal entry spilled on sm_90.)
  __device__ __forceinline__ void finish_both(int mt, float (&inv)[2], float (&lse)[2]) const {
    float l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = quad_sum(row_sum[mt][r]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float rcp, lg;
      asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rcp) : "f"(l[r]));
      asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(l[r]));
      inv[r] = l[r] > 0.f ? rcp : 0.f;
      lse[r] = l[r] > 0.f ? (row_max[mt][r] + lg) * 0.69314718056f : -INFINITY;
    }
  }
};

// P of key columns 16kk..16kk+15 as an m16n8k16 A fragment: the accumulators of
// 8-key tiles 2kk and 2kk+1 are exactly that layout, converted to 16 bits.
template <typename T, int NT>
__device__ __forceinline__ void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
  pf[0] = Dtype<T>::pack(s[2 * kk][0], s[2 * kk][1]);
  pf[1] = Dtype<T>::pack(s[2 * kk][2], s[2 * kk][3]);
  pf[2] = Dtype<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pf[3] = Dtype<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

}  // namespace fa
