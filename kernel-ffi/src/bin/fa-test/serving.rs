//! Serving cases: ragged batches of sequences with packed, dense or paged keys
//! (`Attention::forward_varlen`), each sequence checked against the f64 CPU
//! reference on its own rows and keys; query rows no sequence covers must keep
//! their poison; bad index arrays must be refused by `validate` and, unchecked,
//! must not fault.

use anyhow::{Result, bail};
use kernel_ffi::check::{compare, compare_lse, tolerances};
use kernel_ffi::reference::{self, HostTensor};
use kernel_ffi::rng::Rng;
use kernel_ffi::schema::{EntryRecord, ShapeRecord, TestCase};
use kernel_ffi::tensor::HEAD_DIMS;
use kernel_ffi::{
    Attention, BlockTable, CudaSlice, Desc, Dtype, KernelChoice, Layout, Options, Problem, Scores, Sequences, Splits,
    Variant, Window, sequences,
};

/// Where a case's queries lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queries {
    /// [seqs, H, Sq, D]: every sequence has the same rows.
    Dense,
    /// Packed rows with `cu_seqlens_q`, and `gap` rows after the last sequence
    /// that no sequence covers.
    Packed { gap: usize },
}

/// Where a case's keys lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// [seqs, Hkv, max keys, D] with `seqused_k`.
    Dense,
    /// Packed rows with `cu_seqlens_k`.
    Packed,
    /// Pages of `page_size` keys with `seqused_k` as the cache lengths; pages
    /// handed out in a shuffled order, and sequence 1 sharing sequence 0's first
    /// pages (a common prefix) where `shared`.
    Paged { page_size: usize, shared: bool },
}

/// What a case does with its index arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indices {
    /// Good arrays, checked on the host first (`validate`).
    Good,
    /// A block-table entry past the pages and a negative one, a decreasing and
    /// an out-of-range offset: `validate` must refuse them, and unchecked the
    /// kernels must run without a fault.
    Bad,
}

#[derive(Debug, Clone)]
pub struct Case {
    pub dtype: Dtype,
    pub head_dim: usize,
    pub causal: bool,
    /// FlashAttention's `window_size` and `softcap`.
    pub window: Window,
    pub softcap: Option<f32>,
    pub heads: usize,
    pub kv_heads: usize,
    /// Query rows per sequence (all equal with dense queries).
    pub q_lens: Vec<usize>,
    /// Keys per sequence.
    pub k_lens: Vec<usize>,
    pub queries: Queries,
    pub keys: Keys,
    pub splits: Splits,
    pub lse: bool,
    pub indices: Indices,
    /// The kernel: portable, or Hopper (`-hopper`) where its entries take the keys.
    pub variant: Variant,
    /// Tag naming the length set in the case name.
    pub tag: &'static str,
}

impl Case {
    pub fn name(&self) -> String {
        format!(
            "serving-{}-d{}{}{}{}-h{}kv{}-{}-{}-s{}{}{}{}",
            self.dtype.name(),
            self.head_dim,
            if self.causal { "-causal" } else { "" },
            self.window.label(),
            self.softcap.map_or(String::new(), |c| format!("-cap{c}")),
            self.heads,
            self.kv_heads,
            self.tag,
            self.layout_label(),
            self.splits,
            if self.lse { "-lse" } else { "" },
            if self.indices == Indices::Bad { "-bad-indices" } else { "" },
            if self.variant == Variant::Hopper { "-hopper" } else { "" },
        )
    }

    /// Where the queries and keys lie, e.g. `packedq-gap5-paged16-shared`.
    fn layout_label(&self) -> String {
        let q = match self.queries {
            Queries::Dense => "denseq".to_string(),
            Queries::Packed { gap: 0 } => "packedq".to_string(),
            Queries::Packed { gap } => format!("packedq-gap{gap}"),
        };
        let k = match self.keys {
            Keys::Dense => "densek".to_string(),
            Keys::Packed => "packedk".to_string(),
            Keys::Paged { page_size, shared } => format!("paged{page_size}{}", if shared { "-shared" } else { "" }),
        };
        format!("{q}-{k}")
    }

