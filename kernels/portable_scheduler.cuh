// The portable kernel's work per CTA: one query block of one (batch, head) and
// one key split, named by the 3-D grid, and the keys its rows see.
#pragma once

#include "flash_params.h"

namespace fa {

// Query rows m0 … m0 + BM − 1 of (b, h) in key split `split`.
template <int BM, bool CAUSAL>
struct PortableBlock {
  const int b, h, kvh, split;
  // Causal: the last query blocks see the most keys; hand them out first so the
  // longest CTAs do not start in the final wave.
  const int m0;

  __device__ __forceinline__ explicit PortableBlock(const FlashParams& p)
      : b(blockIdx.y / p.heads),
        h(blockIdx.y % p.heads),
        kvh(h / (p.heads / p.kv_heads)),
        split(blockIdx.z),
        m0((CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM) {}
};

// The keys [begin, end) a block's rows see in its split.
template <int BM, bool CAUSAL>
struct KeyRange {
  const int diag;  // bottom-right causal alignment: row i sees keys j <= i + diag
  const int begin;
  int end;

  __device__ __forceinline__ KeyRange(const FlashParams& p, const PortableBlock<BM, CAUSAL>& blk)
      : diag(p.seqlen_k - p.seqlen_q),
        begin(blk.split * p.keys_per_split),
        end(min(p.seqlen_k, begin + p.keys_per_split)) {
    if (CAUSAL) end = min(end, blk.m0 + BM + diag);  // one past the last key any row here sees
  }
};

}  // namespace fa
