// The Hopper kernel's tile scheduler: which work items (query blocks of one
// batch, head and split) a CTA runs, in which order.
#pragma once

#include "flash_params.h"
#include "hopper.cuh"
#include "seqinfo.cuh"

namespace fa {

// One work item of a CTA: query rows m0 … m0 + kBlockM − 1 of (b, h, split).
struct HopperItem {
  bool done;  // the CTA has no such item
  bool skip;  // not an item (the missing half of a pair, a schedule's padding): neither loads nor stores
  int m0, b, h, kvh, split, n_begin;
  int tiles;  // key tiles; 0: rows that see no key (stored as zeros)
  // Split-tail item: 64 rows from m0, every consumer warpgroup's, each taking
  // every third key tile; merged by warpgroup 0 (HopperSched::whole_units).
  bool split_tail;

  // The item's sequence, which every (b, h) of a dense batch shares: its keys,
  // and the bottom-right causal alignment (row i sees keys j <= i + diag),
  // seqlen_k − seqlen_q, which callers read once.
  __device__ __forceinline__ int keys(const FlashParams& p) const { return p.seqlen_k; }
  __device__ __forceinline__ int diag(int dense_diag) const { return dense_diag; }
  // Q's tile in q_map (row, head, batch).
  __device__ __forceinline__ int3 q_at() const { return make_int3(m0, h, b); }
};

// Key tile j of a dense item in k_map and v_map (row, head, batch).
template <int BN>
struct DenseKeyTiles {
  int n_begin, kvh, b;
  __device__ __forceinline__ int3 at(int j) const { return make_int3(n_begin + j * BN, kvh, b); }
};
template <int BN>
__device__ __forceinline__ DenseKeyTiles<BN> key_tiles(const HopperItem& it) {
  return {it.n_begin, it.kvh, it.b};
}

// The k-th item of this CTA. Not persistent: the one query block the 3-D grid
// names (causal: the last blocks, which see the most keys, first). Persistent:
// resident CTAs of a 1-D grid take units with a grid stride, a head's units
// adjacent so that CTAs running together share its K/V in L2. A non-causal unit
// is one query block; a causal one a pair of one (batch, head)'s (split, block)
// items, numbered z = split × m_blocks + block: the longest and the shortest left
// (z = splits × m_blocks − 1 − i, then z = i), so that units cost about the same.
// Unsplit, the short block's keys are a prefix of the long one's, still in L2;
// split, block i of split s and block m_blocks − 1 − i of split splits − 1 − s
// together see about one split's keys, where pairs within a split would differ
// by a factor of two. Where those units leave the last round partly empty,
// kernel-ffi passes the 128-row entries
// (SCHEDULED) a schedule instead (HopperSched::order, planner::causal_order) and
// the CTA runs its row; the 64-row one has no registers to spare for both. The
// 192-row entry (SPLIT_TAIL) runs units from sc.whole_units on as three items
// each, the unit's 64-row thirds (HopperItem::split_tail). The decode divides by
// host-computed FastDiv constants: run-time divisions would sit on the path to
// the first TMA load.
//
// A host schedule's entry for item k comes from hopper_entry, a global load that
// callers issue well ahead of this decode (an L2 round trip, which would
// otherwise open every item).
template <bool PERSISTENT, bool SCHEDULED>
__device__ __forceinline__ uint32_t hopper_entry(const HopperSched& sc, int k) {
  if constexpr (PERSISTENT && SCHEDULED) {
    if (sc.order != nullptr && k < sc.order_stride) return __ldg(sc.order + blockIdx.x * sc.order_stride + k);
  }
  return 0;  // no schedule, or past the CTA's row (the decode reports done)
}

template <int BM, int BN, typename Mask, bool PERSISTENT, bool SCHEDULED, bool SPLIT_TAIL>
__device__ __forceinline__ HopperItem hopper_item(const FlashParams& p, const HopperSched& sc, int k, uint32_t entry) {
  // Causal units pair a long block with a short one; a band's blocks cost about
  // the same, so its units are single blocks, as without a mask.
  constexpr bool kPairs = Mask::kEnd && !Mask::kBegin;
  HopperItem r{};
  int m_idx, sub = 0;
  if constexpr (PERSISTENT) {
    int bh;  // batch × heads + head
    // Splits sbh = split × (batch × heads) + bh into r.split and bh.
    auto split_off = [&](int sbh) {
      r.split = fast_div(sc.bh, sbh);
      return sbh - r.split * sc.bh.div;
    };
    if (SCHEDULED && sc.order != nullptr) {
      r.done = k >= sc.order_stride;
      if (r.done) return r;
      const uint32_t block = entry;
      r.skip = block == ~0u;  // padding: the CTA's row is shorter than the longest
      if (r.skip) return r;
      const int sbh = fast_div(sc.blocks, (int)block);
      m_idx = (int)block - sbh * sc.blocks.div;
      bh = split_off(sbh);
    } else {
      int unit = blockIdx.x + (kPairs ? k >> 1 : k) * gridDim.x;
      if (SPLIT_TAIL && unit >= sc.whole_units) {  // three items a unit: its 64-row thirds
        const int t = unit - sc.whole_units;
        unit = sc.whole_units + t / 3;
        sub = t % 3;
        r.split_tail = true;
      }
      r.done = unit >= sc.units;
      if (r.done) return r;
      // Causal: bh (a unit's items span the splits); else split × (batch × heads) + bh.
      const int sbh = fast_div(sc.per_head, unit);
      const int i = unit - sbh * sc.per_head.div;
      if (kPairs) {
        const int items = sc.blocks.div * p.num_splits;  // (split, block) items of a head
        const int z = (k & 1) == 0 ? items - 1 - i : i;
        r.skip = (k & 1) == 1 && z == items - 1 - i;  // an odd item count's middle item: once
        if (r.skip) return r;
        r.split = fast_div(sc.blocks, z);
        m_idx = z - r.split * sc.blocks.div;
        bh = sbh;
      } else {
        m_idx = i;
        bh = split_off(sbh);
      }
    }
    r.b = fast_div(sc.heads, bh);
    r.h = bh - r.b * sc.heads.div;
    r.kvh = fast_div(sc.group, r.h);
  } else {
    r.done = k > 0;
    r.b = blockIdx.y / p.heads;
    r.h = blockIdx.y % p.heads;
    r.kvh = r.h / (p.heads / p.kv_heads);
    r.split = blockIdx.z;
    m_idx = Mask::kEnd ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  }
  r.m0 = m_idx * BM;
  if (SPLIT_TAIL && r.split_tail) {
    r.m0 += 64 * sub;
    r.skip = r.m0 >= p.seqlen_q;  // a last query block's empty third
    if (r.skip) return r;
  }
  r.n_begin = r.split * p.keys_per_split;
  int n_end = min(p.seqlen_k, r.n_begin + p.keys_per_split);
  Mask(p, p.seqlen_k - p.seqlen_q).template clip<BN>(r.m0, r.m0 + BM - 1, r.n_begin, n_end);
  r.tiles = n_end > r.n_begin ? (n_end - r.n_begin + BN - 1) / BN : 0;
  return r;
}

// A serving call's item (the `_varlen` entries): query rows m0 … m0 + BM − 1
// of sequence b's head h, m0 and the key positions counted from the
// sequence's start. Its rows and keys lie where `info` says (packed, dense or,
// paged, on pages of a multiple of BN keys, so that a key tile lies in one page).
struct VarlenItem : HopperItem {
  SeqInfo info;
  const SeqParams* sp;

