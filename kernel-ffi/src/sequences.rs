//! Serving calls' sequences, without a GPU: where each sequence's query rows
//! and keys lie in packed, dense or paged tensors ([`SeqLayout`]), the rules a
//! call is held to before launch ([`validate`]), and the host check of the
//! index arrays that live on the device ([`check_indices`]).
//!
//! The tensors keep the launch API's [batch, heads, seq, head_dim] view
//! ([`Desc`](crate::Desc)):
//!
//! | | q and out | k and v |
//! |---|---|---|
//! | dense | [seqs, H, Sq, D] | [seqs, Hkv, Sk, D] |
//! | packed (`cu_seqlens`) | [1, H, total_q, D] | [1, Hkv, total_k, D] |
//! | paged (`block_table`) | | [pages, Hkv, page_size, D] |
//!
//! FlashAttention's packed (total, heads, D) tensors are the packed rows with
//! strides (·, D, heads·D); its paged caches (pages, page_size, heads, D) are
//! the paged rows with strides (page_size·heads·D, D, heads·D).

use crate::error::{Result, invalid};
use crate::tensor::{self, Arg, MAX_BATCH_HEADS, Problem};

/// A paged K/V cache's block table: `[seqs, stride]` int32 page indices, of
/// which each sequence uses its first `max_pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageTable {
    /// Elements in the block table's buffer.
    pub len: usize,
    /// Page slots per sequence (the table's width in use).
    pub max_pages: usize,
    /// Elements between one sequence's row and the next (≥ `max_pages`).
    pub stride: usize,
}

/// How a serving call's sequences lie in its tensors: the host side of
/// [`Sequences`](crate::Sequences), with each device array's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqLayout {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Packed queries: `cu_seqlens_q`'s length (seqs + 1 offsets into q's rows).
    pub cu_seqlens_q: Option<usize>,
    /// Packed queries: the most rows any sequence has; rows past it are neither
    /// computed nor written.
    pub max_seqlen_q: usize,
    /// Packed keys: `cu_seqlens_k`'s length (seqs + 1 offsets into k's rows).
    pub cu_seqlens_k: Option<usize>,
    /// Packed keys: the most keys any sequence has (for the split plan).
    pub max_seqlen_k: usize,
    /// `seqused_k`'s length (keys each sequence uses, ≤ what it has).
    pub seqused_k: Option<usize>,
    /// Paged keys: the block table.
    pub block_table: Option<PageTable>,
}

/// FlashAttention's `cu_seqlens` of sequences of `lens` rows: 0 and the
/// running totals, `lens.len() + 1` offsets.
///
/// ```
/// assert_eq!(kernel_ffi::sequences::offsets(&[3, 0, 5]), vec![0, 3, 3, 8]);
/// ```
pub fn offsets(lens: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lens.iter().scan(0i32, |total, &n| {
            *total += n as i32;
            Some(*total)
        }))
        .collect()
}

/// A serving call's problem after [`validate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VarlenProblem {
    /// The tensors' own extents: q's batch and rows per batch (`seqlen_q`), k's
    /// rows per batch (`seqlen_k`: the page size when paged), heads, head dim, scale.
    pub tensors: Problem,
    /// Sequences.
    pub seqs: usize,
    /// k and v's batch extent (pages when paged).
    pub kv_batch: usize,
    /// The most query rows of a sequence the grid covers.
    pub max_seqlen_q: usize,
    /// The most keys a sequence may have (the split plan's length).
    pub max_seqlen_k: usize,
    /// Paged keys: the block table.
    pub pages: Option<PageTable>,
}

impl VarlenProblem {
    /// Rows of q's [batch, heads, rows] index space: the LSE's length.
    pub fn rows(&self) -> usize {
        self.tensors.rows()
    }

    /// Query heads per K/V head.
    pub fn group(&self) -> usize {
        self.tensors.heads / self.tensors.kv_heads.max(1)
    }
}

