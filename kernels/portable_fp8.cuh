// The portable kernel over e4m3 inputs (built for sm_89 and sm_90: mma.sync m16n8k32): Q, K and V
// in e4m3 with factors per (batch, K/V head), O in f16 or bf16. The dense
// kernel's parts run unchanged over tiles of e4m3 pairs (a 16-bit column holds
// two elements, kTileCols = D / 2 a row): the block, key range, mask, cp.async
// tile loads, mainloop, softmax and epilogue. Its own parts:
//   Fp8Config             tiles per head dim
//   WarpMma<e4m3x2, Cfg>  Q·Kᵀ and P·V on m16n8k32, P quantised as it enters
// and two passes over whole tensors, which kernel-ffi launches before other
// kernels' calls: transpose_v_e4m3 (V for the Hopper kernel's e4m3 entries) and
// dequantise_e4m3 (e4m3 inputs where no e4m3 entry runs the call:
// forward_dequantised).
//
// Numerics. Q·Kᵀ is exact in fp32 (products of e4m3 values, 32-term sums). Its
// factors q_descale · k_descale join the softmax scale, so the row max, the sums
// and the LSE are those of the dequantised scores. P is quantised as 2^8 · p
// (fp8.cuh). The row sums are fp32 from the unquantised p, and
// O = v_descale · 2^-8 · Σ P̃ V / l: P̃'s rounding (at most 2^-4 relative) is
// the error the output carries.
#pragma once

#include "flash_fwd.cuh"
#include "fp8.cuh"

namespace fa {

// One tile configuration per head dim: four warps of one 16-row tile, keys in
// steps of 32. The e4m3 tiles are half the 16-bit ones' bytes, so D ≤ 128 take
// 128-key tiles; D=256 64 (its O takes 128 registers a thread). Shared memory
// also holds the split epilogue's fp32 O (kBlockM × D floats), which at D=256
// outgrows the tiles.
template <int D>
struct Fp8Config {
  static_assert(D == 64 || D == 128 || D == 256, "e4m3 head dims: 64, 128 or 256");
  static constexpr int kHeadDim = D;
  static constexpr int kTileCols = D / 2;  // 16-bit columns (e4m3 pairs) of a tile row
  static constexpr int kWarps = 4, kKeyGroups = 1, kRowTiles = 1;
  static constexpr int kGroupThreads = 32 * kWarps, kThreads = kGroupThreads;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = D == 256 ? 64 : 128;
  static_assert(kBlockN % 32 == 0, "P·V takes 32-key steps");
  static constexpr int kGroupSmemBytes = (kBlockM + 2 * kBlockN) * D;
  static constexpr int kStagedBytes = kBlockM * D * 4;
  static constexpr int kSmemBytes = kGroupSmemBytes > kStagedBytes ? kGroupSmemBytes : kStagedBytes;
  static_assert(kBlockM * D * 2 <= kSmemBytes, "the unsplit epilogue's 16-bit O fits");
  static_assert((kBlockM * kTileCols / 8) % kGroupThreads == 0 && (kBlockN * kTileCols / 8) % kGroupThreads == 0,
                "every thread copies the same number of chunks");

  // After WarpMma::finish, O pair dt of thread t holds columns
  // 16·(dt/2) + 4t + 2·(dt%2) and the next (P·V's column order, see pv).
  __device__ __forceinline__ static constexpr int pair_col(int dt, int t) {
    return 16 * (dt / 2) + 4 * t + 2 * (dt % 2);
  }
  __device__ __forceinline__ static int2 pair_chunk4(int dt, int t) {
    return make_int2(4 * (dt / 2) + t, 2 * (dt % 2));
  }
};

// Lane l's row of a 32-key step of a V tile (C 16-bit columns a row), for
// ldmatrix.trans of four 8-key matrices (keys +0..7, +8..15, +16..23, +24..31)
// at one 16-byte chunk. Row 32·kk + l has lane l's swizzle term, and the row's
// base lies on a swizzle group's boundary, so a chunk is one XOR away.
template <int C>
struct VRows {
  static constexpr int kGroup = kSwizzleChunks<C>;
  static_assert((2 * C) % (16 * kGroup) == 0, "rows start on swizzle-group boundaries");
  uint32_t row;  // the tile's 128-byte aligned base + row l, its swizzle term in the chunk bits