  __device__ __forceinline__ int keys(const FlashParams&) const { return info.k_len; }
  __device__ __forceinline__ int diag(int) const { return info.diag(); }
  __device__ __forceinline__ int3 q_at() const { return make_int3(info.q_row0 + m0, h, info.q_batch); }
};

// Key tile j of a serving item: packed or dense, at the sequence's rows; paged,
// at its row in the page its block-table slot names (a slot naming no page of
// k and v gives −1, which TMA reads as zeros). One block-table read per tile,
// by the producer thread, which waits on the ring far longer.
template <int BN>
struct SeqKeyTiles {
  const VarlenItem& it;
  __device__ __forceinline__ int3 at(int j) const {
    const int n = it.n_begin + j * BN;
    if (it.info.pages == nullptr) return make_int3(it.info.k_row0 + n, it.kvh, it.info.k_batch);
    const int slot = fast_div(it.sp->page_size, n);
    return make_int3(n - slot * it.sp->page_size.div, it.kvh, it.info.page_of(slot, *it.sp));
  }
};
template <int BN>
__device__ __forceinline__ SeqKeyTiles<BN> key_tiles(const VarlenItem& it) {
  return {it};
}

// The one item of a `_varlen` CTA, named by its 3-D grid: query block
// blockIdx.x (causal: the last blocks first) of sequence blockIdx.y / heads,
// head blockIdx.y % heads, key split blockIdx.z. A block past the sequence's
// rows is skipped (the grid covers max_seqlen_q).
template <int BM, int BN, typename Mask>
__device__ __forceinline__ VarlenItem varlen_item(const FlashParams& p, const SeqParams& sp) {
  VarlenItem r{};
  r.sp = &sp;
  r.b = blockIdx.y / p.heads;
  r.h = blockIdx.y - r.b * p.heads;
  r.kvh = fast_div(sp.group, r.h);
  r.split = blockIdx.z;
  r.m0 = (Mask::kEnd ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
  r.info = SeqInfo(p, sp, r.b);
  r.skip = r.m0 >= r.info.q_len;
  if (r.skip) return r;
  r.n_begin = r.split * p.keys_per_split;
  int n_end = min(r.info.k_len, r.n_begin + p.keys_per_split);
  Mask(p, r.info.diag()).template clip<BN>(r.m0, r.m0 + BM - 1, r.n_begin, n_end);  // a page holds whole tiles
  r.tiles = n_end > r.n_begin ? (n_end - r.n_begin + BN - 1) / BN : 0;
  return r;
}

}  // namespace fa