/// Checks q, k, v and out ([`tensor::operands`]) and the sequences' layout
/// against each other, and returns the problem. Every rule is checked on the
/// host from shapes alone: packed tensors have batch 1 and an offset array of
/// seqs + 1 entries; dense ones have batch `seqs`; a block table holds `seqs`
/// rows of `max_pages` page slots; paged keys take their lengths from
/// `seqused_k` (or fill their pages), not from `cu_seqlens_k`.
///
/// ```
/// use kernel_ffi::sequences::{SeqLayout, validate};
/// use kernel_ffi::tensor::{Arg, Desc, Dtype, Layout};
///
/// // Three sequences packed into 300 query rows and 900 keys, 8 heads on 2.
/// let q = Desc::new([1, 8, 300, 128], Layout::Bshd);
/// let kv = Desc::new([1, 2, 900, 128], Layout::Bshd);
/// let arg = |name, desc: Desc| Arg { name, dtype: Dtype::Bf16, desc, len: desc.span() };
/// let layout = SeqLayout {
///     seqs: 3,
///     cu_seqlens_q: Some(4),
///     max_seqlen_q: 200,
///     cu_seqlens_k: Some(4),
///     max_seqlen_k: 500,
///     ..SeqLayout::default()
/// };
/// let p = validate(arg("q", q), arg("k", kv), arg("v", kv), arg("out", q), &layout, None).unwrap();
/// assert_eq!((p.seqs, p.group(), p.rows()), (3, 4, 8 * 300));
///
/// let short = SeqLayout { cu_seqlens_q: Some(3), ..layout };
/// let e = validate(arg("q", q), arg("k", kv), arg("v", kv), arg("out", q), &short, None).unwrap_err();
/// assert_eq!(e.to_string(), "invalid argument: cu_seqlens_q holds 3 offsets; 3 sequences need 4");
/// ```
pub fn validate(q: Arg, k: Arg, v: Arg, o: Arg, layout: &SeqLayout, scale: Option<f32>) -> Result<VarlenProblem> {
    let t = tensor::operands(q, k, v, o, scale)?;
    let seqs = layout.seqs;
    let offsets = |name: &str, len: usize| -> Result<()> {
        if len <= seqs {
            invalid!("{name} holds {len} offsets; {seqs} sequences need {}", seqs + 1);
        }
        Ok(())
    };
    let max_seqlen_q = match layout.cu_seqlens_q {
        Some(len) => {
            offsets("cu_seqlens_q", len)?;
            if t.batch != 1 {
                invalid!("packed q has batch {}; with cu_seqlens_q, q holds all sequences' rows in batch 1", t.batch);
            }
            layout.max_seqlen_q.min(t.seqlen_q)
        }
        None => {
            if t.batch != seqs {
                invalid!(
                    "q has batch {} but there are {seqs} sequences; without cu_seqlens_q, q is [seqs, heads, seqlen_q, D]",
                    t.batch
                );
            }
            t.seqlen_q
        }
    };
    let kv_batch = k.desc.dims[0];
    let max_seqlen_k = match (layout.block_table, layout.cu_seqlens_k) {
        (Some(_), Some(_)) => {
            invalid!("paged k and v take each sequence's length from seqused_k, not cu_seqlens_k; pass one of them")
        }
        (Some(bt), None) => {
            if t.seqlen_k == 0 {
                invalid!("k's page size (its seq extent) is 0; pages hold at least one key");
            }
            if kv_batch == 0 {
                invalid!("paged k has no pages (batch extent 0)");
            }
            if bt.max_pages == 0 || bt.stride < bt.max_pages {
                invalid!(
                    "block table rows of stride {} cannot hold {} page slots; the stride must be at least max_pages ≥ 1",
                    bt.stride,
                    bt.max_pages
                );
            }
            let needed = seqs.saturating_sub(1).saturating_mul(bt.stride).saturating_add(bt.max_pages);
            if seqs > 0 && bt.len < needed {
                invalid!(
                    "block_table holds {} entries; {seqs} rows of stride {} with {} slots need {needed}",
                    bt.len,
                    bt.stride,
                    bt.max_pages
                );
            }
            let keys = bt.max_pages.saturating_mul(t.seqlen_k);
            if keys > i32::MAX as usize / 2 {
                invalid!("{} pages of {} keys per sequence exceed {} keys", bt.max_pages, t.seqlen_k, i32::MAX / 2);
            }
            keys
        }
        (None, Some(len)) => {
            offsets("cu_seqlens_k", len)?;
            if kv_batch != 1 {
                invalid!("packed k has batch {kv_batch}; with cu_seqlens_k, k holds all sequences' keys in batch 1");
            }
            layout.max_seqlen_k.min(t.seqlen_k)
        }
        (None, None) => {
            if kv_batch != seqs {
                invalid!(
                    "k has batch {kv_batch} but there are {seqs} sequences; without cu_seqlens_k or a block table, k is [seqs, kv_heads, seqlen_k, D]"
                );
            }
            t.seqlen_k
        }
    };
    if let Some(len) = layout.seqused_k
        && len < seqs
    {
        invalid!("seqused_k holds {len} lengths; {seqs} sequences need {seqs}");
    }
    if seqs.saturating_mul(t.kv_heads) > MAX_BATCH_HEADS {
        invalid!(
            "sequences × k/v heads = {} exceeds {MAX_BATCH_HEADS} (the grid's y dimension)",
            seqs as u128 * t.kv_heads as u128
        );
    }
    if kv_batch > i32::MAX as usize || layout.block_table.is_some_and(|t| t.stride > i32::MAX as usize) {
        invalid!("k's batch extent {kv_batch} or the block table's stride exceeds {}", i32::MAX);
    }
    let group = t.heads / t.kv_heads.max(1);
    if max_seqlen_q.saturating_mul(group) > i32::MAX as usize / 2 {
        invalid!("max_seqlen_q {max_seqlen_q} × {group} query heads per k/v head exceeds {}", i32::MAX / 2);
    }
    Ok(VarlenProblem { tensors: t, seqs, kv_batch, max_seqlen_q, max_seqlen_k, pages: layout.block_table })
}

