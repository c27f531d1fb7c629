// The Hopper kernel's unsplit epilogue: a consumer warpgroup's O rows,
// normalised, go through its own rows of a Q-shaped tile in the same swizzle,
// then out by one TMA store per panel, which one thread
// issues and nobody waits for (stored straight from the accumulators, each warp
// instruction would write 4 bytes into each of 8 rows; copied out by the
// warpgroup in 16-byte loads and stores, the warps wait on shared-memory
// latency). The TMA store clips rows past seqlen_q. The tile is Q's own (free
// once the warpgroup's last Q·Kᵀ has landed; the other warpgroup may still read
// its own rows) except in persistent CTAs, whose producer may already be loading
// the next item's Q, and e4m3 ones, whose Q tile is half O's size: they stage in
// the O tile (kOStaged), persistent ones after a barrier that orders this
// item's writes after the previous item's store has read it.
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

// The thread of consumer warpgroup cw that issues its O stores.
__device__ __forceinline__ bool o_store_issuer() { return threadIdx.x % 128 == 0; }

// Item `it`'s rows of consumer warpgroup cw (this thread: rows 16·warp + g and
// + 8, columns 2t, 2t + 1 of each 8-wide accumulator tile) to O through o_map,
// and their log-sum-exp to p.lse where asked. Before the CTA exits, the issuing
// thread waits for its stores to have read shared memory (o_store_drain).
template <typename T, typename Cfg>
__device__ __forceinline__ void store_staged(const FlashParams& p, const TmaDesc& o_map, const HopperSmem<Cfg>& sm,
                                             const HopperItem& it, int cw, int warp, int g, int t,
                                             const float (&o)[Cfg::kHeadDim / 8][4], const SoftmaxState<1>& softmax) {
  constexpr int BM = Cfg::kBlockM, DT = Cfg::kHeadDim / 8, PB = Cfg::kOutPanelBytes, CP = PB / 16;
  if constexpr (Cfg::kPersistent) {
    if (o_store_issuer()) tma_store_wait_read();  // the previous item's rows are out of the tile
    consumer_sync<Cfg>(cw);
  }
  const uint32_t rows = (Cfg::kOStaged ? sm.o : sm.q) + 64 * cw * PB;  // + panel × BM × PB + row × PB + chunk × 16
  auto chunk_addr = [&](int row, int chunk) {                          // CP chunks a panel row
    return rows + (chunk / CP) * BM * PB + row * PB + panel_chunk<Cfg::kOutPanelCols>(row, chunk % CP) * 16;
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
  fence_async_smem();
  consumer_sync<Cfg>(cw);
  if (o_store_issuer()) {
#pragma unroll
    for (int panel = 0; panel < Cfg::kOutPanels; ++panel)
      tma_store_4d(&o_map, rows + panel * BM * PB, panel * Cfg::kOutPanelCols, it.m0 + 64 * cw, it.h, it.b);
    tma_store_commit();
  }
}

// Item `it`'s rows of consumer warpgroup cw (this thread's: row_lo and
// row_lo + 8): unsplit through shared memory and TMA (store_staged), split as
// the fp32 partials straight from the accumulators.
template <typename T, typename Cfg>
__device__ __forceinline__ void store_item(const FlashParams& p, const TmaDesc& o_map, const HopperSmem<Cfg>& sm,
                                           const HopperItem& it, int cw, int warp, int g, int t, int row_lo,
                                           const float (&o)[Cfg::kHeadDim / 8][4], const SoftmaxState<1>& softmax) {
  if (p.num_splits == 1) {
    store_staged<T, Cfg>(p, o_map, sm, it, cw, warp, g, t, o, softmax);
  } else {
    store_rows<T, Cfg::kHeadDim>(p, o, softmax, 0, row_lo, it.b, it.h, it.split, t);
  }
}

// A serving item's rows, straight from the accumulators up to its sequence's
// end: a TMA store of the tile would write over the next sequence's rows.
template <typename T, typename Cfg>
__device__ __forceinline__ void store_item(const FlashParams& p, const TmaDesc&, const HopperSmem<Cfg>&,
                                           const VarlenItem& it, int, int, int, int t, int row_lo,
                                           const float (&o)[Cfg::kHeadDim / 8][4], const SoftmaxState<1>& softmax) {
  const SeqInfo& s = it.info;
  store_rows<T, Cfg::kHeadDim>(p, o, softmax, 0, s.q_row0 + row_lo, s.q_batch, it.h, it.split, t,
                               RowsTo{s.q_row0 + s.q_len});
}

// A consumer warpgroup's last store has read shared memory, which the CTA may
// then give up.
__device__ __forceinline__ void o_store_drain() {
  if (o_store_issuer()) tma_store_wait_read();
}

}  // namespace fa
