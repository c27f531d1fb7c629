// The portable kernel's global→shared tile loads (cp.async), and the tiles a
// CTA's mainloop walks: DenseTiles (one (batch, head) of dense tensors) and
// SeqTiles (a sequence of a serving call: packed query heads, packed, dense or
// paged keys), each with its key range and its mask.
#pragma once

#include "common.cuh"
#include "flash_params.h"
#include "mask.cuh"
#include "portable_layout.cuh"
#include "portable_scheduler.cuh"
#include "seqinfo.cuh"

namespace fa {

// Copies ROWS-row tiles of a [rows, D] matrix into a swizzled shared tile with
// cp.async. A row is kPanels panels of kPanelChunks 16-byte chunks (the largest
// power of two dividing D / 8: one panel at D = 64, 128, 256; three at 96 and
// 192), and each thread always moves the same chunk of every panel of rows
// r, r + kRowsPerPass, …: its shared addresses are fixed (the swizzle XORs within
// a panel's chunks, by a term of r % 8: the same in every pass when kRowsPerPass
// is a multiple of 8; when it is 4 (D=256), r + 4 flips chunk bit 2, so odd
// passes land 4 chunks over, `odd`), and its global address advances by a
// constant. Everything but one multiply per tile is set up once.
template <typename T, int ROWS, int D, int THREADS>
struct TileCopy {
  static constexpr int kChunks = D / 8;
  static constexpr int kPanelChunks = kChunks & -kChunks;
  static constexpr int kPanels = kChunks / kPanelChunks;
  static constexpr int kRowsPerPass = THREADS / kPanelChunks;
  static constexpr int kPasses = ROWS / kRowsPerPass;
  static_assert(kPanelChunks % kSwizzleChunks<D> == 0, "the swizzle stays within a panel");
  static_assert(THREADS % kPanelChunks == 0 && ROWS % kRowsPerPass == 0 && kRowsPerPass % 4 == 0,
                "each thread keeps one chunk column, and one or two swizzle phases");
  static constexpr bool kTwoPhases = kRowsPerPass % 8 != 0;
  uint32_t smem;        // this thread's chunk of its first row's first panel
  int32_t odd;          // bytes from an even pass's chunk to an odd one's (two phases)
  const T* gmem;        // row `row` of the matrix at this thread's chunk column
  int64_t pass_stride;  // elements between this thread's rows in consecutive passes
  int row;

  // `tid`: this thread's index among the THREADS that copy.
  __device__ __forceinline__ TileCopy(T* tile, const T* base, int64_t row_stride, unsigned tid) {
    row = tid / kPanelChunks;
    const int ch = tid % kPanelChunks;
    smem = smem_u32(tile + swizzle<D>(row, ch * 8));
    odd = odd_offset(tile, row, ch * 8, smem);
    gmem = base + (int64_t)row * row_stride + ch * 8;
    pass_stride = (int64_t)kRowsPerPass * row_stride;
  }
  // `odd` of the thread whose first chunk (row, col) lies at shared address `at`.
  __device__ __forceinline__ static int32_t odd_offset(T* tile, int row, int col, uint32_t at) {
    return kTwoPhases ? (int32_t)(smem_u32(tile + swizzle<D>(row + 4, col)) - at) - 4 * D * 2 : 0;
  }

  // Rows [row0, row0 + ROWS); `offset` = row0 × row_stride; into the tile
  // the constructor's. Rows ≥ rows_valid are zero-filled
  // so that 0 × garbage can never turn into NaN in P·V.
  __device__ __forceinline__ void copy(int64_t offset, int row0, int rows_valid) const {
    const T* src = gmem + offset;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = row0 + row + i * kRowsPerPass < rows_valid;
#pragma unroll
      for (int c = 0; c < kPanels; ++c) {
        cp_async_16(smem + i * kRowsPerPass * D * 2 + (i % 2) * odd + c * kPanelChunks * 16,
                    valid ? src + c * kPanelChunks * 8 : gmem, valid ? 16 : 0);
      }
      src += pass_stride;
    }
  }
};

// Copies ROWS rows whose sources are not a constant stride apart into a
// swizzled shared tile: the thread's chunk column, panels and shared addresses
// (and phases) as TileCopy's, the source of row r, its pass i's, from
// `row_at(r, i)` (null: zero-filled).
template <typename T, int ROWS, int D, int THREADS>
struct RowGather {
  using Copy = TileCopy<T, ROWS, D, THREADS>;
  static constexpr int kPanelChunks = Copy::kPanelChunks, kPanels = Copy::kPanels;
  static constexpr int kRowsPerPass = Copy::kRowsPerPass, kPasses = Copy::kPasses;
  const int row, col;
  const uint32_t smem;
  const int32_t odd;

