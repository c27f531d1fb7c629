// The portable kernel's work per CTA, named by the 3-D grid, and the keys its
// rows see: one query block of one (batch, head) and one key split; or, in the
// `_varlen` entries, one block of a sequence's rows for one K/V head (its query
// heads' rows packed together, GQA) and one key split.
#pragma once

#include "flash_params.h"
#include "seqinfo.cuh"

namespace fa {

// Query rows m0 … m0 + BM − 1 of (b, h) in key split `split`.
template <int BM, typename Mask>
struct PortableBlock {
  const int b, h, kvh, split;
  // Masks that bound a row's last key (causal): the last query blocks see the
  // most keys; hand them out first so the longest CTAs do not start in the final wave.
  const int m0;

  __device__ __forceinline__ explicit PortableBlock(const FlashParams& p)
      : b(blockIdx.y / p.heads),
        h(blockIdx.y % p.heads),
        kvh(h / (p.heads / p.kv_heads)),
        split(blockIdx.z),
        m0((Mask::kEnd ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM) {}
};

// The keys [begin, end) a block's rows see in its split, and its mask. A band
// that starts inside the split starts the range at its key tile (BN keys), so
// that tiles never reach into the next split.
template <int BM, int BN, typename Mask>
struct KeyRange {
  const Mask mask;  // bottom-right aligned: diag = seqlen_k − seqlen_q
  int begin;
  int end;

  __device__ __forceinline__ KeyRange(const FlashParams& p, const PortableBlock<BM, Mask>& blk)
      : mask(p, p.seqlen_k - p.seqlen_q),
        begin(blk.split * p.keys_per_split),
        end(min(p.seqlen_k, begin + p.keys_per_split)) {
    mask.template clip<BN>(blk.m0, blk.m0 + BM - 1, begin, end);
  }
};

// Packed rows m0 … m0 + BM − 1 of sequence `seq`'s K/V head `kvh` in key split
// `split`. The sequence's query rows are packed with the group of query heads
// that share the K/V head, each K/V tile serving all of them: packed row i is
// token i / group of query head kvh · group + i % group.
template <int BM, typename Mask>
struct VarlenBlock {
  const int seq, kvh, split;
  const int m0;  // causal: the last blocks first, as PortableBlock
  const SeqInfo info;
  const int rows;  // the sequence's packed rows: q_len × group

  __device__ __forceinline__ VarlenBlock(const FlashParams& p, const SeqParams& sp)
      : seq(blockIdx.y / p.kv_heads),
        kvh(blockIdx.y % p.kv_heads),
        split(blockIdx.z),
        m0((Mask::kEnd ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM),
        info(p, sp, seq),
        rows(info.q_len * sp.group.div) {}

  __device__ __forceinline__ int token(int i, const SeqParams& sp) const { return fast_div(sp.group, i); }
};

// The keys [begin, end) a varlen block's rows see in its split, and the
// sequence's mask (bottom-right aligned to its own lengths). A band that starts
// inside the split starts the range at its key tile (BN keys).
template <int BM, int BN, typename Mask>
struct VarlenKeyRange {
  const Mask mask;
  int begin;
  int end;

  __device__ __forceinline__ VarlenKeyRange(const FlashParams& p, const SeqParams& sp, const VarlenBlock<BM, Mask>& blk)
      : mask(p, blk.info.diag()),
        begin(blk.split * p.keys_per_split),
        end(min(blk.info.k_len, begin + p.keys_per_split)) {
    if (blk.m0 < blk.rows)  // the block's tokens
      mask.template clip<BN>(blk.token(blk.m0, sp), blk.token(min(blk.m0 + BM, blk.rows) - 1, sp), begin, end);
  }
};

}  // namespace fa
