// FlashAttention-2-style forward pass on mma.sync tensor cores (sm_80+).
//
// One CTA owns kBlockM query rows of one (batch, head) and one key split; each
// warp owns 16 × kRowTiles of those rows end to end, so the online softmax needs
// no cross-warp communication, and with two row tiles every K and V fragment a
// warp loads from shared memory feeds two mma.sync instead of one. Per key tile
// of kBlockN: S = Q·Kᵀ (fp32), online softmax in the exp2 domain, O += P·V with P
// kept in registers.
//
// With kKeyGroups = 2 (the `_kg2` entries, for grids of one CTA per SM or fewer)
// the CTA is two such groups of warps over the same rows, each with its own
// shared Q/K/V tiles and named barrier, taking alternate key tiles; at the end one
// merges the other's (O, max, sum) through shared memory. Twice the warps per SM
// and half the serial key loop, without a second launch to combine splits.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "flash_params.h"
#include "softmax.cuh"

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

template <int D, int MT, int KG = 1, int ST = 1>
struct FwdConfig {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  // Warps per key group: the tuned count, but always 4 in the two-group entries,
  // whose point is eight warps on 64 rows.
  static constexpr int kWarps = KG > 1 ? 4 : D == 64 ? FA_WARPS_D64 : FA_WARPS_D128;
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static constexpr int kKeyGroups = KG;
  static_assert(KG == 1 || KG == 2, "1 or 2 key groups");
  // K and V tiles per group: 1 (K(j+1) loads under P·V(j), V(j) under Q·Kᵀ(j) and
  // the softmax) or 2 (the pipelined schedule; each loads a whole iteration ahead).
  static constexpr int kStages = ST;
  static_assert(ST == 1 || ST == 2, "1 or 2 K/V stages");
  static constexpr int kGroupThreads = 32 * kWarps;
  static constexpr int kThreads = kGroupThreads * KG;
  static constexpr int kRowTiles = MT;
  static_assert(kRowTiles == 1 || kRowTiles == 2, "1 or 2 16-row mma tiles per warp");
  static constexpr int kBlockM = 16 * kWarps * kRowTiles;
  static constexpr int kBlockN = D == 64 ? FA_BLOCK_N_D64 : FA_BLOCK_N_D128;
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "32, 64 or 128 keys per tile");
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  // Per key group: Q tile, K tiles, V tiles, 16-bit elements. Must equal the
  // manifest's dynamic_smem.
  static constexpr int kTileBytes = kBlockN * D * 2;
  static constexpr int kGroupSmemBytes = kBlockM * D * 2 + 2 * ST * kTileBytes;
  static constexpr int kSmemBytes = kGroupSmemBytes * KG;
  // A group's hand-over for the merge, in the CTA's tiles once both groups are
  // done with them: per thread its O accumulators, row maxima and sums.
  static constexpr int kMergeFloats = (4 * D / 8 + 4) * MT;
  static_assert(KG == 1 || kMergeFloats * kGroupThreads * 4 <= kSmemBytes, "the merge hand-over fits the tiles");
  static_assert(kBlockN % 16 == 0 && D % 16 == 0, "mma k-steps are 16 wide");
  static_assert((kBlockM * kChunks) % kGroupThreads == 0 && (kBlockN * kChunks) % kGroupThreads == 0,
                "every thread of a group copies the same number of chunks");
};