  __device__ __forceinline__ VRows(uint32_t tile, int lane) : row(tile + lane * 2 * C + (swizzle_xor<C>(lane) << 4)) {}
  __device__ __forceinline__ uint32_t at(int kk, int chunk) const {
    return (row ^ ((chunk % kGroup) << 4)) + (chunk / kGroup) * kGroup * 16 + kk * 32 * 2 * C;
  }
};

// A warp's matrix products on e4m3 tiles. Q·Kᵀ is the 16-bit entries' (WarpQk:
// the fragments match byte for byte), one m16n8k32 per 16 columns of pairs.
// P·V keeps P where the accumulators hold it: thread
// (g, t) has keys 2t, 2t+1, 8+2t, 9+2t of each 16, which become its A
// fragment's k = 4t … 4t+3, and V's B fragment is read in the same key order
// (see pv), so no value crosses lanes.
template <typename Cfg>
struct WarpMma<e4m3x2, Cfg> : WarpQk<e4m3x2, Cfg, Cfg::kTileCols * Cfg::kRowTiles <= 64> {
  // Q fragments stay in registers up to D=128 (16 a thread); D=256 re-reads them.
  using Qk = WarpQk<e4m3x2, Cfg, Cfg::kTileCols * Cfg::kRowTiles <= 64>;
  static constexpr int D = Cfg::kHeadDim, C = Cfg::kTileCols, MT = Cfg::kRowTiles, BN = Cfg::kBlockN, NT = BN / 8;
  using typename Qk::KFrag;
  using typename Qk::QFrags;
  using VFrag = VRows<C>;
  const VFrag& v_frag;

  __device__ __forceinline__ WarpMma(QFrags& qf, const KeyGroup<e4m3x2, Cfg>& grp, int w0, int lane,
                                     const KFrag& k_frag, const VFrag& v_frag)
      : Qk{qf, grp.q, w0, lane, k_frag}, v_frag(v_frag) {}

  __device__ __forceinline__ static VFrag v_frag_addr(const KeyGroup<e4m3x2, Cfg>& grp, int lane) {
    return VFrag(smem_u32(grp.v), lane);
  }

  // P of 32-key step kk as an A fragment, in the accumulators' key order (fp8.cuh).
  __device__ __forceinline__ static void p_fragment(uint32_t (&pf)[4], const float (&s)[NT][4], int kk) {
    p_fragment_e4m3(pf, s, kk);
  }

  // O += P·V. Per 32-key step and 16 columns of D (one 16-byte chunk of V's
  // rows): ldmatrix.trans of the four 8-key matrices gives thread (g, t), of
  // matrix j, keys 8j+2t and 8j+2t+1 at columns 2g and 2g+1; two byte permutes
  // per 16 keys gather P's key order at column 2g (even) or 2g+1 (odd). So the
  // even mma's n = g is column 16c + 2g, the odd one's 16c + 2g + 1.
  template <typename PFrag>
  __device__ __forceinline__ void pv(float (&o)[MT][D / 8][4], PFrag&& p_frag) const {
#pragma unroll
    for (int kk = 0; kk < BN / 32; ++kk) {
      uint32_t pf[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) p_frag(pf[mt], mt, kk);
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_frag.at(kk, c));
        const uint32_t even0 = __byte_perm(vf[0], vf[1], 0x6420), odd0 = __byte_perm(vf[0], vf[1], 0x7531);
        const uint32_t even1 = __byte_perm(vf[2], vf[3], 0x6420), odd1 = __byte_perm(vf[2], vf[3], 0x7531);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16832_e4m3(o[mt][2 * c], pf[mt], even0, even1);
          mma_16832_e4m3(o[mt][2 * c + 1], pf[mt], odd0, odd1);
        }
      }
    }
  }

  // O as the epilogue takes it: each thread's even and odd accumulators (columns
  // 16c + 4t, +2 and 16c + 4t + 1, +3) regrouped into consecutive pairs
  // (Fp8Config::pair_col), times v_descale · 2^-8.
  __device__ __forceinline__ static void finish(float (&o)[MT][D / 8][4], float v_descale) {
    const float f = v_descale / kE4m3PScale;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        float(&e)[4] = o[mt][2 * c];
        float(&d)[4] = o[mt][2 * c + 1];
        const float e1 = e[1], e3 = e[3];
        e[0] *= f;
        e[1] = d[0] * f;
        e[2] *= f;
        e[3] = d[2] * f;
        d[0] = e1 * f;
        d[1] *= f;
        d[2] = e3 * f;
        d[3] *= f;
      }
    }
  }
};

