// The portable kernel's configuration per entry (tile sizes, warps, key groups,
// shared memory) and the addressing of its swizzled shared tiles.
#pragma once

#include "common.cuh"

namespace fa {

// Tile configuration per head dim, chosen by `cargo xtask tune` and passed as
// defines from the manifest (whose launch geometry must match): warps per CTA and
// keys per tile. 16-row tiles per warp (MT, so kBlockM = 16 × warps × MT) are
// fixed per entry: each non-causal configuration has an MT = 2 entry and an
// MT = 1 one (`_m64`), and kernel-ffi picks per problem (planner::prefer_m64).
#ifndef FA_WARPS_D64
#define FA_WARPS_D64 4
#endif
#ifndef FA_WARPS_D128
#define FA_WARPS_D128 4
#endif
#ifndef FA_BLOCK_N_D64
#define FA_BLOCK_N_D64 64
#endif
#ifndef FA_BLOCK_N_D128
#define FA_BLOCK_N_D128 64
#endif

template <int D, int MT, int KG = 1>
struct FwdConfig {
  static_assert(D == 64 || D == 96 || D == 128 || D == 192 || D == 256, "head dim must be 64, 96, 128, 192 or 256");
  // D=192 and 256 are fixed: four warps of one row tile and 64-key tiles, so
  // that Q, K and V (72 or 96 KB) fit an sm_86/89 block's 99 KB and O (96 or 128
  // floats a thread) the registers. D=96 takes D=128's four warps and 64-key tiles.
  // Warps per key group: the tuned count, but fixed in the two-group entries. At
  // D=64 two (32 rows per CTA: each warp walks half its 16 rows' keys, and a small
  // problem spreads over twice the CTAs of the 64-row entry); at D=128 four (64
  // rows), as a 64-thread group would copy 4 rows of 16 chunks per pass (TileCopy
  // needs 8).
  static constexpr int kHeadDim = D;
  static constexpr int kTileCols = D;  // 16-bit columns of a Q, K or V tile's row
  static constexpr int kWarps = KG > 1 ? (D == 64 ? 2 : 4) : D == 64 ? FA_WARPS_D64 : D == 128 ? FA_WARPS_D128 : 4;
  static_assert(KG > 1 || kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static constexpr int kKeyGroups = KG;
  static_assert(KG == 1 || KG == 2, "1 or 2 key groups");
  static constexpr int kGroupThreads = 32 * kWarps;
  static constexpr int kThreads = kGroupThreads * KG;
  static constexpr int kRowTiles = MT;
  static_assert(kRowTiles == 1 || kRowTiles == 2, "1 or 2 16-row mma tiles per warp");
  static constexpr int kBlockM = 16 * kWarps * kRowTiles;
  static_assert(D <= 128 || (MT == 1 && KG == 1), "D=192, 256: one row tile, one key group");
  static constexpr int kBlockN = D == 64 ? FA_BLOCK_N_D64 : D == 128 ? FA_BLOCK_N_D128 : 64;
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "32, 64 or 128 keys per tile");
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  // Per key group: Q tile, K tile, V tile, 16-bit elements. Must equal the
  // manifest's dynamic_smem.
  static constexpr int kTileBytes = kBlockN * D * 2;
  static constexpr int kGroupSmemBytes = kBlockM * D * 2 + 2 * kTileBytes;
  static constexpr int kSmemBytes = kGroupSmemBytes * KG;
  // A group's hand-over for the merge, in the CTA's tiles once both groups are
  // done with them: per thread its O accumulators, row maxima and sums.
  // A split launch's epilogue stages the group's kBlockM rows of fp32 O in its
  // tiles (portable_epilogue.cuh): twice the Q tile's bytes, so the K and V tiles
  // must hold at least as many rows as Q.
  static_assert(2 * kBlockN >= kBlockM, "the split epilogue's fp32 O fits the group's tiles");
  // The first of the two columns of O accumulator pair dt (o[mt][dt][0..1],
  // and [2..3] of row g + 8) in thread t: the mma.sync C layout's.
  __device__ __forceinline__ static constexpr int pair_col(int dt, int t) { return 8 * dt + 2 * t; }
  // The same column as (4-float chunk, offset in it): the fp32 staging's terms.
  __device__ __forceinline__ static int2 pair_chunk4(int dt, int t) { return make_int2(2 * dt + t / 2, 2 * (t % 2)); }
  static constexpr int kMergeFloats = (4 * D / 8 + 4) * MT;
  static_assert(KG == 1 || kMergeFloats * kGroupThreads * 4 <= kSmemBytes, "the merge hand-over fits the tiles");
  static_assert(kBlockN % 16 == 0 && D % 16 == 0, "mma k-steps are 16 wide");
  static_assert((kBlockM * kChunks) % kGroupThreads == 0 && (kBlockN * kChunks) % kGroupThreads == 0,
                "every thread of a group copies the same number of chunks");
};

// Shared addresses of a warp's ldmatrix.x4 reads of a swizzled [rows, D] tile, for
// 16-row × 16-column blocks. Lane l supplies row (l/8 selects one of 4 matrices)
// `row_of(l)`, whose value mod 8 is l % 8, and chunk 2·j + chunk_bit(l) of block
// column j. The swizzle XORs chunks within groups of kSwizzleChunks (common.cuh),
// so the pattern repeats every kPattern block columns (and every 16 rows): one
// base address per block column of a group, plus compile-time offsets.
template <int D>
struct FragAddr {
  static constexpr int kPattern = kSwizzleChunks<D> / 2;
  uint32_t base[kPattern];
  __device__ __forceinline__ FragAddr(uint32_t tile, int row, int chunk_bit) {
    const int c = chunk_bit ^ swizzle_xor<D>(row);
#pragma unroll
    for (int j = 0; j < kPattern; ++j) base[j] = tile + 2 * (row * D + (((2 * j) ^ c) << 3));
  }
  // Block row `rb` (16 rows), block column `cb` (16 columns), in bytes.
  __device__ __forceinline__ uint32_t at(int rb, int cb) const {
    return base[cb % kPattern] + 2 * (rb * 16 * D + (cb / kPattern) * kPattern * 16);
  }
};

// This thread's key group, its index in it, the group's shared tiles (Q, K, V,
// each swizzled [rows, kTileCols]) and its barrier.
template <typename T, typename Cfg>
struct KeyGroup {
  static constexpr int D = Cfg::kTileCols, KG = Cfg::kKeyGroups, GT = Cfg::kGroupThreads;
  const int id;
  const unsigned tid;
  unsigned char* const smem;  // the group's tiles
  T* const q;                 // kBlockM rows
  T* const k;                 // kBlockN rows
  T* const v;                 // the same