    pub fn shape(&self) -> ShapeRecord {
        ShapeRecord {
            batch: self.q_lens.len(),
            heads: self.heads,
            kv_heads: self.kv_heads,
            seqlen_q: self.q_lens.iter().copied().max().unwrap_or(0),
            seqlen_k: self.k_lens.iter().copied().max().unwrap_or(0),
            head_dim: self.head_dim,
            causal: self.causal,
            window: self.window.pair(),
            softcap: self.softcap,
        }
    }

    /// The mask and modifier, resolved on the longest sequence as the launch API does.
    fn scores(&self) -> Result<Scores> {
        let longest = |lens: &[usize]| lens.iter().copied().max().unwrap_or(0);
        Ok(Scores::resolve(self.causal, self.window, self.softcap, longest(&self.q_lens), longest(&self.k_lens))?)
    }

    pub fn work(&self) -> f64 {
        let pairs: usize = self.q_lens.iter().zip(&self.k_lens).map(|(q, k)| q * k).sum();
        (pairs * self.heads * self.head_dim) as f64
    }
}

/// Length sets: ragged with empty and one-token sequences, lengths off every
/// tile size, a long tail; decode (one query row against long caches);
/// chunked prefill (a few hundred rows against more keys).
fn lengths() -> Vec<(&'static str, Vec<usize>, Vec<usize>)> {
    vec![
        ("ragged", vec![0, 1, 77, 200, 64, 3], vec![10, 1, 130, 513, 64, 0]),
        ("tail", vec![1, 300, 17], vec![5, 1100, 17]),
        ("decode", vec![1; 5], vec![1, 63, 700, 2049, 129]),
        ("chunk", vec![130, 250], vec![400, 250]),
    ]
}

/// Whether the Hopper kernel's serving entries take these keys: packed, dense,
/// or on pages of a multiple of their 128-key tile (`sequences::hopper_unfit`).
fn hopper_takes(keys: Keys) -> bool {
    !matches!(keys, Keys::Paged { page_size, .. } if !page_size.is_multiple_of(128))
}

/// The serving matrix: every dtype × head dim × mask over each length set and
/// key layout, GQA ratios 1 to 8, page sizes of every class (1, odd, below,
/// at and above the 64-key tile, 256), LSE and forced splits rotating through;
/// each on the portable kernel, and again on the Hopper kernel where its
/// entries take the keys.
pub fn matrix() -> Vec<Case> {
    let gqa = [(2, 2), (8, 1), (6, 2), (4, 1), (7, 7), (4, 2)];
    let keys = [
        Keys::Packed,
        Keys::Dense,
        Keys::Paged { page_size: 16, shared: false },
        Keys::Paged { page_size: 64, shared: true },
        Keys::Paged { page_size: 1, shared: false },
        Keys::Paged { page_size: 7, shared: true },
        Keys::Paged { page_size: 128, shared: false },
        Keys::Paged { page_size: 100, shared: false },
        Keys::Paged { page_size: 256, shared: true },
    ];
    let mut cases = Vec::new();
    let mut i = 0usize;
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for causal in [false, true] {
                for (tag, q_lens, k_lens) in lengths() {
                    for (ki, &keys) in keys.iter().enumerate() {
                        i += 1;
                        let dense_q = tag == "decode" && ki % 2 == 0;
                        let (heads, kv_heads) = gqa[(i + ki) % gqa.len()];
                        cases.push(Case {
                            dtype,
                            head_dim,
                            causal,
                            window: Window::default(),
                            softcap: None,
                            heads,
                            kv_heads,
                            q_lens: q_lens.clone(),
                            k_lens: k_lens.clone(),
                            queries: if dense_q { Queries::Dense } else { Queries::Packed { gap: i % 3 * 5 } },
                            keys,
                            splits: [Splits::Fixed(1), Splits::Auto, Splits::Fixed(3)][i % 3],
                            lse: i.is_multiple_of(2),
                            indices: Indices::Good,
                            variant: Variant::Portable,
                            tag,
                        });
                    }
                }
            }
        }
    }
    // Windows and softcaps over every length set: a causal band narrower than a
    // key tile, a capped causal call, and a two-sided band under a cap, each on
    // packed, dense and paged keys in turn.
    let w = |left, right| Window::from_pair(left, right).expect("a valid window");
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for (window, causal, softcap) in
                [(w(40, 0), true, None), (w(-1, -1), true, Some(30.0)), (w(100, 8), false, Some(20.0))]
            {
                for (tag, q_lens, k_lens) in lengths() {
                    i += 1;
                    let (heads, kv_heads) = gqa[i % gqa.len()];
                    cases.push(Case {
                        dtype,
                        head_dim,
                        causal,
                        window,
                        softcap,
                        heads,
                        kv_heads,
                        q_lens: q_lens.clone(),
                        k_lens: k_lens.clone(),
                        queries: Queries::Packed { gap: i % 3 * 5 },
                        keys: [
                            Keys::Packed,
                            Keys::Dense,
                            Keys::Paged { page_size: 128, shared: true },
                            Keys::Paged { page_size: 16, shared: false },
                        ][i % 4],
                        splits: [Splits::Fixed(1), Splits::Auto, Splits::Fixed(3)][i % 3],
                        lse: i.is_multiple_of(2),
                        indices: Indices::Good,
                        variant: Variant::Portable,
                        tag,
                    });
                }
            }
        }
    }
    cases.extend(bad_indices());
    with_hopper(cases)
}