  __device__ __forceinline__ RowGather(T* tile, unsigned tid)
      : row(tid / kPanelChunks),
        col((tid % kPanelChunks) * 8),
        smem(smem_u32(tile + swizzle<D>(row, col))),
        odd(Copy::odd_offset(tile, row, col, smem)) {}

  // `any`: a readable address for the zero-filled rows' (never read) source.
  template <typename RowAt>
  __device__ __forceinline__ void gather(RowAt&& row_at, const T* any) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const T* src = row_at(row + i * kRowsPerPass, i);
#pragma unroll
      for (int c = 0; c < kPanels; ++c) {
        cp_async_16(smem + i * kRowsPerPass * D * 2 + (i % 2) * odd + c * kPanelChunks * 16,
                    src != nullptr ? src + col + c * kPanelChunks * 8 : any, src != nullptr ? 16 : 0);
      }
    }
  }
};

// A block's (batch, head) of Q and (batch, kv head) of K and V in global memory.
template <typename T>
struct HeadTensors {
  const T* const q;
  const T* const k;
  const T* const v;

  template <int BM, typename Mask>
  __device__ __forceinline__ HeadTensors(const FlashParams& p, const PortableBlock<BM, Mask>& blk)
      : q(static_cast<const T*>(p.q) + blk.b * p.q_batch_stride + blk.h * p.q_head_stride),
        k(static_cast<const T*>(p.k) + blk.b * p.k_batch_stride + blk.kvh * p.k_head_stride),
        v(static_cast<const T*>(p.v) + blk.b * p.v_batch_stride + blk.kvh * p.v_head_stride) {}
};

// A key group's loads: its Q tile and its K and V tiles. Rows past the sequence
// ends are zero-filled.
template <typename T, typename Cfg>
struct TileLoads {
  static constexpr int D = Cfg::kTileCols, BM = Cfg::kBlockM, BN = Cfg::kBlockN, GT = Cfg::kGroupThreads;
  const FlashParams& p;
  T* const sq;
  const unsigned gtid;
  const T* const q;  // the (batch, head)'s Q
  const TileCopy<T, BN, D, GT> k_copy, v_copy;

  __device__ __forceinline__ TileLoads(const FlashParams& p, const KeyGroup<T, Cfg>& grp, const HeadTensors<T>& in)
      : p(p),
        sq(grp.q),
        gtid(grp.tid),
        q(in.q),
        k_copy(grp.k, in.k, p.k_row_stride, grp.tid),
        v_copy(grp.v, in.v, p.v_row_stride, grp.tid) {}

  // Query rows m0 … m0 + BM − 1.
  __device__ __forceinline__ void load_q(int m0) const {
    TileCopy<T, BM, D, GT>(sq, q, p.q_row_stride, gtid).copy((int64_t)m0 * p.q_row_stride, m0, p.seqlen_q);
  }
  // Keys n … n + BN − 1.
  __device__ __forceinline__ void load_k(int n) const { k_copy.copy((int64_t)n * p.k_row_stride, n, p.seqlen_k); }
  __device__ __forceinline__ void load_v(int n) const { v_copy.copy((int64_t)n * p.v_row_stride, n, p.seqlen_k); }
};

// The tiles of a dense block (PortableBlock): its rows' Q, its key range's K and
// V, and the sequence end and the mask policy. What PortableMainloop walks.
template <typename T, typename Cfg, typename Mask>
struct DenseTiles {
  using Block = PortableBlock<Cfg::kBlockM, Mask>;
  const FlashParams& p;
  const Block& blk;
  const KeyRange<Cfg::kBlockM, Cfg::kBlockN, Mask>& keys;
  const TileLoads<T, Cfg>& loads;

  __device__ __forceinline__ int begin() const { return keys.begin; }
  __device__ __forceinline__ int end() const { return keys.end; }
  // Dense keys lie at a constant stride: nothing to look up ahead of a tile.
  __device__ __forceinline__ void look_ahead(int) const {}
  // Every warp computes its rows (a block past seqlen_q is the last of its head).
  static constexpr bool kEveryWarpComputes = true;
  __device__ __forceinline__ void load_q() const { loads.load_q(blk.m0); }
  __device__ __forceinline__ void load_k(int n) const { loads.load_k(n); }
  __device__ __forceinline__ void load_v(int n) const { loads.load_v(n); }
  // Scores of keys n0 … of the block's rows `row` and `row` + 8; only tiles that
  // cross the sequence end or a band edge are masked.
  template <int NT>
  __device__ __forceinline__ void mask(float (&s)[NT][4], int n0, int row, int t) const {
    mask_tile(s, n0, blk.m0, blk.m0 + row, t, p.seqlen_k, keys.mask);
  }
};