/// Why the Hopper kernel's serving entries cannot run a call, or `None`: they
/// read each key tile (128 keys, 64 at D=192 and 256) from one page by TMA, so
/// pages must hold a multiple of 128 keys (of every head dim's tile); their
/// grid's y dimension is sequences × query heads.
///
/// ```
/// use kernel_ffi::sequences::{PageTable, SeqLayout, hopper_unfit, validate};
/// use kernel_ffi::tensor::{Arg, Desc, Dtype, Layout};
///
/// let q = Desc::new([2, 8, 1, 128], Layout::Bshd);
/// let cache = |page| Desc::new([64, 2, page, 128], Layout::Bshd);
/// let arg = |name, desc: Desc| Arg { name, dtype: Dtype::Bf16, desc, len: desc.span() };
/// let table = Some(PageTable { len: 64, max_pages: 32, stride: 32 });
/// let layout = SeqLayout { seqs: 2, max_seqlen_q: 1, block_table: table, ..SeqLayout::default() };
/// let paged = |page| validate(arg("q", q), arg("k", cache(page)), arg("v", cache(page)), arg("out", q), &layout, None);
/// assert_eq!(hopper_unfit(&paged(256).unwrap()), None);
/// let why = hopper_unfit(&paged(16).unwrap()).unwrap();
/// assert!(why.contains("pages of 16 keys"), "{why}");
/// ```
pub fn hopper_unfit(p: &VarlenProblem) -> Option<String> {
    const TILE: usize = 128;
    let t = &p.tensors;
    if p.pages.is_some() && !t.seqlen_k.is_multiple_of(TILE) {
        return Some(format!(
            "pages of {} keys: the Hopper kernel reads each {TILE}-key tile from one page, so it takes page sizes \
             that are multiples of {TILE}",
            t.seqlen_k
        ));
    }
    if p.seqs.saturating_mul(t.heads) > MAX_BATCH_HEADS {
        return Some(format!(
            "sequences × query heads = {} exceeds {MAX_BATCH_HEADS}, the Hopper kernel's grid's y dimension",
            p.seqs as u128 * t.heads as u128
        ));
    }
    None
}

/// The device arrays of a serving call, copied to the host for [`check_indices`].
#[derive(Debug, Clone, Default)]
pub struct Indices {
    /// `cu_seqlens_q`, where given.
    pub cu_seqlens_q: Option<Vec<i32>>,
    /// `cu_seqlens_k`, where given.
    pub cu_seqlens_k: Option<Vec<i32>>,
    /// `seqused_k`, where given.
    pub seqused_k: Option<Vec<i32>>,
    /// The block table, where given.
    pub block_table: Option<Vec<i32>>,
}