// Copies ROWS-row tiles of a [rows, D] matrix into a swizzled shared tile with
// cp.async, each thread always moving the same 16-byte column chunk of rows
// r, r + kRowsPerPass, …: its shared addresses are fixed (the swizzle term depends
// on r % 8 only, and kRowsPerPass is a multiple of 8), and its global address
// advances by a constant. Everything but one multiply per tile is set up once.
template <typename T, int ROWS, int D, int THREADS>
struct TileCopy {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = ROWS / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "each thread keeps one chunk column and one swizzle phase");
  uint32_t smem;        // this thread's chunk of its first row
  const T* gmem;        // row `row` of the matrix at this thread's chunk column
  int64_t pass_stride;  // elements between this thread's rows in consecutive passes
  int row;

  // `tid`: this thread's index among the THREADS that copy.
  __device__ __forceinline__ TileCopy(T* tile, const T* base, int64_t row_stride, unsigned tid) {
    row = tid / kChunks;
    const int ch = tid % kChunks;
    smem = smem_u32(tile + swizzle<D>(row, ch * 8));
    gmem = base + (int64_t)row * row_stride + ch * 8;
    pass_stride = (int64_t)kRowsPerPass * row_stride;
  }

  // Rows [row0, row0 + ROWS); `offset` = row0 × row_stride; into the tile
  // `smem_offset` bytes past the constructor's. Rows ≥ rows_valid are zero-filled
  // so that 0 × garbage can never turn into NaN in P·V.
  __device__ __forceinline__ void copy(int64_t offset, int row0, int rows_valid, uint32_t smem_offset = 0) const {
    const T* src = gmem + offset;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = row0 + row + i * kRowsPerPass < rows_valid;
      cp_async_16(smem + smem_offset + i * kRowsPerPass * D * 2, valid ? src : gmem, valid ? 16 : 0);
      src += pass_stride;
    }
  }
};

// Shared addresses of a warp's ldmatrix.x4 reads of a swizzled [rows, D] tile, for
// 16-row × 16-column blocks. Lane l supplies row (l/8 selects one of 4 matrices)
// `row_of(l)`, whose value mod 8 is l % 8, and chunk 2·j + chunk_bit(l) of block
// column j: the swizzled chunk is (2j) ^ chunk_bit ^ (l % 8), so four XOR
// patterns (j % 4) cover every block column, plus compile-time offsets.
template <int D>
struct FragAddr {
  uint32_t base[4];
  __device__ __forceinline__ FragAddr(uint32_t tile, int row, int chunk_bit) {
    const int c = chunk_bit ^ (row & 7);
#pragma unroll
    for (int j = 0; j < 4; ++j) base[j] = tile + 2 * (row * D + (((2 * j) ^ c) << 3));
  }
  // Block row `rb` (16 rows), block column `cb` (16 columns), in bytes.
  __device__ __forceinline__ uint32_t at(int rb, int cb) const {
    return base[cb % 4] + 2 * (rb * 16 * D + (cb / 4) * 64);
  }
};

// Planted defects, compiled in only by `cargo xtask sanitize --defects` (one
// -DFA_DEFECT_* per build) to prove each compute-sanitizer tool catches its bug:
//   FA_DEFECT_OOB_TAIL       tail rows past seqlen_q are stored (memcheck)
//   FA_DEFECT_RACE           no barrier between P·V reads of sV and the next V load (racecheck)
//   FA_DEFECT_UNINIT         a split with no keys writes no partials; combine reads them (initcheck)
//   FA_DEFECT_DIVERGENT_SYNC a barrier reached by half of each warp (synccheck)
// and, for proving the CI gate: FA_PLANT_SLOWDOWN=N (a dependent FMA chain per key
// tile) and FA_PLANT_WRONG_RESULT (a 1% wrong softmax scale), e.g.
// `cargo xtask ci --gpu --define FA_PLANT_WRONG_RESULT …`.

template <typename T, int D, bool CAUSAL, int MT, int KG, int ST>
__device__ __forceinline__ void flash_fwd(const FlashParams& p) {
  using Cfg = FwdConfig<D, MT, KG, ST>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, NT = BN / 8, DT = D / 8, GT = Cfg::kGroupThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The launcher takes smem and threads from the manifest; a mismatch is a build bug.
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads) __trap();
  // This thread's key group, its index in it, and the group's tiles.
  const int group = KG == 1 ? 0 : threadIdx.x / GT;
  const unsigned gtid = KG == 1 ? threadIdx.x : threadIdx.x % GT;
  unsigned char* group_smem = smem_raw + group * Cfg::kGroupSmemBytes;
  T* sQ = reinterpret_cast<T*>(group_smem);
  T* sK = sQ + BM * D;       // ST tiles
  T* sV = sK + ST * BN * D;  // ST tiles
  // The group's warps meet at their own barrier, not the CTA's (compile-time ids,
  // so ptxas reserves three barriers, not all sixteen).
  auto group_sync = [&] {
    if constexpr (KG == 1) {
      __syncthreads();
    } else if (group == 0) {
      named_bar_sync<KeyGroupBarrier::Group0, GT>();
    } else {
      named_bar_sync<KeyGroupBarrier::Group1, GT>();
    }
  };

  const int warp = gtid / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int kvh = h / (p.heads / p.kv_heads);
  const int split = blockIdx.z;
  // Causal: the last query blocks see the most keys; hand them out first so the
  // longest CTAs do not start in the final wave.
  const int m0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
