// Kernel parameter blocks, passed by value. kernel-ffi mirrors these as
// #[repr(C)] structs (kernel-ffi/src/params.rs): change both together.
#pragma once

#include <stdint.h>

namespace fa {

// Strides are in elements; the last dimension is contiguous. Q is [B, H, Sq, D]
// and K/V are [B, Hkv, Sk, D] in index order, any layout the strides describe.
struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;             // [B, H, Sq, D] in the input dtype; written when num_splits == 1
  float* lse;          // [B, H, Sq] natural-log LSE, or null; written when num_splits == 1
  float* o_partial;    // [num_splits, B, H, Sq, D] normalised per split, when num_splits > 1
  float* lse_partial;  // [num_splits, B, H, Sq], when num_splits > 1
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int32_t batch, heads, kv_heads, seqlen_q, seqlen_k;
  int32_t num_splits;
  int32_t keys_per_split;  // multiple of the kernel's kBlockN
  float scale_log2;        // softmax scale × log2(e); with a softcap c, c × log2(e) (mask.cuh)
  // The `_local` entries' window (LocalMask): row i sees keys i + diag − window_left
  // … i + diag + window_right, each clamped so that no bound overflows.
  int32_t window_left, window_right;
  float softcap_pre;  // the `_softcap` entries' scale / c (Softcap)
};

// The e4m3 entries' parameters: a FlashParams whose q, k and v strides count
// pairs of elements (e4m3x2, what their tiles move), and the dequantisation
// factors, [B, Hkv] fp32 contiguous or null for 1: scores are
// q_descale · k_descale · Q·Kᵀ, O is v_descale · P·V.
struct Fp8Params {
  FlashParams p;
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
};

// One e4m3 tensor [B, H, S, D] (element strides of batch, head, row) times
// its (batch, K/V head) factor (`descale`, [B, Hkv] contiguous, or null for 1;
// head h's K/V head is h / group), written contiguous [B, S, H, D] in f16 or bf16.
struct DequantParams {
  const void* src;
  void* dst;
  const float* descale;
  int64_t batch_stride, head_stride, row_stride;
  int32_t batch, heads, rows, head_dim, kv_heads, group;
};

// An e4m3 V [B, Hkv, Sk, D] (element strides of batch, head, row; Sk = rows)
// transposed for the Hopper kernel's e4m3 entries into `dst`, [B, Hkv, D, keys]
// contiguous with keys = Sk rounded up to 16 (transpose_v_e4m3).
struct TransposeParams {
  const void* src;
  void* dst;
  int64_t batch_stride, head_stride, row_stride;
  int32_t heads, rows, head_dim, keys;
};

// A CUtensorMap's bytes, encoded on the host by cuTensorMapEncodeTiled and read
// by TMA from kernel parameter space (hence __grid_constant__ parameters).
struct alignas(64) TmaDesc {
  uint64_t opaque[16];
};

// Division by an invariant div >= 1: n / div = umulhi(n, mul) >> shr for
// 0 <= n < 2^31 (computed on the host by kernel-ffi's params::FastDiv::new).
struct FastDiv {
  uint32_t div, mul, shr;
};

// The persistent Hopper kernel's work decomposition, units grid-strided over the
// CTAs (planner::Units). Non-causal: one query block each, `units` = per_head ×
// batch × heads × splits with per_head = m_blocks. Causal: pairs of one (batch,
// head)'s splits × m_blocks blocks, `units` = per_head × batch × heads with
// per_head = ⌈splits × m_blocks / 2⌉; or, with `order`, CTA c runs the query
// blocks order[c · order_stride + k] (split × batch × heads × m_blocks + block
// index; ~0u pads a shorter row), a schedule kernel-ffi computes
// (planner::causal_order).
struct HopperSched {
  int32_t units;
  FastDiv per_head;  // units per (split, batch, head); causal: per (batch, head)
  FastDiv bh;        // batch × heads
  FastDiv heads;
  FastDiv group;          // heads / kv_heads (query heads per K/V head)
  FastDiv blocks;         // m_blocks, query blocks per (split, batch, head)
  const uint32_t* order;  // causal: [grid][order_stride]; else null
  int32_t order_stride;
  // Split-tail entries (HopperConfig::kSplitTail): units 0 … whole_units − 1 run
  // whole, each later one as three 64-row items whose keys the consumer
  // warpgroups share; elsewhere equal to units.
  int32_t whole_units;
};