/// The kernels clamp every index they read (a bad one gives wrong rows, never
/// an access outside the tensors); this finds the bad ones first, naming the
/// sequence, the value and the rule: offsets start at 0 or more, never
/// decrease and stay within their tensor's rows; a sequence has at most
/// `max_seqlen_q` query rows and uses at most `max_seqlen_k` keys (the key
/// splits and a window's bounds are sized by it); `seqused_k` is between 0 and
/// the keys the sequence has; every page a sequence's keys lie on is one of
/// k's pages.
///
/// ```
/// use kernel_ffi::sequences::{Indices, SeqLayout, check_indices, validate};
/// use kernel_ffi::tensor::{Arg, Desc, Dtype, Layout};
///
/// let q = Desc::new([1, 4, 10, 64], Layout::Bshd);
/// let arg = |name, desc: Desc| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
/// let layout = SeqLayout { seqs: 2, cu_seqlens_q: Some(3), max_seqlen_q: 6, cu_seqlens_k: Some(3), max_seqlen_k: 6, ..SeqLayout::default() };
/// let p = validate(arg("q", q), arg("k", q), arg("v", q), arg("out", q), &layout, None).unwrap();
/// let mut ix = Indices { cu_seqlens_q: Some(vec![0, 4, 10]), cu_seqlens_k: Some(vec![0, 4, 10]), ..Indices::default() };
/// assert!(check_indices(&p, &ix).is_ok());
/// ix.cu_seqlens_q = Some(vec![0, 4, 11]);
/// let e = check_indices(&p, &ix).unwrap_err();
/// assert!(e.to_string().contains("cu_seqlens_q[2] = 11 is past q's 10 rows"), "{e}");
/// ix.cu_seqlens_q = Some(vec![0, 4, 10]);
/// ix.cu_seqlens_k = Some(vec![0, 3, 10]);
/// let e = check_indices(&p, &ix).unwrap_err();
/// assert!(e.to_string().contains("sequence 1 uses 7 keys but max_seqlen_k is 6"), "{e}");
/// ```
pub fn check_indices(p: &VarlenProblem, ix: &Indices) -> Result<()> {
    let seqs = p.seqs;
    let table_len = p.pages.map_or(0, |t| seqs.saturating_sub(1) * t.stride + t.max_pages);
    for (name, array, needed) in [
        ("cu_seqlens_q", &ix.cu_seqlens_q, seqs + 1),
        ("cu_seqlens_k", &ix.cu_seqlens_k, seqs + 1),
        ("seqused_k", &ix.seqused_k, seqs),
        ("block_table", &ix.block_table, if seqs == 0 { 0 } else { table_len }),
    ] {
        if let Some(a) = array
            && a.len() < needed
        {
            invalid!("{name} holds {} entries; {seqs} sequences need {needed}", a.len());
        }
    }
    if ix.block_table.is_some() != p.pages.is_some() {
        invalid!("a block table is given only with paged k and v");
    }
    let offsets = |name: &str, tensor: &str, cu: &[i32], rows: usize, max_len: Option<usize>| -> Result<()> {
        for (s, pair) in cu.windows(2).take(seqs).enumerate() {
            let (lo, hi) = (i64::from(pair[0]), i64::from(pair[1]));
            if lo < 0 {
                invalid!("{name}[{s}] = {lo} is negative; offsets start at 0 or more");
            }
            if hi < lo {
                invalid!("{name}[{}] = {hi} is below {name}[{s}] = {lo}; offsets never decrease", s + 1);
            }
            if hi > rows as i64 {
                invalid!("{name}[{}] = {hi} is past {tensor}'s {rows} rows", s + 1);
            }
            if let Some(max) = max_len
                && hi - lo > max as i64
            {
                invalid!(
                    "sequence {s} has {} query rows but max_seqlen_q is {max}; rows past it would not be computed",
                    hi - lo
                );
            }
        }
        Ok(())
    };
    if let Some(cu) = &ix.cu_seqlens_q {
        offsets("cu_seqlens_q", "q", cu, p.tensors.seqlen_q, Some(p.max_seqlen_q))?;
    }
    if let Some(cu) = &ix.cu_seqlens_k {
        offsets("cu_seqlens_k", "k", cu, p.tensors.seqlen_k, None)?;
    }
    let rows = p.tensors.seqlen_k; // k's rows per batch: a dense sequence's keys, or a page's
    for s in 0..seqs {
        let has = match (&ix.cu_seqlens_k, &ix.block_table) {
            (Some(cu), _) => i64::from(cu[s + 1]) - i64::from(cu[s]),
            (None, Some(_)) => p.max_seqlen_k as i64,
            (None, None) => rows as i64,
        };
        let used = match &ix.seqused_k {
            Some(u) => {
                let n = i64::from(u[s]);
                if n < 0 || n > has {
                    invalid!("seqused_k[{s}] = {n}; sequence {s} has {has} keys, so it must be in 0..={has}");
                }
                n
            }
            None => has,
        };
        if used > p.max_seqlen_k as i64 {
            invalid!(
                "sequence {s} uses {used} keys but max_seqlen_k is {}; keys past it would not be seen",
                p.max_seqlen_k
            );
        }
        if let (Some(bt), Some(table)) = (&ix.block_table, p.pages) {
            let row = &bt[s * table.stride..];
            let page_size = rows;
            for (slot, &page) in row.iter().take((used as usize).div_ceil(page_size.max(1))).enumerate() {
                if page < 0 || page as usize >= p.kv_batch {
                    invalid!(
                        "block_table[{s}][{slot}] = {page}; sequence {s}'s keys {}..{} lie on it, and k has pages 0..{}",
                        slot * page_size,
                        ((slot + 1) * page_size).min(used as usize),
                        p.kv_batch
                    );
                }
            }
        }
    }
    Ok(())
}
