// The Hopper kernel's producer: one thread of warpgroup 0 issues every TMA load —
// an item's Q, and key tile j of an item into ring position g once the tile
// there before it has been read (e4m3 V from its transposed copy,
// HopperConfig::kVTransposed) — and, before the CTA barrier, initialises the
// mbarriers and loads the first item's Q and first tiles. The transposed copy
// is written by the launch before (transpose_v_e4m3), of which an e4m3 launch
// is the programmatic dependent: its first V load waits for that grid, its Q
// and K loads do not.
#pragma once

#include "hopper.cuh"
#include "hopper_layout.cuh"
#include "hopper_scheduler.cuh"

namespace fa {

// Item: HopperItem or VarlenItem (hopper_scheduler.cuh).
template <typename Cfg, typename Item>
struct HopperProducer {
  static constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages;
  const HopperParams& hp;
  HopperSmem<Cfg> sm;
  Item first;
  int early;  // the first item's tiles loaded in the prologue, with its Q

  __device__ __forceinline__ void load_q(const Item& it) const {
    const int3 at = it.q_at();
    mbar_expect_tx(sm.full_q(), Cfg::kQBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c)
      tma_load_4d(sm.q + c * BM * Cfg::kPanelBytes, &hp.q_map, sm.full_q(), c * Cfg::kPanelElems, at.x, at.y, at.z);
  }

  // The K of the key tile at `at` (Keys::at) into ring position g.
  __device__ __forceinline__ void load_k(int3 at, int g) const {
    const int st = g % S;
    if (g >= S) mbar_wait(sm.empty_k(st), ((g / S) - 1) & 1);
    mbar_expect_tx(sm.full_k(st), Cfg::kKVBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c)
      tma_load_4d(sm.k + st * Cfg::kKVBytes + c * BN * Cfg::kPanelBytes, &hp.k_map, sm.full_k(st), c * Cfg::kPanelElems,
                  at.x, at.y, at.z);
  }
  // Its V.
  __device__ __forceinline__ void load_v(int3 at, int g) const {
    const int st = g % S;
    if (g >= S) mbar_wait(sm.empty_v(st), ((g / S) - 1) & 1);
    mbar_expect_tx(sm.full_v(st), Cfg::kKVBytes);
    if constexpr (Cfg::kVTransposed) {
      if (g == 0) wait_for_prerequisites();  // the CTA's first V: the transposed copy is written
      // Vᵀ (d, key): the tile's keys of every head-dim row, one panel.
      tma_load_4d(sm.v + st * Cfg::kKVBytes, &hp.v_map, sm.full_v(st), at.x, 0, at.y, at.z);
    } else {
#pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c)
        tma_load_4d(sm.v + st * Cfg::kKVBytes + c * BN * Cfg::kPanelBytes, &hp.v_map, sm.full_v(st),
                    c * Cfg::kPanelElems, at.x, at.y, at.z);
    }
  }
  // Key tile j (`keys`: where an item's tiles lie, key_tiles) into ring position g.
  template <typename Keys>
  __device__ __forceinline__ void load_kv(const Keys& keys, int g, int j) const {
    const int3 at = keys.at(j);
    load_k(at, g);
    load_v(at, g);
  }

  // Thread 0, before the CTA barrier: every mbarrier, exp turns' scale, and the
  // first item's Q and first `early` tiles, which wait for no stage: their
  // latency starts before the CTA barrier and the register hand-over.
  __device__ __forceinline__ void prologue() const {
    for (int i = 0; i < S; ++i) {
      mbar_init(sm.full_k(i), 1);
      mbar_init(sm.full_v(i), 1);
      mbar_init(sm.empty_k(i), 4 * Cfg::kConsumers);  // one arrival per consumer warp
      mbar_init(sm.empty_v(i), 4 * Cfg::kConsumers);
    }
    mbar_init(sm.full_q(), 1);
    if (Cfg::kPersistent) mbar_init(sm.empty_q(), 4 * Cfg::kConsumers);
    if (Cfg::kExpTurns)
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.scale_slot()), "f"(hp.p.scale_log2) : "memory");
    mbar_init_fence();
    if (early > 0) {
      tma_prefetch_desc(&hp.k_map);
      tma_prefetch_desc(&hp.v_map);
      load_q(first);
      const auto keys = key_tiles<BN>(first);
      if constexpr (Cfg::kVTransposed) {  // the Ks before the first V's wait
        for (int j = 0; j < early; ++j) load_k(keys.at(j), j);
        for (int j = 0; j < early; ++j) load_v(keys.at(j), j);
      } else {
        for (int j = 0; j < early; ++j) load_kv(keys, j, j);
      }
    }
  }

  // Thread 0, after the register hand-over: every item's remaining loads, the
  // ring running on across items (g0: ring position of an item's first tile).
  template <typename Items>
  __device__ __forceinline__ void run(Items item) const {
    int g0 = 0, q_loads = 0;
    for (int k = 0; Cfg::kPersistent || k == 0; ++k) {
      const Item it = item(k);
      if (it.done) break;
      if (it.skip || it.tiles == 0) continue;
      const bool issued = q_loads == 0 && early > 0;  // item 0, loaded in the prologue
      // The previous item's Q must have had its last Q·Kᵀ.
      if (Cfg::kPersistent && q_loads > 0) mbar_wait(sm.empty_q(), (q_loads - 1) & 1);
      if (!issued) load_q(it);
      ++q_loads;
      const auto keys = key_tiles<BN>(it);
      for (int j = issued ? early : 0; j < it.tiles; ++j) load_kv(keys, g0 + j, j);
      g0 += it.tiles;
    }
  }
};

}  // namespace fa
