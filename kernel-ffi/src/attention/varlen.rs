//! Serving calls: sequences of different lengths in one launch, their keys
//! packed, dense or in a paged cache (`forward_varlen`), on the portable
//! kernel's `_varlen` entries or the Hopper kernel's.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::launch::tensor_map;
use super::memory::device_ptr;
use super::{Attention, Family, Launched, Options, Splits, Tensor, Variant, validate};
use crate::error::{CudaContext, Error, Result, invalid};
use crate::params::{FastDiv, HopperParams, HopperSched, HopperVarlenParams, SeqParams, TmaDesc, VarlenParams};
use crate::planner::{self, Plan};
use crate::scores::{Band, Scores};
use crate::sequences::{self, Indices, PageTable, SeqLayout, VarlenProblem};
use crate::tensor::Dtype;

/// A serving call's sequences: where each one's query rows and keys lie in
/// the tensors (FlashAttention's `cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`,
/// `block_table`; [`sequences`] has the layouts and rules). Arrays are int32
/// on the device.
///
/// The kernels clamp every index they read from these arrays into its tensor:
/// a bad offset, length or page gives wrong rows, never an access outside the
/// tensors. Query rows of packed q that no sequence covers (and a sequence's
/// rows past `max_seqlen_q`) are left as they were. With `validate`, the
/// arrays are copied to the host first (a synchronising copy) and a bad entry
/// is refused with its sequence, value and rule
/// ([`sequences::check_indices`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sequences<'a> {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Packed queries: seqs + 1 row offsets into q and out ([1, H, total_q, D]);
    /// `None`: q is [seqs, H, Sq, D].
    pub cu_seqlens_q: Option<&'a CudaSlice<i32>>,
    /// Packed queries: the most rows a sequence has.
    pub max_seqlen_q: usize,
    /// Packed keys: seqs + 1 row offsets into k and v ([1, Hkv, total_k, D]).
    pub cu_seqlens_k: Option<&'a CudaSlice<i32>>,
    /// Packed keys: the most keys a sequence has (sizes the split plan).
    pub max_seqlen_k: usize,
    /// Keys each sequence uses (≤ what it has); FlashAttention's `seqused_k`
    /// and `flash_attn_with_kvcache`'s `cache_seqlens`.
    pub seqused_k: Option<&'a CudaSlice<i32>>,
    /// Paged keys: k and v are [pages, Hkv, page_size, D], any page size ≥ 1.
    pub block_table: Option<BlockTable<'a>>,
    /// Copy the arrays to the host and check every entry before launching.
    pub validate: bool,
}

/// A paged cache's block table: `[seqs, stride]` page indices, each
/// sequence's keys lying on the pages of its first `max_pages` slots in order
/// (pages may repeat within and across sequences).
#[derive(Debug, Clone, Copy)]
pub struct BlockTable<'a> {
    /// The page indices.
    pub pages: &'a CudaSlice<i32>,
    /// Page slots per sequence.
    pub max_pages: usize,
    /// Elements between one sequence's row and the next (≥ `max_pages`).
    pub stride: usize,
}

impl Sequences<'_> {
    /// The layout the rules are checked on: each array's length.
    pub fn layout(&self) -> SeqLayout {
        SeqLayout {
            seqs: self.seqs,
            cu_seqlens_q: self.cu_seqlens_q.map(CudaSlice::len),
            max_seqlen_q: self.max_seqlen_q,
            cu_seqlens_k: self.cu_seqlens_k.map(CudaSlice::len),
            max_seqlen_k: self.max_seqlen_k,
            seqused_k: self.seqused_k.map(CudaSlice::len),
            block_table: self.block_table.map(|t| PageTable {
                len: t.pages.len(),
                max_pages: t.max_pages,
                stride: t.stride,
            }),
        }
    }
}