// The tiles of a serving block (VarlenBlock): its packed rows' Q gathered by
// (token, head), and its sequence's K and V rows: at a constant stride when
// packed or dense; paged, a tile lies in one page when the page size is a
// multiple of the key tile (one block-table read per tile), else each row is
// found through the block table. Rows past the sequence, and keys on a page the
// table does not name, are zero-filled.
template <typename T, typename Cfg, typename Mask>
struct SeqTiles {
  static constexpr int D = Cfg::kTileCols, BM = Cfg::kBlockM, BN = Cfg::kBlockN, GT = Cfg::kGroupThreads;
  using Block = VarlenBlock<BM, Mask>;
  const FlashParams& p;
  const SeqParams& sp;
  const Block& blk;
  const VarlenKeyRange<BM, BN, Mask>& keys;
  const KeyGroup<T, Cfg>& grp;
  const T* const k_head;  // K/V head kvh of k and v (of the sequence's batch and first row when not paged)
  const T* const v_head;
  const TileCopy<T, BN, D, GT> k_copy, v_copy;
  const bool tiles_in_pages;
  // log2 of the page size where pages split a tile (it is then a power of two
  // dividing BN, and tiles start on page boundaries), else −1: a row's page and
  // its place in it are a shift and a mask from its row in the tile.
  const int page_shift;
  // Pages split a tile but hold a copy pass's rows (kRowsPerPass or more keys):
  // a pass's page is one block-table entry, the same for every thread of it.
  const bool passes_in_pages;
  const int last_in_block;  // the last key any row of the block sees (−1: none), for skipping the mask

  __device__ __forceinline__ SeqTiles(const FlashParams& p, const SeqParams& sp, const Block& blk,
                                      const VarlenKeyRange<BM, BN, Mask>& keys, const KeyGroup<T, Cfg>& grp)
      : p(p),
        sp(sp),
        blk(blk),
        keys(keys),
        grp(grp),
        k_head(head_of(p.k, p.k_head_stride, p.k_batch_stride, p.k_row_stride)),
        v_head(head_of(p.v, p.v_head_stride, p.v_batch_stride, p.v_row_stride)),
        k_copy(grp.k, k_head, p.k_row_stride, grp.tid),
        v_copy(grp.v, v_head, p.v_row_stride, grp.tid),
        tiles_in_pages(sp.page_size.div % BN == 0),
        page_shift(BN % sp.page_size.div == 0 ? __ffs(sp.page_size.div) - 1 : -1),
        passes_in_pages(!tiles_in_pages && page_shift >= 0 && sp.page_size.div >= TileCopy<T, BN, D, GT>::kRowsPerPass),
        last_in_block(last_key(blk.m0)) {}

  __device__ __forceinline__ const T* head_of(const void* base, int64_t head_stride, int64_t batch_stride,
                                              int64_t row_stride) const {
    const T* h = static_cast<const T*>(base) + blk.kvh * head_stride;
    return blk.info.pages != nullptr ? h : h + blk.info.k_batch * batch_stride + blk.info.k_row0 * row_stride;
  }

  // The last key packed row i (of the block's sequence) sees.
  __device__ __forceinline__ int last_key(int i) const {
    const int last = blk.info.k_len - 1;
    return Mask::kEnd ? min(last, blk.token(i, sp) + keys.mask.hi) : last;
  }
  // The first key packed row i sees (masks that bound it).
  __device__ __forceinline__ int first_key(int i) const { return max(blk.token(i, sp) + keys.mask.lo, 0); }

  __device__ __forceinline__ int begin() const { return keys.begin; }
  __device__ __forceinline__ int end() const { return keys.end; }
  // Whether a warp whose rows start at w0 holds any of the sequence's packed
  // rows: decode's few rows (one token × the group) leave most warps none, and
  // those only load and wait (their matrix products and exponentials were most
  // of a decode tile's instructions).
  static constexpr bool kEveryWarpComputes = false;
  __device__ __forceinline__ bool computes(int w0) const { return blk.m0 + w0 < blk.rows; }

  __device__ __forceinline__ void load_q() const {
    const int group = sp.group.div;
    const T* q = static_cast<const T*>(p.q) + blk.info.q_batch * p.q_batch_stride;
    RowGather<T, BM, D, GT>(grp.q, grp.tid)
        .gather(
            [&](int r, int) -> const T* {
              const int i = blk.m0 + r;
              if (i >= blk.rows) return nullptr;
              const int token = blk.token(i, sp), head = blk.kvh * group + (i - token * group);
              return q + head * p.q_head_stride + (int64_t)(blk.info.q_row0 + token) * p.q_row_stride;
            },
            q);
  }

