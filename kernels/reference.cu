// A deliberately simple fp32 reference for shapes too large for the CPU
// reference: one block per query row, scores materialised in dynamic shared
// memory (seqlen_k floats), plain fp32 arithmetic, no tiling, no tensor cores.
#include "common.cuh"
#include "flash_params.h"

using namespace fa;

constexpr int kRefThreads = 256;

__device__ float block_reduce(float x, bool is_max) {
  __shared__ float partial[kRefThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  __syncthreads();
  x = partial[0];
  for (int w = 1; w < kRefThreads / 32; ++w) x = is_max ? fmaxf(x, partial[w]) : x + partial[w];
  __syncthreads();  // partial[] is reused by the next reduction
  return x;
}

template <typename T>
__device__ void reference(const ReferenceParams& p) {
  extern __shared__ float scores[];  // [seqlen_k]
  const int row = blockIdx.x, b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int kvh = h / (p.heads / p.kv_heads);
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + (int64_t)row * p.q_row_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + kvh * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + kvh * p.v_head_stride;
  const int diag = p.seqlen_k - p.seqlen_q;
  const int first_key = p.window_left < 0 ? 0 : max(0, row + diag - p.window_left);
  const int last_key = p.window_right < 0 ? p.seqlen_k - 1 : min(p.seqlen_k - 1, row + diag + p.window_right);

  float mx = -INFINITY;
  for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads) {
    float s = -INFINITY;
    if (j >= first_key && j <= last_key) {
      s = 0.f;
      for (int d = 0; d < p.head_dim; ++d)
        s += Dtype<T>::to_float(q[d]) * Dtype<T>::to_float(k[(int64_t)j * p.k_row_stride + d]);
      s *= p.scale;
      if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    }
    scores[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_reduce(mx, true);
  float sum = 0.f;
  for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads) {
    const float e = mx == -INFINITY ? 0.f : expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);  // also orders the scores[] writes before the reads below
  const int64_t out_row = ((int64_t)b * p.heads + h) * p.seqlen_q + row;
  for (int d = threadIdx.x; d < p.head_dim; d += kRefThreads) {
    float acc = 0.f;
    for (int j = first_key; j <= last_key; ++j)
      acc += scores[j] * Dtype<T>::to_float(v[(int64_t)j * p.v_row_stride + d]);
    p.o[out_row * p.head_dim + d] = sum > 0.f ? acc / sum : 0.f;
  }
  if (threadIdx.x == 0) p.lse[out_row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

extern "C" __global__ void __launch_bounds__(kRefThreads) reference_attention_f16(const ReferenceParams p) {
  reference<__half>(p);
}
extern "C" __global__ void __launch_bounds__(kRefThreads) reference_attention_bf16(const ReferenceParams p) {
  reference<__nv_bfloat16>(p);
}