  __device__ __forceinline__ explicit KeyGroup(unsigned char* smem_raw)
      : id(KG == 1 ? 0 : threadIdx.x / GT),
        tid(KG == 1 ? threadIdx.x : threadIdx.x % GT),
        smem(smem_raw + id * Cfg::kGroupSmemBytes),
        q(reinterpret_cast<T*>(smem)),
        k(q + Cfg::kBlockM * D),
        v(k + Cfg::kBlockN * D) {}

  // The group's warps meet at their own barrier, not the CTA's (compile-time ids,
  // so ptxas reserves three barriers, not all sixteen).
  __device__ __forceinline__ void sync() const {
    if constexpr (KG == 1) {
      __syncthreads();
    } else if (id == 0) {
      named_bar_sync<KeyGroupBarrier::Group0, GT>();
    } else {
      named_bar_sync<KeyGroupBarrier::Group1, GT>();
    }
  }
};

// This thread's place in its warp's rows, w0 … w0 + 16·MT − 1 of the block: in
// the mma.sync layouts it holds rows g and g + 8 of each 16-row tile and columns
// 2t, 2t + 1 of each 8-wide one.
template <int MT>
struct WarpRows {
  const int warp, lane, g, t;
  // `gtid`: the thread's index in its key group.
  __device__ __forceinline__ explicit WarpRows(unsigned gtid)
      : warp(gtid / 32), lane(threadIdx.x % 32), g(lane / 4), t(lane % 4) {}
  __device__ __forceinline__ int w0() const { return warp * 16 * MT; }
};

}  // namespace fa