  // A paged tile's block-table entries: with tiles in pages, the tile's one
  // page's (page[0]); with passes in pages, pass i's; else those of the rows
  // this thread copies (row + i · kRowsPerPass). Slots past the sequence's
  // last read its last. Entries are read unchecked, so that the reads issue
  // back to back, and checked (SeqInfo::checked_page) where a load uses them:
  // a check at the read would wait for each read in turn.
  using Copy = TileCopy<T, BN, D, GT>;
  struct Pages {
    int page[Copy::kPasses];
  };
  // `look_ahead` reads the next tile's, after this tile's V load and before
  // the next tile's K load: that tile's K and V loads read them in turn.
  mutable Pages pages;

  // The slot of the sequence's last key (0 when it has none or is not paged).
  __device__ __forceinline__ int last_slot() const {
    return blk.info.pages != nullptr && blk.info.k_len > 0 ? fast_div(sp.page_size, blk.info.k_len - 1) : 0;
  }
  __device__ __forceinline__ int entry(int slot, int last) const { return blk.info.pages[min(slot, last)]; }

  __device__ __forceinline__ void look_ahead(int n) const {
    if (blk.info.pages == nullptr) return;
    const int last = last_slot();
    if (tiles_in_pages) {
      pages.page[0] = entry(fast_div(sp.page_size, n), last);
    } else if (page_shift >= 0) {
      // With passes in pages a pass's rows share its first row's page.
      const int row = passes_in_pages ? 0 : grp.tid / Copy::kPanelChunks, first = n >> page_shift;
#pragma unroll
      for (int i = 0; i < Copy::kPasses; ++i)
        pages.page[i] = entry(first + ((row + i * Copy::kRowsPerPass) >> page_shift), last);
    } else {
      const int row = grp.tid / Copy::kPanelChunks;
#pragma unroll
      for (int i = 0; i < Copy::kPasses; ++i)
        pages.page[i] = entry(fast_div(sp.page_size, n + row + i * Copy::kRowsPerPass), last);
    }
  }

  __device__ __forceinline__ void load(const Copy& copy, T* tile, const T* head, int64_t page_stride,
                                       int64_t row_stride, int n) const {
    const Pages& pg = pages;
    const SeqInfo& info = blk.info;
    if (info.pages == nullptr) {
      copy.copy((int64_t)n * row_stride, n, info.k_len);
    } else if (tiles_in_pages) {
      const int page = SeqInfo::checked_page(pg.page[0], sp);
      const int in_page = n - fast_div(sp.page_size, n) * sp.page_size.div;
      copy.copy(max(page, 0) * page_stride + (int64_t)in_page * row_stride, n, page < 0 ? 0 : info.k_len);
    } else if (passes_in_pages) {
      // This thread's rows lie a row stride apart within each pass's page.
      const int row = grp.tid / Copy::kPanelChunks, in_page_mask = sp.page_size.div - 1;
      const T* rows = head + (int64_t)row * row_stride;
      RowGather<T, BN, D, GT>(tile, grp.tid)
          .gather(
              [&](int r, int pass) -> const T* {
                const int page = SeqInfo::checked_page(pg.page[pass], sp);
                if (page < 0 || n + r >= info.k_len) return nullptr;
                const int pass_row = (pass * Copy::kRowsPerPass) & in_page_mask;  // the pass's first, in its page
                return rows + (int64_t)page * page_stride + (int64_t)pass_row * row_stride;
              },
              head);
    } else {
      RowGather<T, BN, D, GT>(tile, grp.tid)
          .gather(
              [&](int r, int pass) -> const T* {
                const int page = SeqInfo::checked_page(pg.page[pass], sp), key = n + r;
                if (page < 0 || key >= info.k_len) return nullptr;
                const int in_page = page_shift >= 0 ? r & ((1 << page_shift) - 1)
                                                    : key - fast_div(sp.page_size, key) * sp.page_size.div;
                return head + page * page_stride + (int64_t)in_page * row_stride;
              },
              head);
    }
  }
  __device__ __forceinline__ void load_k(int n) const {
    load(k_copy, grp.k, k_head, p.k_batch_stride, p.k_row_stride, n);
  }
  __device__ __forceinline__ void load_v(int n) const {
    load(v_copy, grp.v, v_head, p.v_batch_stride, p.v_row_stride, n);
  }

  // Scores of keys n0 … of the block's rows `row` and `row` + 8, masked past
  // each row's last key on tiles that reach past the block's first row's;
  // under a window, outside each row's band on every tile.
  template <int NT>
  __device__ __forceinline__ void mask(float (&s)[NT][4], int n0, int row, int t) const {
    const int lo = blk.m0 + row, hi = lo + 8;
    if (!Mask::kBegin && n0 + 8 * NT - 1 <= last_in_block) return;
    mask_tile_rows<Mask::kBegin>(s, n0, t, Mask::kBegin ? first_key(lo) : 0, Mask::kBegin ? first_key(hi) : 0,
                                 last_key(lo), last_key(hi));
  }
};

}  // namespace fa
