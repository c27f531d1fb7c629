// Hopper (sm_90a) primitives for the warp-specialised forward kernel: mbarriers,
// TMA bulk tensor loads, wgmma with shared-memory descriptors, setmaxnreg.
// Only flash_fwd_hopper_*.cu include this; they build for sm_90a alone.
#pragma once

#include <stdint.h>

#include "common.cuh"
#include "flash_params.h"

namespace fa {

// ------------------------------------------------------------- mbarrier --
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the initialised barriers visible to the async (TMA) proxy.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives and announces `bytes` of transactions (TMA completes them).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One arrival for the executing warp, by a lane elect.sync picks (no branch on
// the lane index): barriers the consumers release count warps, not threads
// (a 32nd of the arrivals).
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar) {
  asm volatile(
      "{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar)
      : "memory");
}
// Whether the phase with this parity has completed, without waiting (acquire
// when it has, as mbar_wait).
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}
// Blocks until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ------------------------------------------------------- named barriers --
// The Hopper kernel's named barriers (bar.sync / bar.arrive ids; 0 is
// __syncthreads). Consumer warpgroup c uses TurnWg0 + c (c = 0, 1: ping-pong and exp
// turns) and EpilogueWg0 + c (c = 0, 1, 2).
enum class NamedBarrier : int {
  TurnWg0 = 1,      // 256 threads: warpgroup 1 arrives to hand warpgroup 0 its turn; 0 waits
  TurnWg1 = 2,      // 256 threads: warpgroup 0 arrives to hand warpgroup 1 its turn; 1 waits
  EpilogueWg0 = 3,  // 128 threads: consumer warpgroup 0 around its O staging tile
  EpilogueWg1 = 4,  // 128 threads: consumer warpgroup 1 around its O staging tile
  EpilogueWg2 = 5,  // 128 threads: consumer warpgroup 2 around its O staging tile
  TurnSink = 6,     // 256 threads: hand-overs no warpgroup takes (a run's first and last); never waited on
  Merge = 7,        // 384 threads: the three consumer warpgroups around a split-tail item's merge
};

// Warpgroup cw's turn, and its epilogue barrier.
__device__ __forceinline__ NamedBarrier turn_of(int cw) {
  return static_cast<NamedBarrier>(static_cast<int>(NamedBarrier::TurnWg0) + cw);
}
__device__ __forceinline__ NamedBarrier epilogue_of(int cw) {
  return static_cast<NamedBarrier>(static_cast<int>(NamedBarrier::EpilogueWg0) + cw);
}

// `threads` threads meet at barrier `id`: sync waits, arrive only counts itself in.
__device__ __forceinline__ void named_bar_sync(NamedBarrier id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(NamedBarrier id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// ------------------------------------------------------------------ TMA --
// One box of a 4-D tensor map at coordinates (c0 innermost … c3) into shared
// memory; completes `bytes` (the whole box, zero-filled where out of bounds) on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const TmaDesc* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// The box at (c0 … c3) of a 4-D tensor map from shared memory at `src`, as one
// more copy of this thread's current bulk group (tma_store_commit closes it).
__device__ __forceinline__ void tma_store_4d(const TmaDesc* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's committed stores have read their shared memory (their
// global writes may still be in flight).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Orders this thread's shared-memory writes before later async-proxy (TMA) reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ------------------------------------------------------------ setmaxnreg --
// Hand registers from the producer warpgroup to the consumers (per-thread counts).
template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---------------------------------------------------------------- wgmma --
// Shared-memory matrix descriptor for the 128- or 64-byte swizzle (PANEL_BYTES;
// what TMA's SWIZZLE_128B/_64B writes): rows of PANEL_BYTES (64 or 32 16-bit
// elements, or e4m3 pairs), 8-row atoms of 8 × PANEL_BYTES whose base must be
// aligned to their size. `lbo`/`sbo` in bytes:
//   K-major (Q, K; e4m3 V, transposed before the kernel): sbo = 8 × PANEL_BYTES
//   between 8-row groups; lbo unused.
//   MN-major (16-bit V, transposed on read): sbo = 8 × PANEL_BYTES between 8-key
//   groups, lbo = the stride between panels of the N (head-dim) extent.
//
// The start address is bits 0-13 (address >> 4; shared memory lies below 256 KB,
// so the field never carries into the next), so the descriptor of base + offset
// is the base's with offset / 16 added to its low word. Kernels build one per
// buffer before their loops and advance it with `at`: one uniform add per wgmma,
// where masking and shifting each address takes four or five.
struct GmmaDesc {
  uint32_t lo, hi;
  template <int PANEL_BYTES>
  static __device__ __forceinline__ GmmaDesc make(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    static_assert(PANEL_BYTES == 128 || PANEL_BYTES == 64, "128- or 64-byte swizzle");
    return {((smem_addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16), high<PANEL_BYTES>(sbo)};
  }
  // The high word: sbo, and in bits 62-63 the layout (1 = SWIZZLE_128B, 2 = SWIZZLE_64B).
  template <int PANEL_BYTES>
  static __host__ __device__ constexpr uint32_t high(uint32_t sbo) {
    return ((sbo & 0x3FFFF) >> 4) | (PANEL_BYTES == 128 ? 1u << 30 : 2u << 30);
  }
  // The descriptor `units` × 16 bytes past the base. Callers scale each term
  // themselves: ptxas does not distribute a shift over a sum.
  __device__ __forceinline__ GmmaDesc plus(uint32_t units) const { return {lo + units, hi}; }
  __device__ __forceinline__ uint64_t at(uint32_t units) const { return ((uint64_t)hi << 32) | (lo + units); }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across an async wgmma.
template <int NT>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
  }
}

// Accumulator operand lists: d[N/8][4] in the mma.sync C layout per 8 columns
// (each warp of the warpgroup owns 16 of the 64 rows).
#define FA_WGMMA_ACC64(d)                                                                                      \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define FA_WGMMA_ACC96(d)                                                                                           \
  FA_WGMMA_ACC64(d), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]),      \
      "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), \
      "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
#define FA_WGMMA_REGS96                                                                                              \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
  "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}"
#define FA_WGMMA_ACC128(d)                                                                                            \
  FA_WGMMA_ACC96(d), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),  \
      "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), \
      "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define FA_WGMMA_REGS64                                             \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17," \
  "%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define FA_WGMMA_REGS128                                                                                \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"    \
  "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