#ifdef FA_PLANT_WRONG_RESULT
  const float scale_log2 = p.scale_log2 * 1.01f;  // planted: a 1% wrong softmax scale
#else
  const float scale_log2 = p.scale_log2;
#endif
  // Bottom-right causal alignment: row i sees keys j <= i + (Sk - Sq).
  const int diag = p.seqlen_k - p.seqlen_q;

  const int n_begin = split * p.keys_per_split;
  int n_end = min(p.seqlen_k, n_begin + p.keys_per_split);
  if (CAUSAL) n_end = min(n_end, m0 + BM + diag);  // one past the last key any row here sees
#ifdef FA_DEFECT_UNINIT
  if (p.num_splits > 1 && n_begin >= n_end) return;
#endif
#ifdef FA_DEFECT_DIVERGENT_SYNC
  if (lane < 16) __syncthreads();
#endif

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + kvh * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + kvh * p.v_head_stride;

  // Per row tile mt (rows w0 + 16·mt …, w0 = this warp's first row):
  float o[MT][DT][4];
  // Running max (in scaled log2 units) and partial row sums for rows g and g+8.
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  // Q fragments stay in registers, loaded once, unless that would spill (two row
  // tiles at D=128): then they are re-read from the resident Q tile per key tile.
  constexpr bool kQInRegs = D * MT <= 128;
  uint32_t qf[kQInRegs ? MT : 1][kQInRegs ? D / 16 : 1][4];
  const int w0 = warp * 16 * MT;
  auto q_addr = [&](int mt, int kk) {
    return smem_u32(sQ + swizzle<D>(w0 + 16 * mt + (lane % 16), kk * 16 + (lane / 16) * 8));
  };
  // Row tile mt's A fragment for k-step kk: from qf, or from this k-step's reads.
  auto q_frag = [&](int mt, int kk, const uint32_t(&qs)[MT][4]) -> const uint32_t(&)[4] {
    if constexpr (kQInRegs) {
      return qf[mt][kk];
    } else {
      return qs[mt];
    }
  };

  const TileCopy<T, BN, D, GT> k_copy(sK, k, p.k_row_stride, gtid);
  const TileCopy<T, BN, D, GT> v_copy(sV, v, p.v_row_stride, gtid);
  // K fragments: matrices (keys +0..7, d +0..7), (keys +0..7, d +8..15), (keys +8..15, d +0..7), (…, d +8..15).
  const FragAddr<D> k_frag(smem_u32(sK), (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  // V fragments, transposed: (keys +0..7, d +0..7), (keys +8..15, d +0..7), (keys +0..7, d +8..15), (…).
  const FragAddr<D> v_frag(smem_u32(sV), ((lane / 8) % 2) * 8 + lane % 8, lane / 16);

  // Group g takes key tiles g, g + KG, … of the split.
  const int n_first = n_begin + group * BN;
  constexpr int kStep = KG * BN;  // between this group's key tiles
  auto load_k = [&](int n, uint32_t off) { k_copy.copy((int64_t)n * p.k_row_stride, n, p.seqlen_k, off); };
  auto load_v = [&](int n, uint32_t off) { v_copy.copy((int64_t)n * p.v_row_stride, n, p.seqlen_k, off); };
  // The group's first loads, one cp.async group: Q and its first K tile.
  auto load_q_k0 = [&] {
    TileCopy<T, BM, D, GT>(sQ, q, p.q_row_stride, gtid).copy((int64_t)m0 * p.q_row_stride, m0, p.seqlen_q);
    load_k(n_first, 0);
    cp_async_commit();
  };
  auto load_q_frags = [&] {
    if constexpr (kQInRegs) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[mt][kk], q_addr(mt, kk));
      }
    }
  };
  // S = Q·Kᵀ for this warp's 16·MT rows × BN keys, K from the tile `koff` bytes in.
  auto qk = [&](float(&s)[MT][NT][4], uint32_t koff) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < NT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qs[MT][4];
      if constexpr (!kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qs[mt], q_addr(mt, kk));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_frag.at(np, kk) + koff);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&qa)[4] = q_frag(mt, kk, qs);
          mma_16816<T>(s[mt][2 * np], qa, kf[0], kf[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa, kf[2], kf[3]);
        }
      }
    }
  };
  // Masks row tile mt's scores, only on tiles that cross the sequence end or the
  // causal diagonal; this thread's rows are row_lo and row_lo + 8.
  auto mask = [&](float(&s)[NT][4], int mt, int n0) {
    mask_tile<CAUSAL>(s, n0, m0, m0 + w0 + 16 * mt + g, t, p.seqlen_k, diag);
  };
  // O += P·V with P as A fragments (kk: 16-key step), V from the tile `voff` bytes in.
  auto pv = [&](auto&& p_frag, uint32_t voff) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pf[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) p_frag(pf[mt], mt, kk);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_frag.at(kk, dp) + voff);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pf[mt], vf[0], vf[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pf[mt], vf[2], vf[3]);
        }
      }
    }
  };

  if constexpr (ST == 1) {
    if (n_first < n_end) load_q_k0();
    for (int n0 = n_first; n0 < n_end; n0 += kStep) {
      // cp.async groups in flight: [Q+K0] [V0] [K1] [V1] …
      load_v(n0, 0);
      cp_async_commit();
      cp_async_wait<1>();  // K(n0) (and Q) landed
      group_sync();
      if (n0 == n_first) load_q_frags();

      float s[MT][NT][4];
      qk(s, 0);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mask(s[mt], mt, n0);
        softmax_step(s[mt], o[mt], row_max[mt], row_sum[mt], scale_log2);
      }

      cp_async_wait<0>();  // V(n0) landed
      group_sync();        // and every warp is done reading sK
      if (n0 + kStep < n_end) {
        load_k(n0 + kStep, 0);
        cp_async_commit();
      }
      // P straight from the S accumulators.
      pv([&](uint32_t(&f)[4], int mt, int kk) { p_fragment<T>(f, s[mt], kk); }, 0);
#ifdef FA_PLANT_SLOWDOWN
      // A dependent FMA chain per tile: a measured, deliberate slowdown for proving the gate.
      float chain = s[0][0][0];
#pragma unroll 1
      for (int i = 0; i < FA_PLANT_SLOWDOWN; ++i) chain = fmaf(chain, 0.999f, 1e-7f);
      if (chain != chain) o[0][0][0] += chain;  // never true for finite input; keeps the chain alive
#endif
#ifndef FA_DEFECT_RACE
      group_sync();  // every warp is done reading sV before the next V load
#endif
    }
  } else if (n_first < n_end) {
    // Software-pipelined: iteration j issues Q·Kᵀ(j) and P·V(j−1) together and
    // runs softmax(j) while P·V(j−1) is in the tensor pipe, so a lone warp per
    // scheduler still has independent work. K(j) and V(j) live in stage j % 2;
    // iteration j loads K(j+1) and V(j) once its barrier shows iteration j−1 done
    // with them, a whole iteration before they are read.
    load_q_k0();
    uint32_t pf[MT][BN / 16][4];  // P(j − 1), packed
    float corr[MT][2];            // O's rescale before P(j − 1)·V(j − 1) is added
    auto packed_p = [&](uint32_t(&f)[4], int mt, int kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f[i] = pf[mt][kk][i];
    };
    uint32_t kst = 0, vst = 0;  // byte offsets of K(j)'s and V(j − 1)'s stages
    for (int n0 = n_first; n0 < n_end; n0 += kStep) {
      cp_async_wait<0>();  // K(j), V(j − 1) (and Q) landed
      group_sync();        // and iteration j − 1 is done with K(j − 1), V(j − 2)
      if (n0 + kStep < n_end) load_k(n0 + kStep, kst ^ Cfg::kTileBytes);
      load_v(n0, n0 == n_first ? 0 : vst ^ Cfg::kTileBytes);
      cp_async_commit();
      float s[MT][NT][4];
      if (n0 == n_first) {
        load_q_frags();
        qk(s, kst);
      } else {
        qk(s, kst);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) rescale(o[mt], corr[mt]);
        pv(packed_p, vst);
        vst ^= Cfg::kTileBytes;
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mask(s[mt], mt, n0);
        softmax_rows(s[mt], row_max[mt], row_sum[mt], corr[mt], scale_log2);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) p_fragment<T>(pf[mt][kk], s[mt], kk);
      }
      kst ^= Cfg::kTileBytes;
    }
    cp_async_wait<0>();  // the last V landed
    group_sync();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) rescale(o[mt], corr[mt]);
    pv(packed_p, vst);
  }

  if constexpr (KG == 2) {
    // Group 1 hands its state over in the tiles, which neither group reads after
    // this barrier (at 32 keys per tile its own are too small for it); group 0
    // merges it like one more key tile: both maxima to the larger, each side
    // scaled by 2^(its max − new max).
    float* hand = reinterpret_cast<float*>(smem_raw) + gtid;  // slot i at hand[i·GT]
    auto o_slot = [&](int mt, int i) -> float& { return hand[(mt * DT * 4 + i) * GT]; };
    auto max_slot = [&](int mt, int r) -> float& { return hand[(MT * DT * 4 + 4 * mt + r) * GT]; };
    auto sum_slot = [&](int mt, int r) -> float& { return hand[(MT * DT * 4 + 4 * mt + 2 + r) * GT]; };
    __syncthreads();
    if (group == 1) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < DT * 4; ++i) o_slot(mt, i) = o[mt][i / 4][i % 4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          max_slot(mt, r) = row_max[mt][r];
          sum_slot(mt, r) = row_sum[mt][r];
        }
      }
    }
    __syncthreads();
    if (group == 1) return;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mine[2], theirs[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float other_max = max_slot(mt, r);
        const float new_max = fmaxf(row_max[mt][r], other_max);
        const float base = exp_base(new_max);
        mine[r] = fast_exp2(row_max[mt][r] - base);
        theirs[r] = fast_exp2(other_max - base);
        row_max[mt][r] = new_max;
        row_sum[mt][r] = row_sum[mt][r] * mine[r] + sum_slot(mt, r) * theirs[r];
      }