impl Attention {
    /// Attention over each sequence of a serving batch (FlashAttention's
    /// `flash_attn_varlen_func` and `flash_attn_with_kvcache`): out =
    /// softmax(q·kᵀ·scale [+ causal mask])·v per sequence, and optionally the
    /// LSE into `lse` ([batch, H, rows] of q's own extents: (H, total_q) when
    /// packed). Causal is bottom-right aligned per sequence; the query heads that
    /// share a K/V head share its tiles (GQA packing); keys may be split over
    /// CTAs (`opts.splits`, else planned for the longest sequence). Prefill runs
    /// on the Hopper kernel where loaded (`varlen_family`), decode on the
    /// portable one; every shape rule is checked before anything is launched.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        seqs: &Sequences,
        opts: &Options,
    ) -> Result<Launched> {
        self.forward_varlen_on(&self.stream, q, k, v, out, lse, seqs, opts)
    }

    /// `forward_varlen` enqueued on `stream`, as `forward_on`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        seqs: &Sequences,
        opts: &Options,
    ) -> Result<Launched> {
        let p = sequences::validate(q.arg("q"), k.arg("k"), v.arg("v"), out.arg("out"), &seqs.layout(), opts.scale)?;
        if q.dtype == Dtype::E4m3 {
            return Err(Error::Unsupported(
                "serving calls take f16 or bf16; e4m3 runs dense calls only (forward_descaled_on)".into(),
            ));
        }
        if let Some(l) = lse.as_deref()
            && l.len() < p.rows()
        {
            invalid!("lse holds {} floats but batch × heads × rows of q = {}", l.len(), p.rows());
        }
        // Resolved on the longest sequence: a side that bounds none of its rows
        // bounds no shorter sequence's either; the kernels align each sequence's own.
        let scores = opts.scores(p.max_seqlen_q, p.max_seqlen_k)?;
        let family = self.varlen_family(opts, &p, q.dtype, scores)?;
        let name = varlen_entry(family, q.dtype, p.tensors.head_dim, scores);
        let kern = self.kernel(&name)?;
        let block_m = kern.launch.block_m;
        if opts.choice.block_m.is_some_and(|m| m != block_m) || opts.choice.key_groups.is_some_and(|g| g != 1) {
            invalid!("{name} runs {block_m} query rows and one key group per CTA");
        }
        validate::aligned([("q", q), ("k", k), ("v", v), ("out", out)], stream)?;
        if seqs.validate {
            self.check_indices(stream, seqs, &p)?;
        }
        // Grid y: the portable entries' rows are a sequence's tokens × the query
        // heads of one K/V head (GQA packing); the Hopper entries' one query head's.
        let (rows_per_seq, seq_heads) = match family {
            Family::Portable => (p.max_seqlen_q * p.group(), p.seqs * p.tensors.kv_heads),
            Family::Hopper => (p.max_seqlen_q, p.seqs * p.tensors.heads),
        };
        let m_blocks = rows_per_seq.div_ceil(block_m as usize) as u32;
        if p.seqs == 0 || p.rows() == 0 || m_blocks == 0 {
            return Ok(Launched { family, ..Launched::default() }); // nothing to compute
        }
        let seq_heads = seq_heads as u32; // ≤ MAX_BATCH_HEADS (sequences::validate, sequences::hopper_unfit)
        let work = u64::from(m_blocks) * u64::from(seq_heads);
        let plan =
            plan(opts.splits, self.device.sm_count, kern.ctas_per_sm, work, &p, kern.launch.block_n, scores.band);
        let s = stream;
        let partials = self.alloc_partials(s, &p.tensors, plan.num_splits)?;
        let lse = lse.map_or(0, |l| device_ptr(l, s));
        let params = Self::flash_params(s, [q, k, v, out], lse, partials.as_ref(), &p.tensors, &plan, scores);
        let seq = seq_params(s, seqs, &p);
        let cfg = LaunchConfig {
            grid_dim: (m_blocks, seq_heads, plan.num_splits),
            block_dim: (kern.launch.threads, 1, 1),
            shared_mem_bytes: kern.dynamic_smem,
        };
        match family {
            Family::Portable => {
                let vp = VarlenParams { p: params, seq };
                // SAFETY: matches `flash_fwd_varlen_<dtype>_d<D>[_causal|_local][_softcap](const VarlenParams p)` in
                // kernels/flash_fwd_<dtype>.cu. sequences::validate proved every row of q/k/v/out's
                // dims lies inside its buffer (strides multiples of 8 elements), validate::aligned that
                // pointers are 16-byte aligned, and that the index arrays hold seqs + 1 offsets, seqs
                // lengths and seqs rows of the block table; the kernel clamps every index it reads
                // from them into those dims (kernels/seqinfo.cuh). lse (if any) holds rows() floats; the
                // partials hold splits · rows() (· D). The buffers outlive the launch: the stream frees
                // in order, and the caller's arrays are borrowed for the call.
                unsafe { s.launch_builder(&kern.func).arg(&vp).launch(cfg) }.cuda(format!("launching {name}"))?;
            }
            Family::Hopper => {
                let map = |t: &Tensor, rows: u32| tensor_map(device_ptr(&t.data, s), t.dtype, &t.desc, rows);
                let vp = HopperVarlenParams {
                    hp: HopperParams {
                        q_map: map(q, block_m)?,
                        k_map: map(k, kern.launch.block_n)?,
                        v_map: map(v, kern.launch.block_n)?,
                        o_map: TmaDesc([0; 16]), // the serving entries store O without TMA
                        p: params,
                        sched: unused_sched(),
                    },
                    seq,
                };
                // SAFETY: matches `flash_fwd_hopper_varlen_<dtype>_d<D>[_causal|_local][_softcap](const __grid_constant__
                // HopperVarlenParams p)` in kernels/flash_fwd_hopper_<dtype>.cu. The tensor maps describe
                // exactly the validated q/k/v extents (TMA zero-fills and never reads past them; paged,
                // hopper_unfit proved each key tile (at most 128 keys) lies in one page); out, lse and the
                // partials are written with plain stores, as by the portable entries (the arm above): the
                // same validation, clamping and lifetimes hold.
                unsafe { s.launch_builder(&kern.func).arg(&vp).launch(cfg) }.cuda(format!("launching {name}"))?;
            }
        }
        if let Some(partials) = &partials {
            let packed = seqs.cu_seqlens_q.map(|cu| (device_ptr(cu, s), p.seqs as i32, p.max_seqlen_q as i32));
            self.launch_combine(s, q.dtype, &p.tensors, plan.num_splits, partials, out, lse, packed)?;
        }
        Ok(Launched {
            kernel: name,
            num_splits: plan.num_splits,
            ctas: work * u64::from(plan.num_splits),
            family,
            block_m,
            key_groups: 1,
            persistent: false,
            dequantised: false,
        })
    }

    /// The kernel a serving call runs: `Auto` takes the Hopper kernel's entries
    /// where loaded, where they can run the call (`sequences::hopper_unfit`) and
    /// the caller's `block_m` (if any), and for prefill
    /// (`planner::prefer_hopper_varlen`).
    fn varlen_family(&self, opts: &Options, p: &VarlenProblem, dtype: Dtype, scores: Scores) -> Result<Family> {
        let unfit = sequences::hopper_unfit(p);
        match opts.choice.variant {
            Variant::Portable => Ok(Family::Portable),
            Variant::Auto => {
                let hopper = self.kernels.get(&varlen_entry(Family::Hopper, dtype, p.tensors.head_dim, scores));
                let takes = hopper.is_some_and(|k| opts.choice.block_m.is_none_or(|m| m == k.launch.block_m));
                Ok(if takes && unfit.is_none() && planner::prefer_hopper_varlen(p.max_seqlen_q) {
                    Family::Hopper
                } else {
                    Family::Portable
                })
            }
            Variant::Hopper => {
                self.resolve(&p.tensors, Variant::Hopper)?; // the device's error, where it has no Hopper kernel
                match unfit {
                    Some(why) => Err(Error::Unsupported(format!("{why}; use the portable variant (or auto)"))),
                    None => Ok(Family::Hopper),
                }
            }
        }
    }

    /// Copies the index arrays to the host (waiting for `stream`) and checks
    /// every entry.
    fn check_indices(&self, stream: &Arc<CudaStream>, seqs: &Sequences, p: &VarlenProblem) -> Result<()> {
        let host = |a: Option<&CudaSlice<i32>>, what: &str| -> Result<Option<Vec<i32>>> {
            a.map(|a| stream.clone_dtoh(a).cuda(format!("copying {what} to the host to validate it"))).transpose()
        };
        let ix = Indices {
            cu_seqlens_q: host(seqs.cu_seqlens_q, "cu_seqlens_q")?,
            cu_seqlens_k: host(seqs.cu_seqlens_k, "cu_seqlens_k")?,
            seqused_k: host(seqs.seqused_k, "seqused_k")?,
            block_table: host(seqs.block_table.map(|t| t.pages), "the block table")?,
        };
        stream.synchronize().cuda("copying the sequence arrays to the host")?;
        sequences::check_indices(p, &ix)
    }
}

