//! The forward call's launches: split partials, kernel parameters, the grid,
//! and the `unsafe` launches of the forward and combine entries, each with the
//! `.cu` signature it matches.

use cudarc::driver::sys::{
    self as cu, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::memory::{device_ptr, strides};
use super::{Attention, Chosen, Descales, Family, Kernel, Precision, Tensor};
use crate::error::{CudaContext, Error, Result};
use crate::params::{
    CombineParams, DequantParams, FastDiv, FlashParams, Fp8Params, HopperFp8Params, HopperParams, HopperSched, TmaDesc,
    TransposeParams,
};
use crate::planner::{self, Plan};
use crate::schema::EntryRecord;
use crate::scores::Scores;
use crate::tensor::{Desc, Dtype, Layout, Problem};

/// What a forward call launched: the entry the planner (or the caller's
/// [`KernelChoice`](crate::KernelChoice)) chose and its grid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launched {
    /// The forward entry launched (empty when nothing was launched).
    pub kernel: String,
    /// Key splits (1: no combine launch; 0 when nothing was launched).
    pub num_splits: u32,
    /// CTAs of the attention kernel (0 when nothing was launched).
    pub ctas: u64,
    /// The kernel family that ran.
    pub family: Family,
    /// Its query rows per CTA (0 when nothing was launched).
    pub block_m: u32,
    /// Its key groups per CTA (0 when nothing was launched).
    pub key_groups: u32,
    /// Whether its CTAs were persistent.
    pub persistent: bool,
    /// e4m3 inputs dequantised into 16-bit scratch for it, where no e4m3 entry
    /// runs the call (windows, softcap; the Hopper kernel at head dim 64).
    pub dequantised: bool,
}

impl Launched {
    /// The entry as the reports record it.
    pub fn entry_record(&self) -> EntryRecord {
        EntryRecord {
            kernel: self.kernel.clone(),
            variant: self.family.name().into(),
            block_m: self.block_m,
            key_groups: self.key_groups,
            persistent: self.persistent,
        }
    }
}

/// Each split's results, which the combine entry merges: fp32 outputs
/// (splits · rows · D) and LSEs (splits · rows).
pub(super) struct Partials {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

/// A forward launch's grid. A persistent entry: as many CTAs as are resident at
/// once, each looping over its units from a 1-D grid (causal: pairs of query
/// blocks, longest with shortest; else single blocks); the others take (query
/// block, batch × head, split) from a 3-D grid.
pub(super) struct Grid {
    cfg: LaunchConfig,
    /// Query blocks per (batch, head).
    m_blocks: u32,
    /// Units per (split, batch, head); causal: per (batch, head) (`planner::Units`).
    per_head: u32,
    /// Units in all.
    units: u64,
    /// Units run whole; a split-tail entry runs the rest as 64-row items.
    whole_units: u64,
}

impl Grid {
    pub(super) fn new(sm_count: u32, c: &Chosen, p: &Problem, causal: bool) -> Result<Grid> {
        let (kern, splits) = (c.kern, c.plan.num_splits);
        let m_blocks = (p.seqlen_q as u32).div_ceil(kern.launch.block_m);
        let all = planner::Units::new(m_blocks, splits, (p.batch * p.heads) as u64, causal);
        let (per_head, units) = (all.per_head, all.total);
        let grid_dim = if kern.launch.persistent {
            let slots = u64::from(sm_count) * u64::from(kern.ctas_per_sm.max(1));
            (units.min(slots) as u32, 1, 1)
        } else {
            (m_blocks, (p.batch * p.heads) as u32, splits)
        };
        // Three consumer warpgroups in a persistent CTA (the Hopper kernel's kSplitTail).
        let split_tail = kern.launch.persistent && kern.launch.block_m == 3 * 64;
        let blocks = u64::from(m_blocks) * (p.batch * p.heads) as u64 * u64::from(splits);
        if kern.launch.persistent && !planner::decodes_in_i32(blocks, units, u64::from(grid_dim.0), split_tail) {
            return Err(Error::Unsupported(format!(
                "{blocks} query blocks × batch × heads × splits in {units} units on {} CTAs: {} decodes them in \
                 32-bit ints, which they would overflow; split the batch",
                grid_dim.0, c.name
            )));
        }
        let whole_units = if split_tail { planner::whole_units(units, u64::from(grid_dim.0)) } else { units };
        let cfg =
            LaunchConfig { grid_dim, block_dim: (kern.launch.threads, 1, 1), shared_mem_bytes: kern.dynamic_smem };
        Ok(Grid { cfg, m_blocks, per_head, units, whole_units })
    }