#pragma unroll
      for (int i = 0; i < DT * 4; ++i) {
        const int r = (i % 4) / 2;  // elements 0, 1 are row g; 2, 3 row g + 8
        o[mt][i / 4][i % 4] = o[mt][i / 4][i % 4] * mine[r] + o_slot(mt, i) * theirs[r];
      }
    }
  }

  // ---- Epilogue: normalise, then write O (or the split's fp32 partial) and LSE.
  // Both go through shared memory: each thread stages its normalised pairs of
  // this warp's rows (`put(row, dt, x, y)`; `lse_out(row, lse)` for t = 0), then
  // the warp copies its rows out in 16-byte chunks (`copy(row, chunk)`, kChunks
  // per row), whole rows per instruction, instead of stores touching 8 rows each.
  auto stage = [&](auto&& put, auto&& lse_out) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float inv, lse;
        row_finish(row_max[mt], row_sum[mt], r, inv, lse);
        const int row = w0 + 16 * mt + g + 8 * r;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) put(row, dt, o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        if (t == 0 && row_stored(m0 + row, p.seqlen_q)) lse_out(row, lse);
      }
    }
    __syncwarp();
  };
  auto copy_rows = [&](auto chunks, auto&& copy) {
    constexpr int kChunks = decltype(chunks)::value, kRowsPerPass = 32 / kChunks;
#pragma unroll
    for (int r0 = 0; r0 < 16 * MT; r0 += kRowsPerPass) {
      const int row = w0 + r0 + lane / kChunks;
      if (row_stored(m0 + row, p.seqlen_q)) copy(row, lane % kChunks);
    }
  };
  if (p.num_splits > 1) {
    // Two-tile entries, which the planner never splits, store the partials from
    // the accumulators (staging them spilled the D=128 one on sm_89).
    if constexpr (MT == 2) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        store_rows<T, D>(p, o[mt], row_max[mt], row_sum[mt], m0 + w0 + 16 * mt + g, b, h, split, t);
      }
      return;
    }
    // The fp32 partials are staged in all of the group's tiles (BM rows of D
    // floats fit: 2·ST·BN ≥ BM), once every warp of the group is done with K and
    // V; 16-byte chunks swizzled by row, so the 8-byte writes of 8 rows at a time
    // take two wavefronts.
    group_sync();
    float* tile = reinterpret_cast<float*>(group_smem);
    auto at = [&](int row, int chunk) { return tile + row * D + ((chunk ^ (row & 7)) << 2); };
    const int64_t bh0 = ((int64_t)b * p.heads + h) * p.seqlen_q;
    const int64_t part0 = (int64_t)split * p.batch * p.heads * p.seqlen_q + bh0 + m0;  // row m0's partial
    stage([&](int row, int dt, float x,
              float y) { *reinterpret_cast<float2*>(at(row, 2 * dt + t / 2) + 2 * (t % 2)) = make_float2(x, y); },
          [&](int row, float lse) { p.lse_partial[part0 + row] = lse; });
    copy_rows(std::integral_constant<int, D / 4>{}, [&](int row, int chunk) {
      *reinterpret_cast<float4*>(p.o_partial + (part0 + row) * D + 4 * chunk) =
          *reinterpret_cast<const float4*>(at(row, chunk));
    });
    return;
  }
  // Unsplit, O is staged in the warp's own rows of the Q tile (swizzled like Q, so
  // the 4-byte writes are conflict-free; as the Hopper kernel's epilogue). Two
  // groups: the hand-over slots lie in these tiles, so
  // group 0's warps first finish reading them.
  if constexpr (KG == 2) group_sync();
  stage([&](int row, int dt, float x,
            float y) { *reinterpret_cast<uint32_t*>(sQ + swizzle<D>(row, 8 * dt + 2 * t)) = Dtype<T>::pack(x, y); },
        [&](int row, float lse) {
          if (p.lse != nullptr) p.lse[((int64_t)b * p.heads + h) * p.seqlen_q + m0 + row] = lse;
        });
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
  copy_rows(std::integral_constant<int, D / 8>{}, [&](int row, int chunk) {
    *reinterpret_cast<uint4*>(out + (int64_t)(m0 + row) * p.o_row_stride + 8 * chunk) =
        *reinterpret_cast<const uint4*>(sQ + swizzle<D>(row, 8 * chunk));
  });
}

