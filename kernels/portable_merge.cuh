// The portable kernel's key-group merge (kKeyGroups = 2): the two groups of
// warps took alternate key tiles of the same rows; group 1 hands its O
// accumulators and softmax state over through shared memory, and group 0 folds
// them into its own like one more key tile.
#pragma once

#include "common.cuh"
#include "portable_layout.cuh"
#include "softmax.cuh"

namespace fa {

// The hand-over lies in the CTA's tiles, which neither group reads after the
// first barrier (at 32 keys per tile a group's own are too small for it).
template <typename Cfg>
struct KeyGroupMerge {
  static constexpr int MT = Cfg::kRowTiles, DT = Cfg::kHeadDim / 8, GT = Cfg::kGroupThreads;
  float* const hand;  // this thread's slots: slot i at hand[i·GT]

  // `gtid`: this thread's index in its key group.
  __device__ __forceinline__ KeyGroupMerge(unsigned char* smem_raw, unsigned gtid)
      : hand(reinterpret_cast<float*>(smem_raw) + gtid) {}

  __device__ __forceinline__ float& o_slot(int mt, int i) const { return hand[(mt * DT * 4 + i) * GT]; }
  __device__ __forceinline__ float& max_slot(int mt, int r) const { return hand[(MT * DT * 4 + 4 * mt + r) * GT]; }
  __device__ __forceinline__ float& sum_slot(int mt, int r) const { return hand[(MT * DT * 4 + 4 * mt + 2 + r) * GT]; }

  // Returns whether this thread goes on to the epilogue: group 0's, with the
  // merged O and state; group 1's are done once they have handed over. `mine`
  // and `theirs` get 2^(each side's max − the merged max) per row, the scales of
  // the two sides' O (the kernel's arrays: see flash_fwd).
  __device__ __forceinline__ bool run(int group, float (&o)[MT][DT][4], SoftmaxState<MT>& softmax, float (&mine)[MT][2],
                                      float (&theirs)[MT][2]) {
    __syncthreads();
    if (group == 1) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < DT * 4; ++i) o_slot(mt, i) = o[mt][i / 4][i % 4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          max_slot(mt, r) = softmax.row_max[mt][r];
          sum_slot(mt, r) = softmax.row_sum[mt][r];
        }
      }
    }
    __syncthreads();
    if (group == 1) return false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) softmax.merge(mt, r, max_slot(mt, r), sum_slot(mt, r), mine[mt][r], theirs[mt][r]);
#pragma unroll
      for (int i = 0; i < DT * 4; ++i) {
        const int r = (i % 4) / 2;  // elements 0, 1 are row g; 2, 3 row g + 8
        o[mt][i / 4][i % 4] = o[mt][i / 4][i % 4] * mine[mt][r] + o_slot(mt, i) * theirs[mt][r];
      }
    }
    return true;
  }
};

}  // namespace fa