/// The cases, then the Hopper twin of each the Hopper entries take.
fn with_hopper(mut cases: Vec<Case>) -> Vec<Case> {
    let twins: Vec<Case> =
        cases.iter().filter(|c| hopper_takes(c.keys)).map(|c| Case { variant: Variant::Hopper, ..c.clone() }).collect();
    cases.extend(twins);
    cases
}

/// Bad index arrays, one case per key layout that reads them.
fn bad_indices() -> Vec<Case> {
    [
        Keys::Packed,
        Keys::Paged { page_size: 16, shared: false },
        Keys::Paged { page_size: 64, shared: false },
        Keys::Paged { page_size: 128, shared: false },
    ]
    .into_iter()
    .map(|keys| Case {
        dtype: Dtype::Bf16,
        head_dim: 128,
        causal: true,
        window: Window::default(),
        softcap: None,
        heads: 4,
        kv_heads: 2,
        q_lens: vec![3, 40, 1],
        k_lens: vec![100, 200, 300],
        queries: Queries::Packed { gap: 0 },
        keys,
        splits: Splits::Fixed(2),
        lse: true,
        indices: Indices::Bad,
        variant: Variant::Portable,
        tag: "bad",
    })
    .collect()
}

/// The few serving cases compute-sanitizer runs: the page gathers (tile in a
/// page and row by row), packed tails, dense queries, splits with the packed
/// combine, and the bad indices.
pub fn sanitize_set() -> Vec<Case> {
    let mut cases: Vec<Case> = matrix()
        .into_iter()
        .filter(|c| c.dtype == Dtype::Bf16 && c.head_dim == 128 && c.causal && c.indices == Indices::Good)
        .filter(|c| matches!(c.tag, "ragged" | "decode"))
        .collect();
    cases.extend(with_hopper(bad_indices()));
    cases
}

/// Host data of a case: random tensors, their per-sequence views, the arrays.
struct Built {
    q_desc: Desc,
    k_desc: Desc,
    q_bits: Vec<u16>,
    q_vals: Vec<f32>,
    k_bits: Vec<u16>,
    v_bits: Vec<u16>,
    /// Per sequence: (first query row, its batch) and its keys and values as
    /// dense [1, Hkv, k_len, D] host tensors.
    q_at: Vec<(usize, usize)>,
    k_seq: Vec<Vec<f32>>,
    v_seq: Vec<Vec<f32>>,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    used: Vec<i32>,
    table: Vec<i32>,
    max_pages: usize,
}