// A dense block of e4m3 inputs: flash_fwd's parts over e4m3 tiles, the
// descales folded into the softmax scale and O.
template <typename Out, int D, typename Mask>
__device__ __forceinline__ void flash_fwd_e4m3(const Fp8Params& fp) {
  const FlashParams& p = fp.p;
  using Cfg = Fp8Config<D>;
  using Tiles = DenseTiles<e4m3x2, Cfg, Mask>;
  using Mainloop = PortableMainloop<e4m3x2, Cfg, Tiles, NoSoftcap>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if (dynamic_smem_size() < Cfg::kSmemBytes || blockDim.x != Cfg::kThreads) __trap();
  launch_dependents();
  const KeyGroup<e4m3x2, Cfg> grp(smem_raw);
  const WarpRows<1> wr(grp.tid);
  const PortableBlock<BM, Mask> blk(p);
  const Fp8Descale descale(fp.q_descale, fp.k_descale, fp.v_descale, blk.b * p.kv_heads + blk.kvh);
  const KeyRange<BM, BN, Mask> keys(p, blk);
  const HeadTensors<e4m3x2> in(p, blk);
  float o[1][D / 8][4];
  SoftmaxState<1> softmax;
  Mainloop::clear(o, softmax);
  typename Mainloop::QFrags qf;
  const int w0 = wr.w0();
  const TileLoads<e4m3x2, Cfg> loads(p, grp, in);
  const Tiles tiles{p, blk, keys, loads};
  const typename Mainloop::KFrag k_frag = Mainloop::k_frag_addr(grp, wr.lane);
  const typename Mainloop::VFrag v_frag = Mainloop::v_frag_addr(grp, wr.lane);
  const Mainloop mainloop{tiles, grp, wr, w0, p.scale_log2 * descale.qk, k_frag, v_frag, NoSoftcap(p)};
  {
    float s[1][BN / 8][4];
    mainloop.run(o, softmax, qf, s);
  }
  Mainloop::Mma::finish(o, descale.v);
  portable_epilogue<Out, Cfg>(p, DenseRows(p, blk), blk.split, grp, wr, w0, o, softmax);
}

// Sixteen e4m3 values (one 16-byte chunk) to f16 pairs (cvt.f16x2.e4m3x2, exact).
__device__ __forceinline__ void unpack_e4m3x16(const uint4& in, __half2 (&out)[8]) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t pair = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
    uint32_t h = 0;
#if __CUDA_ARCH__ >= 890
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(pair));
#else
    __trap();
#endif
    out[i] = *reinterpret_cast<__half2*>(&h);
  }
}

// A tensor's e4m3 values times their factor, as Out (DequantParams): a thread
// per 16-byte chunk, rows taken in the output's [B, S, H] order so that the
// stores are contiguous. f16 keeps e4m3 exactly; the factor's product rounds
// once, to Out.
template <typename Out>
__device__ __forceinline__ void dequantise_e4m3(const DequantParams& p) {
  const int chunks = p.head_dim / 16;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (int64_t)p.batch * p.rows * p.heads * chunks) return;
  const int c = (int)(i % chunks);
  const int64_t row = i / chunks;  // (b · rows + s) · heads + h
  const int h = (int)(row % p.heads), s = (int)(row / p.heads % p.rows), b = (int)(row / p.heads / p.rows);
  const float f = p.descale != nullptr ? p.descale[b * p.kv_heads + h / p.group] : 1.f;
  const unsigned char* src = static_cast<const unsigned char*>(p.src) + b * p.batch_stride + h * p.head_stride +
                             (int64_t)s * p.row_stride + 16 * c;
  __half2 in[8];
  unpack_e4m3x16(*reinterpret_cast<const uint4*>(src), in);
  uint32_t out[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 x = __half22float2(in[j]);
    out[j] = Dtype<Out>::pack(x.x * f, x.y * f);
  }
  uint4* dst = reinterpret_cast<uint4*>(static_cast<Out*>(p.dst) + row * p.head_dim + 16 * c);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// V [B, Hkv, Sk, D] as the Hopper kernel's e4m3 P·V reads it (TransposeParams):
