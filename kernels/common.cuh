// Shared device helpers for the sm_80+ attention kernels: mma.sync, ldmatrix,
// cp.async wrappers, the shared-memory swizzle, and dtype traits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "flash_params.h"

namespace fa {

// ---------------------------------------------------------------- dtypes --
// Element traits: the 16-bit storage type, its packed pair, and the mma name.
template <typename T>
struct Dtype;
template <>
struct Dtype<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct Dtype<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// ------------------------------------------------------------------ mma --
// D = A·B + D for m16n8k16 with fp32 accumulators. Fragment ownership (g = lane/4,
// t = lane%4): A a0:(g,2t) a1:(g+8,2t) a2:(g,2t+8) a3:(g+8,2t+8), pairs along k;
// B b0:(k=2t,n=g) b1:(k=2t+8,n=g); C c0,c1:(g,2t..2t+1) c2,c3:(g+8,2t..2t+1).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// FP8 (e4m3; mma.sync from sm_89): two elements, as the FP8 entries' tiles move them (a
// 16-bit column each: the tiles, copies and ldmatrix reads of the 16-bit
// entries, over D / 2 columns a row).
struct e4m3x2 {
  uint16_t bits;
};

// Bytes of one input element of type T (e4m3x2: one, its pair two).
template <typename T>
constexpr int kElementBytes = 2;
template <>
constexpr int kElementBytes<e4m3x2> = 1;

// D = A·B + D for m16n8k32 e4m3 with fp32 accumulators. Byte j of each register
// (t = lane%4): A a0:(g,4t+j) a1:(g+8,4t+j) a2:(g,16+4t+j) a3:(g+8,16+4t+j);
// B b0:(k=4t+j,n=g) b1:(k=16+4t+j,n=g); C as m16n8k16's. Byte for byte these are
// m16n8k16's 16-bit fragments, so the same ldmatrix reads load Q and K.
// (The FP8 sources build for sm_89 and up only; elsewhere these are never called.)
__device__ __forceinline__ void mma_16832_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// One 16-column step of Q·Kᵀ on mma.sync: m16n8k16 on 16-bit elements, and on
// e4m3 pairs (a 16-bit column holds two) m16n8k32, whose fragments are the same
// bytes (mma_16832_e4m3).
template <typename T>
struct QkStep {
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_16816<T>(d, a, b0, b1);
  }
};
template <>
struct QkStep<e4m3x2> {
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_16832_e4m3(d, a, b0, b1);
  }
};

// Four floats to e4m3, rounded to nearest and saturated at ±448; byte j is x_j.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint16_t lo = 0, hi = 0;  // cvt puts its first source in the upper byte
#if __CUDA_ARCH__ >= 890
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
#else
  __trap();
#endif
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// ------------------------------------------------------------- ldmatrix --
// Four 8x8 b16 matrices; lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// Same, transposed on delivery (used for V, stored [key][d] but consumed as B(k=key, n=d)).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ------------------------------------------------------------- cp.async --
// 16-byte global→shared copy; src_bytes = 0 zero-fills the destination without
// reading global memory (tail rows past the sequence end).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t dynamic_smem_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(r));
  return r;
}

// ------------------------------------------- programmatic dependent launch --
// A split launch's combine is launched as a programmatic dependent of the
// forward kernel, and the Hopper e4m3 entry as one of transpose_v_e4m3 (sm_90+;
// both calls are no-ops on older archs and where the next launch is an ordinary
// one). Each CTA of the first grid lets the next launch as soon as it has
// started, so the dependent's CTAs take the SM slots it frees; the dependent
// waits for the whole grid and its writes before it reads them.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// -------------------------------------------------------- planted slowdown --
// FA_PLANT_SLOWDOWN=N (proving the gate and its explanations only): a dependent
// chain of N FMAs wherever a kernel part calls this, once per key tile. The chain
// stays positive from threadIdx.x ≥ 0, so `sink` (an output accumulator no MMA
// has in flight) never changes; using it keeps ptxas from dropping the chain.
__device__ __forceinline__ void plant_slowdown(float& sink) {
#ifdef FA_PLANT_SLOWDOWN
  float chain = static_cast<float>(threadIdx.x);
#pragma unroll 1
  for (int i = 0; i < FA_PLANT_SLOWDOWN; ++i) chain = fmaf(chain, 0.999f, 1e-7f);
  if (chain < 0.f) sink += chain;
#endif
}

// ------------------------------------------------------------- division --
// n / d for 0 <= n < 2^31: a multiply-high and a shift (FastDiv).
__device__ __forceinline__ int fast_div(const FastDiv& d, int n) {
  return d.div == 1 ? n : (int)(__umulhi((uint32_t)n, d.mul) >> d.shr);
}

// -------------------------------------------------------------- swizzle --
// A tile of rows × COLS 16-bit elements, stored in 16-byte chunks whose index is
// XORed within groups of kSwizzleChunks<COLS>. ldmatrix reads 8 rows at one
// logical chunk, which must land in 8 distinct 16-byte bank groups:
//   COLS a multiple of 64: groups of 8 chunks, chunk ^ (row % 8) (unswizzled,
//     rows 128 or 256 bytes apart would hit the same banks 8 times over);
//   COLS an odd multiple of 32 (96): rows an odd multiple of 64 bytes apart, so
//     odd rows sit half a bank line from even ones; groups of 4 chunks,
//     chunk ^ ((row / 2) % 4), spread each parity's 4 rows over the other 4 slots.
template <int COLS>
inline constexpr int kSwizzleChunks = COLS % 64 == 0 ? 8 : 4;

// The term a row's chunks are XORed with.
template <int COLS>
__device__ __forceinline__ int swizzle_xor(int row) {
  static_assert(COLS % 32 == 0, "swizzle needs whole groups of 4 chunks of 8 elements per row");
  return kSwizzleChunks<COLS> == 8 ? row & 7 : (row >> 1) & 3;
}

template <int COLS>
__device__ __forceinline__ int swizzle(int row, int col) {
  return row * COLS + ((((col >> 3) ^ swizzle_xor<COLS>(row))) << 3) + (col & 7);
}

// -------------------------------------------------------- named barriers --
// THREADS threads meet at the compile-time barrier ID (1…15; 0 is
// __syncthreads): a kernel whose ids are all immediates gets only the barriers
// it names from ptxas, not all sixteen. Each kernel names its ids in an enum.
template <auto ID, int THREADS>
__device__ __forceinline__ void named_bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(static_cast<int>(ID)), "n"(THREADS) : "memory");
}

// The portable kernel's two key groups: each group's warps meet at their own.
enum class KeyGroupBarrier : int { Group0 = 1, Group1 = 2 };

// ------------------------------------------------------------ reductions --
// Max / sum across the 4 lanes of a quad (the lanes sharing one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fa

// ENTRIES(T, DT, D) for every head dim the kernels serve (fa_schema's
// HEAD_DIMS; the manifest names each entry).
#define FA_EVERY_HEAD_DIM(ENTRIES, T, DT) \
  ENTRIES(T, DT, 64) ENTRIES(T, DT, 96) ENTRIES(T, DT, 128) ENTRIES(T, DT, 192) ENTRIES(T, DT, 256)