    pub(super) fn ctas(&self) -> u64 {
        let (x, y, z) = self.cfg.grid_dim;
        u64::from(x) * u64::from(y) * u64::from(z)
    }
}

impl Attention {
    /// The split partials of a plan of `splits` (none for one split).
    pub(super) fn alloc_partials(&self, s: &Arc<CudaStream>, p: &Problem, splits: u32) -> Result<Option<Partials>> {
        if splits <= 1 {
            return Ok(None);
        }
        let n = splits as usize * p.rows();
        // SAFETY: every element is written by the forward kernel before the combine reads it
        // (each split writes all its rows, including those that saw no key).
        // Stream-ordered on the call's stream: freed there after the combine read them.
        let o = unsafe { self.scratch.alloc::<f32>(s, n * p.head_dim) }.cuda("allocating split partials")?;
        let lse = unsafe { self.scratch.alloc::<f32>(s, n) }.cuda("allocating split LSEs")?;
        Ok(Some(Partials { o, lse }))
    }

    /// The forward entries' parameters for these buffers (`lse`: its device
    /// address, 0 for none), this plan and these scores.
    pub(super) fn flash_params(
        s: &CudaStream,
        [q, k, v, out]: [&Tensor; 4],
        lse: u64,
        partials: Option<&Partials>,
        p: &Problem,
        plan: &Plan,
        scores: Scores,
    ) -> FlashParams {
        let ptr = |t: &Tensor| device_ptr(&t.data, s);
        // The e4m3 entries' tiles move pairs of elements: their strides count pairs.
        let strides = |t: &Tensor| strides(&t.desc).map(|x| if t.dtype == Dtype::E4m3 { x / 2 } else { x });
        let (scale_log2, softcap_pre) = scores.kernel_scales(p.scale);
        let (window_left, window_right) = scores.band.window();
        FlashParams {
            q: ptr(q),
            k: ptr(k),
            v: ptr(v),
            o: ptr(out),
            lse,
            o_partial: partials.map_or(0, |b| device_ptr(&b.o, s)),
            lse_partial: partials.map_or(0, |b| device_ptr(&b.lse, s)),
            q_strides: strides(q),
            k_strides: strides(k),
            v_strides: strides(v),
            o_strides: strides(out),
            batch: p.batch as i32,
            heads: p.heads as i32,
            kv_heads: p.kv_heads as i32,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            num_splits: plan.num_splits as i32,
            keys_per_split: plan.keys_per_split as i32,
            scale_log2,
            window_left,
            window_right,
            softcap_pre,
        }
    }

    pub(super) fn launch_portable(s: &CudaStream, c: &Chosen, grid: &Grid, params: &FlashParams) -> Result<()> {
        // SAFETY: matches `flash_fwd_<dtype>_d<D>[_causal|_local][_softcap][_m64|_kg2](const FlashParams p)` in
        // kernels/flash_fwd_<dtype>.cu. tensor::validate proved every (b, h, s) row of q/k/v/out
        // lies inside its buffer and strides are 16-byte multiples, validate::aligned that
        // pointers are 16-byte aligned; lse (if any) holds B·H·Sq floats; the partials hold
        // splits·B·H·Sq(·D). The buffers outlive the launch because the stream frees in order.
        unsafe { s.launch_builder(&c.kern.func).arg(params).launch(grid.cfg) }.cuda(format!("launching {}", c.name))?;
        Ok(())
    }

