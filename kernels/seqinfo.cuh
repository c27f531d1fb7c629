// Where one sequence of a serving call lies (the `_varlen` entries): its query
// rows in q and out, its keys in k and v (packed, dense or paged), read once per
// CTA from SeqParams. Every index read from the device arrays is clamped into
// its tensor here, so a bad cu_seqlens, seqused_k or block_table entry gives
// wrong rows, never an access outside the tensors (kernel-ffi's `validate`
// option finds them on the host).
#pragma once

#include "common.cuh"
#include "flash_params.h"

namespace fa {

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }

struct SeqInfo {
  int q_batch;           // q and out's batch index
  int q_row0;            // the sequence's first row in it
  int q_len;             // its rows, at most max_seqlen_q
  int k_batch;           // k and v's batch index (not paged)
  int k_row0;            // the sequence's first key in it (not paged)
  int k_len;             // keys it uses
  const int32_t* pages;  // its block_table row, or null: not paged

  SeqInfo() = default;
  __device__ __forceinline__ SeqInfo(const FlashParams& p, const SeqParams& sp, int s) {
    if (sp.cu_seqlens_q != nullptr) {
      const int lo = clamp_to(sp.cu_seqlens_q[s], 0, p.seqlen_q);
      q_batch = 0;
      q_row0 = lo;
      q_len = min(clamp_to(sp.cu_seqlens_q[s + 1], lo, p.seqlen_q) - lo, sp.max_seqlen_q);
    } else {
      q_batch = s;
      q_row0 = 0;
      q_len = min(p.seqlen_q, sp.max_seqlen_q);
    }
    int avail;
    pages = nullptr;
    k_batch = 0;
    k_row0 = 0;
    if (sp.block_table != nullptr) {
      pages = sp.block_table + (int64_t)s * sp.block_table_stride;
      avail = sp.max_pages * p.seqlen_k;  // < 2^31, checked on the host
    } else if (sp.cu_seqlens_k != nullptr) {
      k_row0 = clamp_to(sp.cu_seqlens_k[s], 0, p.seqlen_k);
      avail = clamp_to(sp.cu_seqlens_k[s + 1], k_row0, p.seqlen_k) - k_row0;
    } else {
      k_batch = s;
      avail = p.seqlen_k;
    }
    k_len = sp.seqused_k != nullptr ? clamp_to(sp.seqused_k[s], 0, avail) : avail;
  }

  // Bottom-right causal alignment: row i sees keys j <= i + diag().
  __device__ __forceinline__ int diag() const { return k_len - q_len; }

  // A block-table entry as a page of k and v, or −1 where it names none.
  __device__ __forceinline__ static int checked_page(int entry, const SeqParams& sp) {
    return entry >= 0 && entry < sp.kv_batch ? entry : -1;
  }
  // The page in block-table slot `slot` (< max_pages) of a paged sequence, or −1.
  __device__ __forceinline__ int page_of(int slot, const SeqParams& sp) const { return checked_page(pages[slot], sp); }
};

}  // namespace fa
