// The Hopper kernel's configuration per entry (tile sizes, ring depth, register
// split, shared memory budget) and its shared-memory layout.
#pragma once

#include "hopper.cuh"

namespace fa {

// Compile-time defines from the manifest, each chosen by same-run A/B timings on
// an H200 (the 192-row entry's on an H100; the ledger, perf/ledger.jsonl, has them):
// FA_HOPPER_STAGES_*: K/V ring depth (shared memory: Q + 2 × stages × 128 × D × 2 B, 1 B for e4m3;
//   FA_HOPPER_STAGES_D64_CAUSAL: the 128-row D=64 entry's, _D64_M192 the 192-row one's).
#ifndef FA_HOPPER_STAGES_D128
#define FA_HOPPER_STAGES_D128 2
#endif
#ifndef FA_HOPPER_STAGES_D128_CAUSAL
#define FA_HOPPER_STAGES_D128_CAUSAL 2
#endif
#ifndef FA_HOPPER_STAGES_D64_M64
#define FA_HOPPER_STAGES_D64_M64 2
#endif
#ifndef FA_HOPPER_STAGES_D128_M64
#define FA_HOPPER_STAGES_D128_M64 2
#endif
// FA_HOPPER_PERSISTENT_CAUSAL: 1 = causal entries run persistent CTAs over pairs
//   of query blocks or a host schedule (hopper_item), 0 = one CTA per query block.
#ifndef FA_HOPPER_PERSISTENT_CAUSAL
#define FA_HOPPER_PERSISTENT_CAUSAL 1
#endif
// FA_HOPPER_PERSISTENT_D128: 1 = the non-causal 128-row D=128 entry runs
//   persistent CTAs over single query blocks, 0 = one CTA per query block. (The
//   non-causal D=64 entry has a persistent twin instead, `_m64_persistent`,
//   which kernel-ffi takes for grids over a wave: persistent code costs a grid of
//   one CTA per SM about 4% in instruction-cache misses.)
#ifndef FA_HOPPER_PERSISTENT_D128
#define FA_HOPPER_PERSISTENT_D128 1
#endif

// FA_HOPPER_STAGES_E4M3: the e4m3 entries' ring depth (their stages are half
//   the bytes).
#ifndef FA_HOPPER_STAGES_E4M3
#define FA_HOPPER_STAGES_E4M3 3
#endif
#ifndef FA_HOPPER_STAGES_E4M3_M192
#define FA_HOPPER_STAGES_E4M3_M192 2
#endif
#ifndef FA_HOPPER_STAGES_D64_CAUSAL
#define FA_HOPPER_STAGES_D64_CAUSAL 2
#endif
#ifndef FA_HOPPER_STAGES_D64_M192
#define FA_HOPPER_STAGES_D64_M192 4
#endif

// PERSISTENT: the entry's CTAs loop over work units (hopper_item). IN_BYTES:
// bytes of an input element, 2 (f16, bf16) or 1 (e4m3, whose tiles are moved
// and addressed as 16-bit columns of element pairs, e4m3x2).
template <int D, bool CAUSAL, int ROWS, bool PERSISTENT, int IN_BYTES = 2>
struct HopperConfig {
  static_assert(D == 64 || D == 96 || D == 128 || D == 192 || D == 256, "head dim must be 64, 96, 128, 192 or 256");
  static_assert(ROWS == 64 || ROWS == 128 || (ROWS == 192 && !CAUSAL && (D == 64 || (D == 128 && IN_BYTES == 1))),
                "64-, 128- or 192-row CTAs (192: non-causal D=64, e4m3 D=128)");
  // D=192 and 256: two consumer warpgroups over 64-key tiles (e4m3: 128, at
  // half the bytes) in two stages; O is 96 or 128 floats a consumer thread.
  // D=256 runs one CTA per query block (16-bit: Q 64 KB + the rings 128 KB
  // leave no room for a persistent entry's O staging tile; e4m3: Q 32 KB, the
  // rings 128 KB and its staging tile 64 KB fill shared memory).
  static_assert(D <= 128 || ROWS == 128, "D=192, 256: 128-row CTAs");
  static_assert(D != 256 || !PERSISTENT, "D=256: not persistent");
  static_assert(IN_BYTES == 2 || (IN_BYTES == 1 && D % 64 == 0 && D != 192 && ROWS >= 128),
                "e4m3: D=64, 128 or 256 (the entries: 128 and 256) in 128 or 192 rows");
  static constexpr int kHeadDim = D;
  static constexpr bool kFp8 = IN_BYTES == 1;
  // Q and K tiles are kPanels swizzle panels of kPanelCols 16-bit columns (of
  // kTileCols a row): 64 (128-byte rows, TMA's SWIZZLE_128B) where rows are a
  // multiple of 128 bytes, else 32 (64-byte rows, SWIZZLE_64B: D=96, e4m3
  // D=64), each panel rows × kPanelBytes. kernel-ffi's TMA maps
  // (attention/launch.rs: tensor_map) take the same panels, the wgmma
  // descriptors (GmmaDesc) the same swizzle. O (16-bit) is staged in panels of
  // its own rows (kOutPanelCols).
  static constexpr int kTileCols = D * IN_BYTES / 2;
  static constexpr int kPanelCols = kTileCols % 64 == 0 ? 64 : 32;
  static constexpr int kPanelBytes = 2 * kPanelCols;
  static constexpr int kPanels = kTileCols / kPanelCols;
  static constexpr int kPanelElems = kPanelBytes / IN_BYTES;  // a panel's columns in the TMA maps' elements
  static constexpr int kOutPanelCols = D % 64 == 0 ? 64 : 32;
  static constexpr int kOutPanelBytes = 2 * kOutPanelCols;
  static constexpr int kOutPanels = D / kOutPanelCols;
  static constexpr int kConsumers = ROWS / 64;
  // See "The consumer schedule" (flash_fwd_hopper.cuh).
  static constexpr bool kSerial = kFp8 && (D > 128 || kConsumers == 3);
  static constexpr bool kPingPong = kConsumers == 2 && !kSerial;
  static constexpr bool kExpTurns = kPingPong && D == 64 && !kFp8;
  static constexpr int kCtasPerSm = kConsumers == 1 && D == 64 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = ROWS;
  static constexpr int kBlockN = D > 128 && !kFp8 ? 64 : 128;
  static constexpr int kStages = kFp8              ? (D > 128           ? 2
                                                      : kConsumers == 3 ? FA_HOPPER_STAGES_E4M3_M192
                                                                        : FA_HOPPER_STAGES_E4M3)
                                 : kConsumers == 1 ? (D == 64 ? FA_HOPPER_STAGES_D64_M64 : FA_HOPPER_STAGES_D128_M64)
                                 : kConsumers == 3 ? FA_HOPPER_STAGES_D64_M192
                                 : D > 128         ? 2
                                 : D == 64         ? FA_HOPPER_STAGES_D64_CAUSAL
                                                   : (CAUSAL ? FA_HOPPER_STAGES_D128_CAUSAL : FA_HOPPER_STAGES_D128);
  static constexpr bool kPersistent = PERSISTENT;  // units: causal pairs of query blocks, or single blocks
  // Three consumer warpgroups (192 rows) run a persistent grid's last, partial
  // round of units as 64-row items whose key tiles they share (HopperSched::whole_units).
  static constexpr bool kSplitTail = kConsumers == 3 && kPersistent;
  static constexpr int kQBytes = kBlockM * kTileCols * 2;
  static constexpr int kKVBytes = kBlockN * kTileCols * 2;
  // e4m3 V arrives transposed (kernel-ffi's transpose_v_e4m3): a stage is D
  // rows of kBlockN keys, one panel of kVPanelBytes (K-major, as FP8 wgmma
  // wants B); 16-bit V is key rows, transposed on read.
  static constexpr bool kVTransposed = kFp8;
  static constexpr int kVPanelBytes = kVTransposed ? kBlockN : kPanelBytes;
  static_assert(kVPanelBytes == 128 || kVPanelBytes == 64, "a V panel is one swizzle row");
  // Registers per thread after setmaxnreg, within 65536 per SM: 128 × 40 + 256 × 232
  // for two consumers (serial: 128 × 24 + 256 × 240, where S, O and a Q·Kᵀ
  // chain's 32 fit without spills), 128 × 24 + 128 × 232 per CTA for one,
  // 128 × 32 + 384 × 160 for three (S, O and P of the pipelined schedule fit
  // in 160 without spills; serial e4m3: 128 × 24 + 384 × 160, O, and S or the
  // promoted P·V's accumulator).
  static constexpr int kProducerRegs = kConsumers == 1 || kSerial ? 24 : kConsumers == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kSerial ? 240 : 232;
  static_assert((128 * kProducerRegs + 128 * kConsumers * kConsumerRegs) * kCtasPerSm <= 65536, "register file");
  // Q, the K and V rings, an O staging tile (16-bit rows) where Q's tile cannot
  // be one (persistent entries: it may already hold the next item's Q; e4m3:
  // it is half O's size), 4 barriers per stage + Q's (persistent: full and
  // empty), and slack to align the base to 1024.
  static constexpr bool kOStaged = kPersistent || kFp8;
  static constexpr int kStageBytes = kOStaged ? kBlockM * D * 2 : 0;
  // Split-tail items: consumer warpgroups 1 and 2 hand warpgroup 0 their O and
  // softmax state (per thread: DT × 4 + 4 floats), kMergeFloats a thread.
  static constexpr int kMergeFloats = D / 2 + 4;
  static constexpr int kMergeBytes = kSplitTail ? (kConsumers - 1) * 128 * kMergeFloats * 4 : 0;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + kStageBytes + kMergeBytes +
                                    8 * (4 * kStages + 1 + kPersistent + kExpTurns) + 1024;
  // sm_90: 227 KB per CTA, 228 KB per SM with 1 KB reserved per CTA.
  static_assert(kSmemBytes <= 232448 && (kSmemBytes + 1024) * kCtasPerSm <= 233472, "shared memory");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "a TMA box spans at most 256 rows");
};