    /// `t` (e4m3) times its descale into new 16-bit scratch of `dtype`, [B, S, H, D]
    /// contiguous (`group`: heads per descale column), enqueued on `s`.
    pub(super) fn dequantise(
        &self,
        s: &Arc<CudaStream>,
        t: &Tensor,
        descale: Option<&CudaSlice<f32>>,
        kv_heads: usize,
        group: usize,
        dtype: Dtype,
    ) -> Result<Tensor> {
        let name = Precision { input: Dtype::E4m3, output: dtype }.dequantise_entry();
        let kern = self.kernels.get(&name).ok_or_else(|| {
            Error::Unsupported(format!(
                "{name} is not loaded: e4m3 inputs run on sm_89 and sm_90, which the e4m3 and dequantisation \
                 entries are built for; {} is {}: cast the inputs to bf16",
                self.device.name, self.device.compute_capability
            ))
        })?;
        let [batch, heads, rows, head_dim] = t.desc.dims;
        let desc = Desc::new(t.desc.dims, Layout::Bshd);
        // SAFETY: every element is written by the launch below before anything reads it
        // (a thread per 16-byte chunk of every row); stream-ordered on `s`, freed there.
        let data = unsafe { self.scratch.alloc::<u8>(s, (desc.span() * dtype.bytes()).max(16)) }
            .cuda("allocating dequantised inputs")?;
        let chunks = desc.numel() as u64 / 16;
        if chunks == 0 {
            return Ok(Tensor { data, dtype, desc });
        }
        let blocks = u32::try_from(chunks.div_ceil(256))
            .map_err(|_| Error::Unsupported(format!("{name}: {chunks} chunks need more than 2^32 blocks")))?;
        let params = DequantParams {
            src: device_ptr(&t.data, s),
            dst: device_ptr(&data, s),
            descale: descale.map_or(0, |d| device_ptr(d, s)),
            strides: strides(&t.desc),
            batch: batch as i32,
            heads: heads as i32,
            rows: rows as i32,
            head_dim: head_dim as i32,
            kv_heads: kv_heads as i32,
            group: group as i32,
        };
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches `dequantise_e4m3_<out dtype>(const DequantParams p)` in
        // kernels/flash_fwd_e4m3.cu. `t` was validated (its rows inside its buffer, strides
        // multiples of 16 elements, its pointer 16-byte aligned: validate::aligned); `data`
        // holds its elements as `dtype`; the descale holds batch × kv_heads floats
        // (validate::descales); threads past the last chunk return.
        unsafe { s.launch_builder(&kern.func).arg(&params).launch(cfg) }.cuda(format!("launching {name}"))?;
        Ok(Tensor { data, dtype, desc })
    }

    /// An e4m3 entry takes the portable entries' parameters (strides in pairs of
    /// elements) and the descales.
    pub(super) fn launch_e4m3(
        s: &CudaStream,
        c: &Chosen,
        grid: &Grid,
        p: FlashParams,
        descales: &Descales,
    ) -> Result<()> {
        let ptr = |d: Option<&CudaSlice<f32>>| d.map_or(0, |d| device_ptr(d, s));
        let params =
            Fp8Params { p, q_descale: ptr(descales.q), k_descale: ptr(descales.k), v_descale: ptr(descales.v) };
        // SAFETY: matches `flash_fwd_e4m3_<out dtype>_d<D>[_causal](const Fp8Params p)` in
        // kernels/flash_fwd_e4m3.cu. As launch_portable's, with q/k/v strides halved (tensor::validate
        // proved them multiples of 16 elements); each descale given holds batch × kv_heads floats
        // (validate::descales), which the kernel indexes by (batch, kv head).
        unsafe { s.launch_builder(&c.kern.func).arg(&params).launch(grid.cfg) }
            .cuda(format!("launching {}", c.name))?;
        Ok(())
    }