/// The split plan: the caller's count, else `planner::plan_ragged` for the
/// longest sequence (the others' lengths are on the device); one split under a
/// window, whose rows each see a window's keys wherever the band lies.
fn plan(
    splits: Splits,
    sm_count: u32,
    ctas_per_sm: u32,
    work: u64,
    p: &VarlenProblem,
    block_n: u32,
    band: Band,
) -> Plan {
    let max_k = p.max_seqlen_k.min(u32::MAX as usize) as u32;
    match splits {
        Splits::Fixed(n) => planner::plan_fixed(n, max_k, block_n),
        Splits::Auto if matches!(band, Band::Local { .. }) => planner::plan_fixed(1, max_k, block_n),
        Splits::Auto => planner::plan_ragged(sm_count, ctas_per_sm, work, max_k, block_n),
    }
}

/// The serving entry of a family: `flash_fwd[_hopper]_varlen_<dtype>_d<D>[_causal|_local][_softcap]`.
fn varlen_entry(family: Family, dtype: Dtype, head_dim: usize, scores: Scores) -> String {
    let stem = match family {
        Family::Portable => "flash_fwd_varlen",
        Family::Hopper => "flash_fwd_hopper_varlen",
    };
    format!("{stem}_{}_d{head_dim}{}", dtype.name(), scores.suffix())
}