// Vᵀ, [B, Hkv, D, keys] contiguous, each 16 keys in P's k order (k-th byte of
// a 16-key run is key pv_key(k) of it) and zeros past Sk, so that a key tile is
// K-major for wgmma. A block of kTransposeThreads moves 128 keys × 64 columns of
// one (batch, head) through shared memory: in, 16-byte chunks of key rows; out,
// each thread 16 keys of 4 columns, 4 × 4 byte blocks turned by byte permutes.
constexpr int kTransposeThreads = 128;
__device__ __forceinline__ void transpose_v_e4m3(const TransposeParams& p) {
  constexpr int kKeys = 128, kCols = 64, kRowWords = kCols / 4;
  // Key row k at word 16k + 4·(k / 16): the skew puts a warp's 8 runs of 16
  // keys on different banks.
  auto row = [](int k) { return k * kRowWords + 4 * (k / 16); };
  __shared__ __align__(16) uint32_t tile[kKeys * kRowWords + 4 * (kKeys / 16)];
  if (blockDim.x != kTransposeThreads) __trap();  // the manifest's launch geometry: a mismatch is a build bug
  launch_dependents();                            // the Hopper e4m3 entry, whose V loads wait for this grid
  const int key0 = blockIdx.x * kKeys, col0 = blockIdx.y * kCols;
  const int bh = blockIdx.z, b = bh / p.heads, h = bh % p.heads;
  const unsigned char* src = static_cast<const unsigned char*>(p.src) + b * p.batch_stride + h * p.head_stride + col0;
  for (int c = threadIdx.x; c < kKeys * 4; c += kTransposeThreads) {
    const int k = c / 4, chunk = c % 4;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + k < p.rows) x = *reinterpret_cast<const uint4*>(src + (int64_t)(key0 + k) * p.row_stride + 16 * chunk);
    *reinterpret_cast<uint4*>(&tile[row(k) + 4 * chunk]) = x;
  }
  __syncthreads();
  // Keys key0 + 16·run …, columns col0 + 4·quad …: a warp's 8 runs of one
  // column are 128 contiguous bytes of Vᵀ.
  const int run = threadIdx.x % 8, quad = threadIdx.x / 8;
  if (key0 + 16 * run >= p.keys) return;
  uint32_t out[4][4];  // [column][word]: word j holds keys pv_key(4j … 4j+3) = 2j, 2j+1, 2j+8, 2j+9
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int k = 16 * run + 2 * j;
    const uint32_t a = tile[row(k) + quad], bb = tile[row(k + 1) + quad];
    const uint32_t c = tile[row(k + 8) + quad], d = tile[row(k + 9) + quad];
    const uint32_t ab_lo = __byte_perm(a, bb, 0x5140), ab_hi = __byte_perm(a, bb, 0x7362);  // a0 b0 a1 b1, a2 b2 a3 b3
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    out[0][j] = __byte_perm(ab_lo, cd_lo, 0x5410);  // a0 b0 c0 d0: column 0's keys in P's order
    out[1][j] = __byte_perm(ab_lo, cd_lo, 0x7632);
    out[2][j] = __byte_perm(ab_hi, cd_hi, 0x5410);
    out[3][j] = __byte_perm(ab_hi, cd_hi, 0x7632);
  }
  unsigned char* dst = static_cast<unsigned char*>(p.dst) + key0 + 16 * run;
#pragma unroll
  for (int m = 0; m < 4; ++m)
    *reinterpret_cast<uint4*>(dst + ((int64_t)bh * p.head_dim + col0 + 4 * quad + m) * p.keys) =
        make_uint4(out[m][0], out[m][1], out[m][2], out[m][3]);
}

}  // namespace fa

// The dequantisation entries: dequantise_e4m3_<out dtype>, 256 threads a block.
#define FA_DEQUANTISE_ENTRY(OUT, DT)                                                                  \
  extern "C" __global__ void __launch_bounds__(256) dequantise_e4m3_##DT(const fa::DequantParams p) { \
    fa::dequantise_e4m3<OUT>(p);                                                                      \
  }

// transpose_v_e4m3: blocks of kTransposeThreads, grid (⌈keys / 128⌉, D / 64, B × Hkv).
#define FA_TRANSPOSE_ENTRY                                                                                            \
  extern "C" __global__ void __launch_bounds__(fa::kTransposeThreads) transpose_v_e4m3(const fa::TransposeParams p) { \
    fa::transpose_v_e4m3(p);                                                                                          \
  }

// One stable extern "C" entry: flash_fwd_e4m3_<out dtype>_d<D>[_causal].
#define FA_E4M3_ENTRY(OUT, D, MASK, NAME)                                                                   \
  extern "C" __global__ void __launch_bounds__(fa::Fp8Config<D>::kThreads, 1) NAME(const fa::Fp8Params p) { \
    fa::flash_fwd_e4m3<OUT, D, fa::MASK>(p);                                                                \
  }
#define FA_E4M3_ENTRIES_D(OUT, DT, D)                       \
  FA_E4M3_ENTRY(OUT, D, NoMask, flash_fwd_e4m3_##DT##_d##D) \
  FA_E4M3_ENTRY(OUT, D, CausalMask, flash_fwd_e4m3_##DT##_d##D##_causal)
// Every e4m3 entry with output type OUT (DT its name).
#define FA_E4M3_ENTRIES(OUT, DT) \
  FA_E4M3_ENTRIES_D(OUT, DT, 64) FA_E4M3_ENTRIES_D(OUT, DT, 128) FA_E4M3_ENTRIES_D(OUT, DT, 256)
