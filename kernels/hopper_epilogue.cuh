// The Hopper kernel's unsplit epilogue: a consumer warpgroup's O rows,
// normalised, go through its own rows of a Q-shaped tile in the same 128-byte
// swizzle, then out in 16-byte stores, a warp writing whole rows (stored straight
// from the accumulators, each warp instruction would write 4 bytes into each of 8
// rows). The tile is Q's own (free once the warpgroup's last Q·Kᵀ has landed; the
// other warpgroup may still read its own rows) except in persistent CTAs, whose
// producer may already be loading the next item's Q: they stage in the O tile,
// after a barrier that orders this item's writes after the previous item's reads.
#pragma once

#include "hopper.cuh"
#include "hopper_layout.cuh"
#include "hopper_scheduler.cuh"
#include "row_store.cuh"
#include "softmax.cuh"

namespace fa {

// Consumer warpgroup cw's 128 threads meet at its epilogue barrier.
template <typename Cfg>
__device__ __forceinline__ void consumer_sync(int cw) {
  if constexpr (Cfg::kConsumers == 1) {
    named_bar_sync<NamedBarrier::EpilogueWg0, 128>();  // a constant id: ptxas reserves 4 barriers, not 16
  } else {
    named_bar_sync(epilogue_of(cw), 128);
  }
}

// Item `it`'s rows of consumer warpgroup cw (this thread: rows 16·warp + g and
// + 8, columns 2t, 2t + 1 of each 8-wide accumulator tile) to p.o, and their
// log-sum-exp to p.lse where asked.
template <typename T, typename Cfg>
__device__ __forceinline__ void store_staged(const FlashParams& p, const HopperSmem<Cfg>& sm, const HopperItem& it,
                                             int cw, int warp, int g, int t, const float (&o)[Cfg::kHeadDim / 8][4],
                                             const SoftmaxState<1>& softmax) {
  constexpr int BM = Cfg::kBlockM, D = Cfg::kHeadDim, DT = D / 8;
  if constexpr (Cfg::kPersistent) consumer_sync<Cfg>(cw);
  const uint32_t rows =
      (Cfg::kPersistent ? sm.o : sm.q) + 64 * cw * 128;  // + panel × BM × 128 + row × 128 + chunk × 16
  auto chunk_addr = [&](int row, int chunk) {
    return rows + (chunk / 8) * BM * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
  };
  float inv[2], lse[2];
  softmax.finish_both(0, inv, lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * warp + g + 8 * r;  // within the warpgroup's 64
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const uint32_t v = Dtype<T>::pack(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(chunk_addr(row, dt) + 4 * t), "r"(v) : "memory");
    }
    const int grow = it.m0 + 64 * cw + row;
    if (p.lse != nullptr && t == 0 && row_stored(grow, p.seqlen_q))
      p.lse[((int64_t)it.b * p.heads + it.h) * p.seqlen_q + grow] = lse[r];
  }
  consumer_sync<Cfg>(cw);
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kRowsPerPass = 128 / kChunks;
  const int tid = threadIdx.x % 128, chunk = tid % kChunks;
  T* out = static_cast<T*>(p.o) + it.b * p.o_batch_stride + it.h * p.o_head_stride + chunk * 8;
#pragma unroll
  for (int r0 = 0; r0 < 64; r0 += kRowsPerPass) {
    const int row = r0 + tid / kChunks, grow = it.m0 + 64 * cw + row;
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(chunk_addr(row, chunk)));
    if (row_stored(grow, p.seqlen_q)) *reinterpret_cast<uint4*>(out + (int64_t)grow * p.o_row_stride) = v;
  }
}

}  // namespace fa