// Where chunk c (16 bytes) of a row of a panel of PC 16-bit columns lies in that
// row, as TMA's swizzle puts it: the portable kernel's swizzle of rows as wide
// as a panel (common.cuh).
template <int PC>
__device__ __forceinline__ int panel_chunk(int row, int c) {
  return c ^ swizzle_xor<PC>(row);
}

// Shared memory of one CTA, from a 1024-byte aligned base (swizzle atoms need it;
// the dynamic base only promises 16): Q, the K ring, the V ring, the O staging
// tile (kOStaged), split-tail entries' merge area, then the mbarriers — full_k[S], full_v[S], empty_k[S],
// empty_v[S], Q's full (and, persistent, empty) — and exp turns' scale slot.
template <typename Cfg>
struct HopperSmem {
  static constexpr int S = Cfg::kStages;
  uint32_t q, k, v, o, merge, bars;

  __device__ __forceinline__ static HopperSmem at(const unsigned char* raw) {
    const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;
    HopperSmem m;
    m.q = base;
    m.k = m.q + Cfg::kQBytes;  // stage i at k + i × kKVBytes
    m.v = m.k + S * Cfg::kKVBytes;
    m.o = m.v + S * Cfg::kKVBytes;  // kOStaged only; else O is staged in q
    m.merge = m.o + Cfg::kStageBytes;
    m.bars = m.merge + Cfg::kMergeBytes;
    return m;
  }
  // Producer's expect_tx arrival + TMA bytes complete a full barrier; every
  // consumer warp arrives on an empty one once its wgmma has read the stage.
  __device__ __forceinline__ uint32_t full_k(int i) const { return bars + 8 * i; }
  __device__ __forceinline__ uint32_t full_v(int i) const { return bars + 8 * (S + i); }
  __device__ __forceinline__ uint32_t empty_k(int i) const { return bars + 8 * (2 * S + i); }
  __device__ __forceinline__ uint32_t empty_v(int i) const { return bars + 8 * (3 * S + i); }
  __device__ __forceinline__ uint32_t full_q() const { return bars + 8 * 4 * S; }
  __device__ __forceinline__ uint32_t empty_q() const { return full_q() + 8; }  // persistent only
  __device__ __forceinline__ uint32_t scale_slot() const {                      // exp turns only: p.scale_log2
    return empty_q() + 8 * Cfg::kPersistent;
  }
};

}  // namespace fa