/// The Hopper entries' schedule, which the serving entries do not read.
fn unused_sched() -> HopperSched {
    let one = FastDiv::new(1);
    HopperSched {
        units: 0,
        per_head: one,
        bh: one,
        heads: one,
        group: one,
        blocks: one,
        order: 0,
        order_stride: 0,
        whole_units: 0,
    }
}

/// The kernels' view of the sequences.
fn seq_params(s: &CudaStream, seqs: &Sequences, p: &VarlenProblem) -> SeqParams {
    let ptr = |a: Option<&CudaSlice<i32>>| a.map_or(0, |a| device_ptr(a, s));
    let table = seqs.block_table;
    SeqParams {
        cu_seqlens_q: ptr(seqs.cu_seqlens_q),
        cu_seqlens_k: ptr(seqs.cu_seqlens_k),
        seqused_k: ptr(seqs.seqused_k),
        block_table: ptr(table.map(|t| t.pages)),
        seqs: p.seqs as i32,
        max_seqlen_q: p.max_seqlen_q as i32,
        kv_batch: p.kv_batch as i32,
        block_table_stride: table.map_or(0, |t| t.stride as i32),
        max_pages: table.map_or(0, |t| t.max_pages as i32),
        group: FastDiv::new(p.group() as u32),
        page_size: FastDiv::new(if table.is_some() { p.tensors.seqlen_k as u32 } else { 1 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;
    use crate::tensor::HEAD_DIMS;

    #[test]
    fn the_manifest_serves_every_head_dim_with_every_mask_and_modifier() {
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let has = |name: &str| m.sources.iter().any(|s| s.kernels.iter().any(|k| k.entry == name));
        let bands = [Band::Full, Band::Causal, Band::Local { left: 8, right: 0 }];
        for dtype in [Dtype::F16, Dtype::Bf16] {
            for d in HEAD_DIMS {
                assert!(has(&format!("flash_combine_varlen_{}_d{d}", dtype.name())), "combine {d}");
                for band in bands {
                    for softcap in [None, Some(30.0)] {
                        let scores = Scores { band, softcap };
                        for family in [Family::Portable, Family::Hopper] {
                            let name = varlen_entry(family, dtype, d, scores);
                            assert!(has(&name), "{name} is not in kernels/manifest.json");
                        }
                    }
                }
            }
        }
    }
}