#define FA_WGMMA_ACC192(d)                                                                                            \
  FA_WGMMA_ACC128(d), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), \
      "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), \
      "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), \
      "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), \
      "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3])
#define FA_WGMMA_REGS192                                                                                             \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
  "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
  "58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%" \
  "86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"

#define FA_WGMMA_ACC256(d)                                                                                            \
  FA_WGMMA_ACC192(d), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), \
      "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), \
      "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), \
      "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), \
      "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
#define FA_WGMMA_REGS256                                                                             \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,"  \
  "%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49," \
  "%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73," \
  "%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97," \
  "%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,"    \
  "%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"

// D (64×N, fp32) = A·B (+ D when accumulate): A and B from shared memory, both
// K-major. K: the instruction's k (16 for 16-bit types, 32 for e4m3); TAIL: the
// operands after the scale immediates (16-bit: both transpose flags, 0).
// A, B and SCALE name the operand numbers that follow the accumulators.
#define FA_WGMMA_SS(N, K, TY, TAIL, ACC, REGS, A, B, SCALE)                                                     \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " SCALE ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N "k" #K \
               ".f32." TY "." TY " " REGS ", " A ", " B ", p, 1, 1" TAIL ";\n}\n"                               \
               : ACC(d)                                                                                         \
               : "l"(a), "l"(b), "r"(accumulate))
// D (64×N, fp32) = A·B (+ D when accumulate): A (four registers per thread in the mma.sync A layout)
// from registers, B from shared memory: 16-bit MN-major (transposed on read:
// TAIL ", 1"), e4m3 K-major (TAIL "").
#define FA_WGMMA_RS(N, K, TY, TAIL, ACC, REGS, A, B, SCALE)                                                     \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " SCALE ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N "k" #K \
               ".f32." TY "." TY " " REGS ", " A ", " B ", p, 1, 1" TAIL ";\n}\n"                               \
               : ACC(d)                                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))

template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate);
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, int accumulate = 1);

#define FA_WGMMA_DEFINE(T, TY, K, SS_TAIL, RS_TAIL)                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_ss<T, 64>(float(&d)[8][4], uint64_t a, uint64_t b, int accumulate) {         \
    FA_WGMMA_SS(64, K, TY, SS_TAIL, FA_WGMMA_ACC64, FA_WGMMA_REGS64, "%32", "%33", "%34");                           \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_ss<T, 128>(float(&d)[16][4], uint64_t a, uint64_t b, int accumulate) {       \
    FA_WGMMA_SS(128, K, TY, SS_TAIL, FA_WGMMA_ACC128, FA_WGMMA_REGS128, "%64", "%65", "%66");                        \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<T, 64>(float(&d)[8][4], const uint32_t(&a)[4], uint64_t b,                \
                                                  int accumulate) {                                                  \
    FA_WGMMA_RS(64, K, TY, RS_TAIL, FA_WGMMA_ACC64, FA_WGMMA_REGS64, "{%32, %33, %34, %35}", "%36", "%37");          \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<T, 96>(float(&d)[12][4], const uint32_t(&a)[4], uint64_t b,               \
                                                  int accumulate) {                                                  \
    FA_WGMMA_RS(96, K, TY, RS_TAIL, FA_WGMMA_ACC96, FA_WGMMA_REGS96, "{%48, %49, %50, %51}", "%52", "%53");          \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<T, 128>(float(&d)[16][4], const uint32_t(&a)[4], uint64_t b,              \
                                                   int accumulate) {                                                 \
    FA_WGMMA_RS(128, K, TY, RS_TAIL, FA_WGMMA_ACC128, FA_WGMMA_REGS128, "{%64, %65, %66, %67}", "%68", "%69");       \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<T, 192>(float(&d)[24][4], const uint32_t(&a)[4], uint64_t b,              \
                                                   int accumulate) {                                                 \
    FA_WGMMA_RS(192, K, TY, RS_TAIL, FA_WGMMA_ACC192, FA_WGMMA_REGS192, "{%96, %97, %98, %99}", "%100", "%101");     \
  }                                                                                                                  \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<T, 256>(float(&d)[32][4], const uint32_t(&a)[4], uint64_t b,              \
                                                   int accumulate) {                                                 \
    FA_WGMMA_RS(256, K, TY, RS_TAIL, FA_WGMMA_ACC256, FA_WGMMA_REGS256, "{%128, %129, %130, %131}", "%132", "%133"); \
  }

FA_WGMMA_DEFINE(__half, "f16", 16, ", 0, 0", ", 1")
FA_WGMMA_DEFINE(__nv_bfloat16, "bf16", 16, ", 0, 0", ", 1")
// e4m3 pairs (the tiles' 16-bit columns): k32, both operands K-major.
FA_WGMMA_DEFINE(e4m3x2, "e4m3", 32, "", "")

}  // namespace fa