// Merges split partials by log-sum-exp: O = Σ_s w_s·O_s / Σ_s w_s with
// w_s = exp(lse_s − max_s lse_s), online over the splits. One warp per row; each
// lane owns D/32 columns, one 8- or 16-byte load per split. Four splits' loads
// are in flight at once (indices clamped, weights of the extra ones 0): a pass
// for the maximum and a second for the sum cost two L2 round trips per split.
template <typename T, int D>
__device__ __forceinline__ void flash_combine(const CombineParams& p) {
  constexpr int kPerLane = D / 32;
  static_assert(kPerLane == 2 || kPerLane == 4, "a float2 or float4 per lane");
  using Vec = std::conditional_t<kPerLane == 4, float4, float2>;
  constexpr int kBatch = 4;
  const int64_t rows = (int64_t)p.batch * p.heads * p.seqlen_q;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc[kPerLane] = {};
  float mx = -INFINITY, total = 0.f;
  for (int s0 = 0; s0 < p.num_splits; s0 += kBatch) {
    float l[kBatch];
    Vec x[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t part = (int64_t)min(s0 + j, p.num_splits - 1) * rows + row;
      l[j] = p.lse_partial[part];
      x[j] = *reinterpret_cast<const Vec*>(p.o_partial + part * D + lane * kPerLane);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float lj = s0 + j < p.num_splits ? l[j] : -INFINITY;  // a split that saw no key: −inf too
      const float nm = fmaxf(mx, lj), base = exp_base(nm);
      const float a = __expf(mx - base), w = __expf(lj - base);
      const float* xv = reinterpret_cast<const float*>(&x[j]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] = acc[i] * a + w * xv[i];
      total = total * a + w;
      mx = nm;
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;  // no split saw a key: zeros, LSE −inf
  const int qrow = row % p.seqlen_q, bh = row / p.seqlen_q;
  const int b = bh / p.heads, h = bh % p.heads;
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)qrow * p.o_row_stride +
           lane * kPerLane;
  uint32_t packed[kPerLane / 2];
#pragma unroll
  for (int i = 0; i < kPerLane / 2; ++i) packed[i] = Dtype<T>::pack(acc[2 * i] * inv, acc[2 * i + 1] * inv);
  if constexpr (kPerLane == 4) {
    *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<uint32_t*>(out) = packed[0];
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = total > 0.f ? mx + __logf(total) : -INFINITY;
}

}  // namespace fa

// One stable extern "C" forward entry: flash_fwd_<dtype>_d<D>[_causal][_m64|_kg2].
// MT: 16-row tiles per warp; KG: key groups; ST: K/V stages (2: the pipelined schedule).
#define FA_FWD_ENTRY(T, D, CAUSAL, MT, KG, ST, NAME)                                      \
  extern "C" __global__ void __launch_bounds__(fa::FwdConfig<D, MT, KG, ST>::kThreads, 1) \
      NAME(const fa::FlashParams p) {                                                     \
    fa::flash_fwd<T, D, CAUSAL, MT, KG, ST>(p);                                           \
  }
// Every forward entry of one dtype: two 16-row tiles per warp, or one (`_m64`,
// for problems that would not fill the GPU), or one with two key groups (`_kg2`,
// for grids of at most one CTA per SM); causal D=64 one tile only (two lost 7%).
// The D=64 two-group entry runs the pipelined schedule (two K/V stages: 80 KB, one
// CTA per SM on an L4 as its registers allow anyway); elsewhere a second stage
// would cost resident CTAs on an L4 (100 KB per SM) or not fit it (D=128: 160 KB).
#define FA_FWD_ENTRIES(T, DT)                                       \
  FA_FWD_ENTRY(T, 64, false, 2, 1, 1, flash_fwd_##DT##_d64)         \
  FA_FWD_ENTRY(T, 64, false, 1, 1, 1, flash_fwd_##DT##_d64_m64)     \
  FA_FWD_ENTRY(T, 64, false, 1, 2, 2, flash_fwd_##DT##_d64_kg2)     \
  FA_FWD_ENTRY(T, 64, true, 1, 1, 1, flash_fwd_##DT##_d64_causal)   \
  FA_FWD_ENTRY(T, 128, false, 2, 1, 1, flash_fwd_##DT##_d128)       \
  FA_FWD_ENTRY(T, 128, false, 1, 1, 1, flash_fwd_##DT##_d128_m64)   \
  FA_FWD_ENTRY(T, 128, false, 1, 2, 1, flash_fwd_##DT##_d128_kg2)   \
  FA_FWD_ENTRY(T, 128, true, 2, 1, 1, flash_fwd_##DT##_d128_causal) \
  FA_FWD_ENTRY(T, 128, true, 1, 1, 1, flash_fwd_##DT##_d128_causal_m64)