// The Hopper kernel's parameters: tensor maps of Q [B, H, Sq, D], K, V
// [B, Hkv, Sk, D] and O [B, H, Sq, D] (4-D, innermost first: d, seq, head, batch;
// boxes of 64 columns × the tile's rows, O's × a warpgroup's 64, 128-byte
// swizzle), the portable kernel's parameters, and the persistent entries' work
// decomposition.
struct HopperParams {
  TmaDesc q_map, k_map, v_map, o_map;
  FlashParams p;
  HopperSched sched;
};

// The Hopper kernel's e4m3 entries: a HopperParams whose v_map describes V
// transposed (TransposeParams' dst: 4-D keys, d, head, batch; boxes of the key
// tile × D), and the dequantisation factors as in Fp8Params.
struct HopperFp8Params {
  HopperParams hp;
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
};

// A serving call's sequences (the `_varlen` entries), whose rows and keys lie
// in packed, dense or paged tensors. The FlashParams beside it describe the
// tensors: q and out as [batch, heads, seqlen_q, D] (one batch of total_q rows
// when packed), k and v as [kv_batch, kv_heads, seqlen_k, D] (one batch of
// total_k rows when packed; pages of page_size rows when paged). Every index read
// from these arrays is clamped on the device (SeqInfo): bad values give wrong
// rows, never an access outside the tensors.
struct SeqParams {
  const int32_t* cu_seqlens_q;  // [seqs + 1] row offsets into packed q and out, or null: sequence s is batch s
  const int32_t* cu_seqlens_k;  // [seqs + 1] row offsets into packed k and v, or null
  const int32_t* seqused_k;     // [seqs] keys each sequence uses, or null: all it has
  const int32_t* block_table;   // [seqs, block_table_stride] page indices, or null: not paged
  int32_t seqs;                 // sequences
  int32_t max_seqlen_q;         // query rows per sequence the grid covers
  int32_t kv_batch;             // k and v's batch extent (pages when paged)
  int32_t block_table_stride;   // elements between block_table rows
  int32_t max_pages;            // page slots per sequence in block_table
  FastDiv group;                // heads / kv_heads: query heads per K/V head
  FastDiv page_size;            // keys per page (k's seqlen_k) when paged
};

struct VarlenParams {
  FlashParams p;
  SeqParams seq;
};

// The Hopper kernel's serving entries: the maps describe the tensors as
// FlashParams does for VarlenParams (k_map and v_map, paged: pages of a
// multiple of 128 keys), and `hp.sched` is unused.
struct HopperVarlenParams {
  HopperParams hp;
  SeqParams seq;
};

// The rows to merge are [batch, heads, seqlen_q]; with cu_seqlens_q (packed
// queries, the `_varlen` combine) only those some sequence covers.
struct CombineParams {
  const float* o_partial;
  const float* lse_partial;
  void* o;
  float* lse;  // or null
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int32_t batch, heads, seqlen_q, num_splits;
  const int32_t* cu_seqlens_q;  // [seqs + 1], or null
  int32_t seqs, max_seqlen_q;
};

// The fp32 reference: scores materialised per row in dynamic shared memory.
struct ReferenceParams {
  const void* q;
  const void* k;
  const void* v;
  float* o;    // [B, H, Sq, D] contiguous fp32
  float* lse;  // [B, H, Sq]
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int32_t batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
  int32_t window_left, window_right;  // keys row i sees: i + diag − left … i + diag + right; −1: unbounded
  float scale;
  float softcap;  // scores become softcap · tanh(score / softcap) after scaling; 0: none
};

}  // namespace fa