fn build(case: &Case, rng: &mut Rng) -> Result<Built> {
    let (dtype, d, h, hkv) = (case.dtype, case.head_dim, case.heads, case.kv_heads);
    let seqs = case.q_lens.len();
    let (q_desc, q_at, cu_q) = match case.queries {
        Queries::Dense => {
            let sq = case.q_lens[0];
            if case.q_lens.iter().any(|&n| n != sq) {
                bail!("dense queries need equal lengths");
            }
            (Desc::new([seqs, h, sq, d], Layout::Bshd), (0..seqs).map(|s| (0, s)).collect(), Vec::new())
        }
        Queries::Packed { gap } => {
            let cu = sequences::offsets(&case.q_lens);
            let total = *cu.last().unwrap_or(&0) as usize + gap;
            (Desc::new([1, h, total, d], Layout::Bshd), cu.iter().take(seqs).map(|&o| (o as usize, 0)).collect(), cu)
        }
    };
    let (q_bits, q_vals) = random(rng, dtype, &q_desc, -1.5, 1.5);
    // Each sequence's keys and values, then laid out as the case asks.
    let kv_of = |rng: &mut Rng, lo, hi| -> Vec<Vec<u16>> {
        case.k_lens.iter().map(|&n| rng.bits(dtype, n * hkv * d, lo, hi)).collect()
    };
    let (mut k_rows, mut v_rows) = (kv_of(rng, -1.5, 1.5), kv_of(rng, -0.5, 1.5));
    let row = hkv * d; // elements per key row (all heads), Bshd
    let used: Vec<i32> = case.k_lens.iter().map(|&n| n as i32).collect();
    let (k_desc, k_bits, v_bits, cu_k, table, max_pages) = match case.keys {
        Keys::Packed => {
            let total: usize = case.k_lens.iter().sum();
            (
                Desc::new([1, hkv, total, d], Layout::Bshd),
                k_rows.concat(),
                v_rows.concat(),
                sequences::offsets(&case.k_lens),
                vec![],
                0,
            )
        }
        Keys::Dense => {
            let most = case.k_lens.iter().copied().max().unwrap_or(0);
            let pad = |rows: &[Vec<u16>]| -> Vec<u16> {
                rows.iter()
                    .flat_map(|r| r.iter().copied().chain(std::iter::repeat_n(dtype.nan(), most * row - r.len())))
                    .collect()
            };
            (Desc::new([seqs, hkv, most, d], Layout::Bshd), pad(&k_rows), pad(&v_rows), vec![], vec![], 0)
        }
        Keys::Paged { page_size: ps, shared } => {
            // Sequence 1 starts with sequence 0's first pages (their keys made equal).
            let prefix = if shared && seqs > 1 { (case.k_lens[0].min(case.k_lens[1]) / ps).min(2) } else { 0 };
            for rows in [&mut k_rows, &mut v_rows] {
                let (first, rest) = rows.split_at_mut(1);
                if let Some(second) = rest.first_mut() {
                    second[..prefix * ps * row].copy_from_slice(&first[0][..prefix * ps * row]);
                }
            }
            let pages_of: Vec<usize> = case.k_lens.iter().map(|&n| n.div_ceil(ps)).collect();
            // The longest sequence fills its row of the table: a read past a row's last slot would
            // leave the table (the last row) or name the next row's page.
            let max_pages = pages_of.iter().copied().max().unwrap_or(0).max(1);
            let owned: usize = pages_of.iter().sum::<usize>() - prefix;
            let n_pages = owned + 3; // spare pages no sequence reads, poisoned
            let mut order: Vec<usize> = (0..n_pages).collect();
            for i in (1..n_pages).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut k_pages = vec![dtype.nan(); n_pages * ps * row];
            let mut v_pages = k_pages.clone();
            let mut table = vec![-1i32; seqs * max_pages]; // unused slots name no page
            let mut next = 0;
            for s in 0..seqs {
                for slot in 0..pages_of[s] {
                    let page = if s == 1 && slot < prefix {
                        table[slot] as usize
                    } else {
                        next += 1;
                        order[next - 1]
                    };
                    table[s * max_pages + slot] = page as i32;
                    let lo = slot * ps * row;
                    let hi = ((slot + 1) * ps * row).min(k_rows[s].len());
                    k_pages[page * ps * row..][..hi - lo].copy_from_slice(&k_rows[s][lo..hi]);
                    v_pages[page * ps * row..][..hi - lo].copy_from_slice(&v_rows[s][lo..hi]);
                }
            }
            (Desc::new([n_pages, hkv, ps, d], Layout::Bshd), k_pages, v_pages, vec![], table, max_pages)
        }
    };
    let to_f32 = |rows: Vec<Vec<u16>>| -> Vec<Vec<f32>> {
        rows.into_iter().map(|r| r.into_iter().map(|b| dtype.to_f32(b)).collect()).collect()
    };
    Ok(Built {
        q_desc,
        k_desc,
        q_bits,
        q_vals,
        k_bits,
        v_bits,
        q_at,
        k_seq: to_f32(k_rows),
        v_seq: to_f32(v_rows),
        cu_q,
        cu_k,
        used,
        table,
        max_pages,
    })
}