    /// e4m3 `v` ([B, Hkv, Sk, D]) transposed into new scratch for the Hopper
    /// kernel's e4m3 entries, enqueued on `s`: [B, Hkv, D, keys] contiguous,
    /// keys = Sk rounded up to 16, each 16 keys in P's order (`transpose_v_e4m3`).
    fn transpose_v(&self, s: &Arc<CudaStream>, v: &Tensor) -> Result<TransposedV> {
        let name = "transpose_v_e4m3";
        let kern = self.kernel(name)?;
        let [batch, heads, rows, head_dim] = v.desc.dims;
        let keys = rows.next_multiple_of(16);
        let bytes = batch * heads * head_dim * keys;
        // SAFETY: every byte is written by the launch below before the forward reads it (a
        // block per 128 keys × 64 columns of each (batch, head), zeros past Sk); stream-ordered
        // on `s`, freed there after the forward.
        let vt = unsafe { self.scratch.alloc::<u8>(s, bytes.max(16)) }.cuda("allocating V transposed")?;
        // Keys are below 2^31 and batch × kv heads at most MAX_BATCH_HEADS (tensor::validate).
        let grid_dim = (keys.div_ceil(128) as u32, (head_dim / 64) as u32, (batch * heads) as u32);
        if bytes == 0 {
            return Ok(TransposedV { data: vt, keys, launched: false });
        }
        let params = TransposeParams {
            src: device_ptr(&v.data, s),
            dst: device_ptr(&vt, s),
            strides: strides(&v.desc),
            heads: heads as i32,
            rows: rows as i32,
            head_dim: head_dim as i32,
            keys: keys as i32,
        };
        let cfg = LaunchConfig { grid_dim, block_dim: (kern.launch.threads, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches `transpose_v_e4m3(const TransposeParams p)` in kernels/flash_fwd_e4m3.cu.
        // `v` was validated (rows inside its buffer and strides multiples of 16 bytes:
        // tensor::validate; its pointer 16-byte aligned: validate::aligned; D one of
        // E4M3_HEAD_DIMS, a multiple of 64); `vt` holds B·Hkv·D·keys bytes, which the grid
        // covers exactly (keys a multiple of 16; a block's runs of 16 keys past them return)
        // with the manifest's threads, which the kernel checks.
        unsafe { s.launch_builder(&kern.func).arg(&params).launch(cfg) }.cuda(format!("launching {name}"))?;
        Ok(TransposedV { data: vt, keys, launched: true })
    }

    /// A Hopper entry takes the portable entries' parameters with TMA maps of
    /// q, k, v and out (boxes of a warpgroup's 64 rows) and the schedule of its
    /// grid; an e4m3 one V transposed (`transpose_v`, launched first) and the
    /// descales.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_hopper(
        &self,
        s: &Arc<CudaStream>,
        c: &Chosen,
        grid: &Grid,
        [q, k, v, out]: [&Tensor; 4],
        p: &Problem,
        params: FlashParams,
        causal: bool,
        descales: &Descales,
    ) -> Result<()> {
        let kern = c.kern;
        // The 128-row causal entries read a schedule (the kernel's kScheduled); the
        // 64-row one always runs the pairs.
        let scheduled = kern.launch.persistent && causal && kern.launch.block_m >= 128;
        let (order, order_stride) =
            if scheduled { self.causal_order(kern, p, &c.plan, grid.cfg.grid_dim.0)? } else { (0, 0) };
        let map = |t: &Tensor, rows: u32| tensor_map(device_ptr(&t.data, s), t.dtype, &t.desc, rows);
        let transposed = if v.dtype == Dtype::E4m3 { Some(self.transpose_v(s, v)?) } else { None };
        let v_map = match &transposed {
            Some(vt) => transposed_map(device_ptr(&vt.data, s), &v.desc, vt.keys, kern.launch.block_n)?,
            None => map(v, kern.launch.block_n)?,
        };
        let hparams = HopperParams {
            q_map: map(q, kern.launch.block_m)?,
            k_map: map(k, kern.launch.block_n)?,
            v_map,
            o_map: map(out, 64)?,
            p: params,
            sched: HopperSched {
                units: grid.units as i32,
                per_head: FastDiv::new(grid.per_head),
                bh: FastDiv::new((p.batch * p.heads) as u32),
                heads: FastDiv::new(p.heads as u32),
                group: FastDiv::new((p.heads / p.kv_heads) as u32),
                blocks: FastDiv::new(grid.m_blocks),
                order,
                order_stride,
                whole_units: grid.whole_units as i32,
            },
        };
        if transposed.is_none() {
            // SAFETY: matches `flash_fwd_hopper_<dtype>_d<D>[_causal][_m64](const __grid_constant__
            // HopperParams p)` in kernels/flash_fwd_hopper_<dtype>.cu. The tensor maps describe
            // exactly the validated q/k/v/out extents (TMA zero-fills and never reads past them,
            // and clips its stores of out to them); `sched` describes this grid (units checked
            // < 2^31 by Grid::new; a causal schedule holds grid × order_stride block indices below
            // m_blocks × B·H × splits, and stays in `causal_orders` while launches that read it
            // may run); the rest as for the portable kernel (launch_portable).
            unsafe { s.launch_builder(&kern.func).arg(&hparams).launch(grid.cfg) }
                .cuda(format!("launching {}", c.name))?;
            return Ok(());
        }
        let ptr = |d: Option<&CudaSlice<f32>>| d.map_or(0, |d| device_ptr(d, s));
        let fparams = HopperFp8Params {
            hp: hparams,
            q_descale: ptr(descales.q),
            k_descale: ptr(descales.k),
            v_descale: ptr(descales.v),
        };
        // Behind the transpose, as its programmatic dependent: the CTAs start while it runs,
        // their Q and K loads with them, and the first V load waits for its grid (the
        // producer's griddepcontrol.wait). Not behind any other launch, whose inputs the early
        // loads might read before they are written.
        let dependent = transposed.as_ref().is_some_and(|vt| vt.launched);
        // SAFETY: matches `flash_fwd_hopper_e4m3_<out dtype>_d<D>[_causal][_m192](const __grid_constant__
        // HopperFp8Params p)` in kernels/flash_fwd_hopper_e4m3.cu. As the 16-bit launch above, with
        // v_map over V transposed, which `transpose_v` wrote before on this stream (as its
        // dependent, read only after waiting for that grid) and which outlives the launch (freed
        // in stream order); each descale given holds batch × kv_heads floats
        // (validate::descales), indexed by (batch, kv head).
        unsafe { self.launch_one(s, &kern.func, grid.cfg, &fparams, dependent, &c.name) }
    }

    /// Launches `func`, whose one parameter is `param`, on `s` with `cfg`;
    /// `dependent`, where the arch has it (`dependent_launch`), as the
    /// programmatic dependent of the launch before it on `s`: its CTAs may
    /// start while that grid drains, and wait for it where the kernel says
    /// (griddepcontrol.wait).
    ///
    /// # Safety
    /// `param` is `func`'s one parameter, and the launch is sound for `func`
    /// with `cfg` (the caller's SAFETY comment says why), reading what the
    /// launch before writes only after waiting for it where `dependent`.
    unsafe fn launch_one<P>(
        &self,
        s: &CudaStream,
        func: &CudaFunction,
        cfg: LaunchConfig,
        param: &P,
        dependent: bool,
        name: &str,
    ) -> Result<()> {
        let mut attr = cu::CUlaunchAttribute {
            id: cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: cu::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        let config = cu::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: s.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(dependent && self.dependent_launch),
        };
        let mut args = [(&raw const *param).cast_mut().cast::<std::ffi::c_void>()];
        self.ctx.bind_to_thread().cuda("binding the context")?;
        // SAFETY: the caller's; `args` points at `param`, which the driver copies before
        // returning, and `attr` outlives the call.
        unsafe { cu::cuLaunchKernelEx(&config, func.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .cuda(format!("launching {name}"))
    }

    /// Merges the splits' partials into `out` and `lse` (its device address, 0 for none).
    /// `packed`: (cu_seqlens_q's address, sequences, max_seqlen_q) of packed queries,
    /// whose `_varlen` combine merges only the rows some sequence covers.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_combine(
        &self,
        s: &CudaStream,
        dtype: Dtype,
        p: &Problem,
        splits: u32,
        partials: &Partials,
        out: &Tensor,
        lse: u64,
        packed: Option<(u64, i32, i32)>,
    ) -> Result<()> {
        let kind = if packed.is_some() { "combine_varlen" } else { "combine" };
        let cname = format!("flash_{kind}_{}_d{}", dtype.name(), p.head_dim);
        let (cu_seqlens_q, seqs, max_seqlen_q) = packed.unwrap_or_default();
        let comb = self.kernel(&cname)?;
        let rows_per_block = comb.launch.threads / 32;
        let cparams = CombineParams {
            o_partial: device_ptr(&partials.o, s),
            lse_partial: device_ptr(&partials.lse, s),
            o: device_ptr(&out.data, s),
            lse,
            o_strides: strides(&out.desc),
            batch: p.batch as i32,
            heads: p.heads as i32,
            seqlen_q: p.seqlen_q as i32,
            num_splits: splits as i32,
            cu_seqlens_q,
            seqs,
            max_seqlen_q,
        };
        // Where the combine waits for the forward grid (griddepcontrol.wait, sm_90 on), it is
        // launched as its programmatic dependent: its CTAs may start while the forward drains.
        let cfg = LaunchConfig {
            grid_dim: ((p.rows() as u32).div_ceil(rows_per_block), 1, 1),
            block_dim: (comb.launch.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `flash_combine_<dtype>_d<D>(const CombineParams p)`. It reads
        // splits·rows(·D) partials the forward launch wrote before it on the stream (as a
        // dependent launch, after waiting for that grid) and writes `out` rows validated as for
        // that launch; packed, only rows some sequence covers (cu_seqlens_q holds seqs + 1
        // offsets, each clamped to the rows), which that launch wrote.
        unsafe { self.launch_one(s, &comb.func, cfg, &cparams, true, &cname) }
    }

    /// The device address and row length of a persistent causal launch's schedule
    /// (`planner::causal_order`; (0, 0): the kernel's own pairs), computed and
    /// uploaded once per launch geometry.
    fn causal_order(&self, kern: &Kernel, p: &Problem, plan: &Plan, grid: u32) -> Result<(u64, i32)> {
        let lg = Self::launch_grid(kern, p, true);
        let per = plan.keys_per_split / kern.launch.block_n.max(1);
        // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
        let mut orders = self.causal_orders.lock().unwrap_or_else(|e| e.into_inner());
        let schedule = match orders.entry((lg, per, grid)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(match planner::causal_order(&lg, per, grid) {
                Some((stride, table)) => {
                    let table = self.stream.clone_htod(&table).cuda("copying a causal schedule to the device")?;
                    // Launches may run on other streams (`forward_on`): the copy is done before any reads it.
                    self.stream.synchronize().cuda("copying a causal schedule to the device")?;
                    Some((stride, table))
                }
                None => None,
            }),
        };
        Ok(schedule.as_ref().map_or((0, 0), |(stride, table)| (device_ptr(table, &self.stream), *stride as i32)))
    }
}

/// A TMA map of a [B, H, S, D] tensor at `ptr`: 4-D innermost first (d, seq, head,
/// batch), boxes of one swizzle panel × `rows` rows, as the kernel's tiles and
/// wgmma descriptors lay them out (`HopperConfig::kPanelCols`): 128 bytes with
/// the 128-byte swizzle where a row is a multiple of 128 bytes, else 64 with
/// the 64-byte one. A zero-length sequence is described as one row; the kernel
/// issues no load or store for it.
pub(super) fn tensor_map(ptr: u64, dtype: Dtype, desc: &Desc, rows: u32) -> Result<TmaDesc> {
    let [b, h, seq, d] = desc.dims.map(|x| x as u64);
    let [sb, sh, ss] = desc.strides.map(|x| (x * dtype.bytes()) as u64);
    let panel = if (d * dtype.bytes() as u64).is_multiple_of(128) { 128 } else { 64 };
    encode_map(ptr, dtype, [d, seq.max(1), h, b], [ss, sh, sb], [panel / dtype.bytes() as u32, rows])
}

/// V transposed for the Hopper kernel's e4m3 entries (`Attention::transpose_v`):
/// its scratch, its keys (Sk rounded up to 16), and whether a launch wrote it
/// (none where it is empty).
struct TransposedV {
    data: CudaSlice<u8>,
    keys: usize,
    launched: bool,
}

/// A TMA map of V transposed (`transpose_v`: [B, Hkv, D, keys] contiguous bytes,
/// `v` V's descriptor) for the Hopper kernel's e4m3 entries: 4-D (key, d, head,
/// batch), boxes of the entry's key tile (`block_n` bytes, one swizzle panel:
/// `HopperConfig::kVPanelBytes`) × D.
fn transposed_map(ptr: u64, v: &Desc, keys: usize, block_n: u32) -> Result<TmaDesc> {
    let [b, h, _, d] = v.dims.map(|x| x as u64);
    let keys = keys.max(16) as u64; // no keys (Sk = 0): a map the kernel never loads from
    encode_map(ptr, Dtype::E4m3, [keys, d, h, b], [keys, keys * d, keys * d * h], [block_n, d as u32])
}

/// cuTensorMapEncodeTiled of a 4-D tensor (dims innermost first, byte strides of
/// the outer three) in boxes of `[inner, rows]` × 1 × 1, swizzled by the box's
/// inner bytes (128 or 64).
fn encode_map(ptr: u64, dtype: Dtype, dims: [u64; 4], strides: [u64; 3], [inner, rows]: [u32; 2]) -> Result<TmaDesc> {
    let swizzle = if inner as usize * dtype.bytes() == 128 {
        CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
    } else {
        CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B
    };
    let boxes = [inner, rows, 1, 1];
    let element_strides = [1u32; 4];
    let data_type = match dtype {
        Dtype::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        Dtype::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        Dtype::E4m3 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    };
    let mut map = std::mem::MaybeUninit::<cu::CUtensorMap>::uninit();
    // SAFETY: the four-element arrays outlive the call, which only writes the 128-byte map
    // (CUtensorMap is 128-byte aligned, above the 64 bytes the driver requires).
    let res = unsafe {
        cu::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            4,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    res.result().cuda(format!("encoding a TMA map of dims {dims:?} with byte strides {strides:?}"))?;
    // SAFETY: written by the successful call above.
    Ok(TmaDesc(unsafe { map.assume_init() }.opaque))
}