fn random(rng: &mut Rng, dtype: Dtype, desc: &Desc, lo: f32, hi: f32) -> (Vec<u16>, Vec<f32>) {
    let bits = rng.bits(dtype, desc.span(), lo, hi);
    let vals = bits.iter().map(|&b| dtype.to_f32(b)).collect();
    (bits, vals)
}

/// The f64 reference of each sequence on its own rows and keys, concatenated:
/// outputs in (sequence, head, row, d) order and LSEs in (sequence, head, row).
fn expected(case: &Case, b: &Built, threads: usize, scores: Scores) -> (Vec<f64>, Vec<f64>) {
    let (d, h, hkv) = (case.head_dim, case.heads, case.kv_heads);
    let (mut want, mut want_l) = (Vec::new(), Vec::new());
    for (s, &(row0, batch)) in b.q_at.iter().enumerate() {
        let (sq, sk) = (case.q_lens[s], case.k_lens[s]);
        if sq == 0 {
            continue;
        }
        let problem = Problem {
            batch: 1,
            heads: h,
            kv_heads: hkv,
            seqlen_q: sq,
            seqlen_k: sk,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let q_view = Desc { dims: [1, h, sq, d], strides: b.q_desc.strides };
        let kv_view = Desc::new([1, hkv, sk, d], Layout::Bshd);
        let first = b.q_desc.offset(batch, 0, row0);
        let (o, l) = reference::attention_on(
            threads,
            &HostTensor { desc: q_view, data: &b.q_vals[first..] },
            &HostTensor { desc: kv_view, data: &b.k_seq[s] },
            &HostTensor { desc: kv_view, data: &b.v_seq[s] },
            &problem,
            scores,
        );
        want.extend(o);
        want_l.extend(l);
    }
    (want, want_l)
}

/// The arrays on the device, kept alive for the launch.
struct DeviceArrays {
    cu_q: Option<CudaSlice<i32>>,
    cu_k: Option<CudaSlice<i32>>,
    used: Option<CudaSlice<i32>>,
    table: Option<CudaSlice<i32>>,
}

pub fn run_case(att: &Attention, case: &Case, rng: &mut Rng, threads: usize) -> Result<TestCase> {
    let b = build(case, rng)?;
    let dtype = case.dtype;
    let seqs = case.q_lens.len();
    let s = att.stream();
    let up = |v: &Vec<i32>| -> Result<Option<CudaSlice<i32>>> {
        if v.is_empty() { Ok(None) } else { Ok(Some(s.clone_htod(v)?)) }
    };
    let paged = matches!(case.keys, Keys::Paged { .. });
    let mut cu_k = b.cu_k.clone();
    let mut table = b.table.clone();
    if case.indices == Indices::Bad {
        match case.keys {
            Keys::Packed => {
                cu_k[1] = cu_k[2] + 1_000_000; // past the keys, and above the next offset
            }
            _ => {
                table[0] = b.k_desc.dims[0] as i32 + 5; // past the pages
                table[b.max_pages] = -7;
            }
        }
    }
    let arrays = DeviceArrays {
        cu_q: up(&b.cu_q)?,
        cu_k: up(&cu_k)?,
        used: if matches!(case.keys, Keys::Packed) { None } else { up(&b.used)? },
        table: up(&table)?,
    };
    let q = att.upload(dtype, b.q_desc, &b.q_bits)?;
    let k = att.upload(dtype, b.k_desc, &b.k_bits)?;
    let v = att.upload(dtype, b.k_desc, &b.v_bits)?;
    let mut out = att.alloc_poisoned(dtype, b.q_desc)?;
    let rows = b.q_desc.dims[0] * case.heads * b.q_desc.dims[2];
    let mut lse = if case.lse { Some(att.alloc_lse(rows)?) } else { None };
    let sequences = |validate| Sequences {
        seqs,
        cu_seqlens_q: arrays.cu_q.as_ref(),
        max_seqlen_q: case.q_lens.iter().copied().max().unwrap_or(0),
        cu_seqlens_k: arrays.cu_k.as_ref(),
        max_seqlen_k: case.k_lens.iter().copied().max().unwrap_or(0),
        seqused_k: arrays.used.as_ref(),
        block_table: arrays.table.as_ref().filter(|_| paged).map(|pages| BlockTable {
            pages,
            max_pages: b.max_pages,
            stride: b.max_pages,
        }),
        validate,
    };
    let choice = KernelChoice { variant: case.variant, ..KernelChoice::default() };
    let opts = Options {
        causal: case.causal,
        window: case.window,
        softcap: case.softcap,
        splits: case.splits,
        choice,
        ..Options::default()
    };
    if case.indices == Indices::Bad {
        // Refused when checked; unchecked, run to completion without a fault.
        let refused = att.forward_varlen(&q, &k, &v, &mut out, lse.as_mut(), &sequences(true), &opts);
        let Err(kernel_ffi::Error::Invalid(rule)) = refused else {
            bail!("validate accepted bad indices: {refused:?}");
        };
        let launched = att.forward_varlen(&q, &k, &v, &mut out, lse.as_mut(), &sequences(false), &opts)?;
        att.synchronize()?;
        return Ok(record(
            case,
            launched.entry_record(),
            launched.num_splits,
            0.0,
            0.0,
            0.0,
            0,
            true,
            Some(format!("refused as expected: {rule}")),
        ));
    }
    let launched = att.forward_varlen(&q, &k, &v, &mut out, lse.as_mut(), &sequences(true), &opts)?;
    att.synchronize()?;
    let got_bits = att.download(&out)?;
    let got_lse = match &lse {
        Some(l) => Some(att.download_lse(l, rows)?),
        None => None,
    };

    // Each sequence against the reference on its own rows and keys.
    let (d, h) = (case.head_dim, case.heads);
    let (want, want_l) = expected(case, &b, threads, case.scores()?);
    let (mut got, mut got_l) = (Vec::new(), Vec::new());
    let mut covered = vec![false; rows];
    let lse_row = |batch: usize, head: usize, row: usize| (batch * h + head) * b.q_desc.dims[2] + row;
    for s in 0..seqs {
        let (row0, batch) = b.q_at[s];
        for head in 0..h {
            for i in 0..case.q_lens[s] {
                let off = b.q_desc.offset(batch, head, row0 + i);
                got.extend(got_bits[off..off + d].iter().map(|&x| f64::from(dtype.to_f32(x))));
                covered[lse_row(batch, head, row0 + i)] = true;
                if let Some(gl) = &got_lse {
                    got_l.push(gl[lse_row(batch, head, row0 + i)]);
                }
            }
        }
    }
    // Rows no sequence covers keep their poison, bit for bit.
    let mut touched = 0;
    for batch in 0..b.q_desc.dims[0] {
        for head in 0..h {
            for row in 0..b.q_desc.dims[2] {
                if !covered[lse_row(batch, head, row)] {
                    let off = b.q_desc.offset(batch, head, row);
                    touched += got_bits[off..off + d].iter().filter(|&&x| x != dtype.nan()).count();
                }
            }
        }
    }
    let errs = compare(got, &want);
    let (lse_max_abs, lse_bad) = if got_lse.is_some() { compare_lse(&got_l, &want_l) } else { (0.0, 0) };
    let (tol_rel_l2, tol_max_abs, tol_lse) = tolerances(dtype);
    let passed = errs.non_finite == 0
        && lse_bad == 0
        && touched == 0
        && errs.rel_l2 <= tol_rel_l2
        && errs.max_abs <= tol_max_abs
        && lse_max_abs <= tol_lse;
    let error = (touched > 0).then(|| format!("{touched} elements of rows no sequence covers were written"));
    Ok(TestCase {
        tol_rel_l2,
        tol_max_abs,
        tol_lse,
        ..record(
            case,
            launched.entry_record(),
            launched.num_splits,
            errs.rel_l2,
            errs.max_abs,
            lse_max_abs,
            errs.non_finite + lse_bad,
            passed,
            error,
        )
    })
}

#[allow(clippy::too_many_arguments)]
fn record(
    case: &Case,
    entry: EntryRecord,
    num_splits: u32,
    rel_l2: f64,
    max_abs: f64,
    lse_max_abs: f64,
    non_finite: usize,
    passed: bool,
    error: Option<String>,
) -> TestCase {
    TestCase {
        name: case.name(),
        gpu: None,
        dtype: case.dtype.name().into(),
        shape: case.shape(),
        layout: case.layout_label(),
        entry,
        splits: case.splits.to_string(),
        num_splits,
        lse: case.lse,
        reference: "cpu-f64".into(),
        rel_l2,
        max_abs,
        lse_max_abs,
        tol_rel_l2: 0.0,
        tol_max_abs: 0.0,
        tol_lse: 0.0,
        non_finite,
        passed,
        seconds: 0.0,
        error,
    }
}

/// The record of a case that could not run.
pub fn not_run(case: &Case, e: &anyhow::Error) -> TestCase {
    let (variant, block_m) = match case.variant {
        Variant::Hopper => ("hopper", 128),
        _ => ("portable", 64),
    };
    let entry = EntryRecord { variant: variant.into(), block_m, key_groups: 1, ..EntryRecord::default() };
    TestCase {
        rel_l2: f64::NAN,
        max_abs: f64::NAN,
        lse_max_abs: f64::NAN,
        ..record(case, entry, 0, 0.0, 0.0, 0.0, 0, false, Some(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use kernel_ffi::sequences::{self, PageTable, SeqLayout};
    use kernel_ffi::tensor::Arg;

    use super::*;

    #[test]
    fn names_are_unique_and_every_layout_class_is_covered() {
        let cases = matrix();
        let names: std::collections::HashSet<String> = cases.iter().map(Case::name).collect();
        assert_eq!(names.len(), cases.len(), "duplicate serving case names");
        for ps in [1, 7, 16, 64, 100, 128, 256] {
            assert!(
                cases.iter().any(|c| c.keys == Keys::Paged { page_size: ps, shared: false }
                    || c.keys == Keys::Paged { page_size: ps, shared: true }),
                "page size {ps}"
            );
        }
        assert!(cases.iter().any(|c| c.heads / c.kv_heads == 8) && cases.iter().any(|c| c.heads == c.kv_heads));
        assert!(cases.iter().any(|c| c.queries == Queries::Dense));
        assert!(cases.iter().any(|c| matches!(c.queries, Queries::Packed { gap } if gap > 0)));
        assert!(sanitize_set().iter().any(|c| c.indices == Indices::Bad));
        for variant in [Variant::Portable, Variant::Hopper] {
            let of = |set: &[Case]| set.iter().filter(|c| c.variant == variant).count();
            assert!(of(&cases) > 100 && of(&sanitize_set()) > 5, "{variant:?}");
        }
    }

    #[test]
    fn every_cases_arrays_pass_the_host_checks_and_its_reference_runs() {
        let mut rng = Rng::new(3);
        // One dtype and head dim: the layouts, lengths and GQA shapes rotate through each.
        for case in matrix().into_iter().filter(|c| c.dtype == Dtype::F16 && c.head_dim == 64) {
            let b = build(&case, &mut rng).unwrap();
            let seqs = case.q_lens.len();
            let paged = matches!(case.keys, Keys::Paged { .. });
            let arg = |name, desc: Desc| Arg { name, dtype: case.dtype, desc, len: desc.span() };
            let layout = SeqLayout {
                seqs,
                cu_seqlens_q: (!b.cu_q.is_empty()).then_some(b.cu_q.len()),
                max_seqlen_q: case.q_lens.iter().copied().max().unwrap_or(0),
                cu_seqlens_k: (!b.cu_k.is_empty()).then_some(b.cu_k.len()),
                max_seqlen_k: case.k_lens.iter().copied().max().unwrap_or(0),
                seqused_k: (!matches!(case.keys, Keys::Packed)).then_some(b.used.len()),
                block_table: paged.then_some(PageTable {
                    len: b.table.len(),
                    max_pages: b.max_pages,
                    stride: b.max_pages,
                }),
            };
            let p = sequences::validate(
                arg("q", b.q_desc),
                arg("k", b.k_desc),
                arg("v", b.k_desc),
                arg("out", b.q_desc),
                &layout,
                None,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", case.name()));
            let ix = sequences::Indices {
                cu_seqlens_q: (!b.cu_q.is_empty()).then(|| b.cu_q.clone()),
                cu_seqlens_k: (!b.cu_k.is_empty()).then(|| b.cu_k.clone()),
                seqused_k: layout.seqused_k.map(|_| b.used.clone()),
                block_table: paged.then(|| b.table.clone()),
            };
            if case.indices == Indices::Good {
                sequences::check_indices(&p, &ix).unwrap_or_else(|e| panic!("{}: {e}", case.name()));
            }
            let unfit = sequences::hopper_unfit(&p);
            assert_eq!(unfit.is_none(), hopper_takes(case.keys), "{}: {unfit:?}", case.name());
            // The reference (slow unoptimised) on decode's short rows, one layout each.
            if case.tag == "decode" && !case.causal {
                let (want, _) = expected(&case, &b, 1, case.scores().unwrap());
                let rows: usize = case.q_lens.iter().sum::<usize>() * case.heads * case.head_dim;
                assert_eq!(want.len(), rows, "{}", case.name());
            }
        }
    }

    #[test]
    fn paged_layout_holds_each_sequences_keys_on_its_pages() {
        let mut rng = Rng::new(7);
        let case = Case { keys: Keys::Paged { page_size: 7, shared: true }, ..matrix()[0].clone() };
        let b = build(&case, &mut rng).unwrap();
        let (ps, row) = (7, case.kv_heads * case.head_dim);
        for (s, &n) in case.k_lens.iter().enumerate() {
            for key in 0..n {
                let page = b.table[s * b.max_pages + key / ps] as usize;
                let at = (page * ps + key % ps) * row;
                let want: Vec<u16> =
                    b.k_seq[s][key * row..(key + 1) * row].iter().map(|&x| case.dtype.from_f32(x)).collect();
                assert_eq!(&b.k_bits[at..at + row], &want[..], "sequence {s} key {key}");
            }
        }
    }
}
