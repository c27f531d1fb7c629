//! The CUDA side: loads the fatbins `cargo xtask build` wrote, validates every
//! launch, and launches. Never spawns processes.
//!
//! - `options`: what a call asks for (`Options`, `KernelChoice`, `Variant`) and
//!   the `Family` a variant resolves to.
//! - `load`: the context, the device's description and the loaded entries.
//! - `memory`: device tensors and host copies.
//! - `choose`: which entry runs a call, and its split plan.
//! - `validate`: a forward call's checks, before anything is launched.
//! - `launch`: the forward and combine launches.
//! - `scratch`: a call's temporaries, from a memory pool that keeps them.
//! - `foreign`: another library's buffers and streams, borrowed for a call.
//! - `varlen`: serving calls (`forward_varlen`): packed, dense or paged sequences.
//! - `gpu_reference`: the fp32 GPU reference.

mod choose;
mod foreign;
mod gpu_reference;
mod launch;
mod load;
mod memory;
mod options;
mod scratch;
mod validate;
mod varlen;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext as Ctx, CudaFunction, CudaModule, CudaSlice, CudaStream};

pub use foreign::Borrowed;
use launch::Grid;
pub use launch::Launched;
pub use load::{default_kernel_dir, uuid_string};
pub use memory::Tensor;
use memory::device_ptr;
pub use options::{Family, KernelChoice, Options, Precision, Splits, Variant};
pub use varlen::{BlockTable, Sequences};

use crate::error::{CudaContext, Error, Result};
use crate::manifest::Launch;
use crate::planner::{LaunchGrid, Plan};
use crate::schema::DeviceInfo;
use crate::scores::{Band, Scores};
use crate::tensor::Dtype;

/// A loaded entry: its function, launch geometry and residency.
struct Kernel {
    func: CudaFunction,
    dynamic_smem: u32,
    launch: Launch,
    /// Resident CTAs per SM at this launch geometry (the occupancy calculator, once).
    ctas_per_sm: u32,
}

/// The forward entry chosen for a call, and its split plan.
struct Chosen<'a> {
    name: String,
    kern: &'a Kernel,
    plan: Plan,
    /// The mask and modifier the entry compiles in, and their values.
    scores: Scores,
}

/// The dequantisation factors of a call's e4m3 inputs, each fp32 [B, Hkv]
/// contiguous, positive (the portable e4m3 entries fold q's and k's into the
/// softmax scale, whose row max assumes a positive one), or `None` for 1
/// ([`Attention::forward_descaled_on`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Descales<'a> {
    /// q's, by (batch, the K/V head its query head reads).
    pub q: Option<&'a CudaSlice<f32>>,
    /// k's.
    pub k: Option<&'a CudaSlice<f32>>,
    /// v's.
    pub v: Option<&'a CudaSlice<f32>>,
}

/// A persistent causal launch's schedule on the device: (row length, the rows).
type CausalOrder = (u32, CudaSlice<u32>);

/// The FlashAttention forward kernels loaded on one GPU: a CUDA context, one
/// stream, and every entry of the kernel set built for the device's arch.
///
/// Made by [`Attention::new`] (kernel set found by the library's rule) or
/// [`Attention::with_kernel_dir`] (kernel set named). Copies
/// ([`upload`](Attention::upload), [`download`](Attention::download)) and
/// launches ([`forward`](Attention::forward)) all run in order on
/// [`stream`](Attention::stream); a download waits for what came before it.
/// Device memory is freed when the [`Tensor`]s and slices holding it drop.
///
/// ```no_run
/// use kernel_ffi::{Attention, Desc, Dtype, Gpu, Layout, Options};
///
/// let att = Attention::new(&Gpu::default())?;
/// let desc = Desc::new([1, 8, 256, 64], Layout::Bhsd); // [batch, heads, seq, head_dim]
/// let host = vec![Dtype::F16.from_f32(0.5); desc.span()];
/// let (q, k, v) = (
///     att.upload(Dtype::F16, desc, &host)?,
///     att.upload(Dtype::F16, desc, &host)?,
///     att.upload(Dtype::F16, desc, &host)?,
/// );
/// let mut out = att.alloc_poisoned(Dtype::F16, desc)?;
/// let launched = att.forward(&q, &k, &v, &mut out, None, &Options::default())?;
/// let bits = att.download(&out)?; // waits for the launch
/// let first = Dtype::F16.to_f32(bits[0]);
/// println!("{} kernel, {} split(s): out[0] = {first}", launched.family.name(), launched.num_splits);
/// # Ok::<(), kernel_ffi::Error>(())
/// ```
pub struct Attention {
    /// Calls' temporaries (attention::scratch).
    scratch: scratch::Scratch,
    ctx: Arc<Ctx>,
    stream: Arc<CudaStream>,
    device: DeviceInfo,
    kernels: HashMap<String, Kernel>,
    /// The Hopper kernel was loaded (an sm_90 device with sm_90a fatbins).
    hopper: bool,
    /// The loaded combine entries wait for the forward grid (sm_90+), so they
    /// are launched as its programmatic dependents, while it drains.
    dependent_launch: bool,
    /// Simulated split plans already made (`planner::plan_simulated`: up to a
    /// few hundred µs of CPU), one per launch geometry.
    sim_plans: Mutex<HashMap<(LaunchGrid, Family), Plan>>,
    /// Persistent causal launches' schedules on the device (planner::causal_order),
    /// by (grid, tiles per split, CTAs); kept because they are read by launches in flight.
    causal_orders: Mutex<HashMap<(LaunchGrid, u32, u32), Option<CausalOrder>>>,
    _modules: Vec<Arc<CudaModule>>,
}

impl Attention {
    /// The device: name, compute capability, SM count, driver version and UUID.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The CUDA context, for work of the caller's own on the same GPU (cudarc's
    /// [`CudaContext`](crate::CudaContext)).
    pub fn context(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The stream every copy and launch of this `Attention` is enqueued on.
    /// Work of the caller's own on this stream runs in order with them, with no
    /// further synchronisation; on another stream it needs an event or a
    /// [`synchronize`](Attention::synchronize).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The bytes of device memory this `Attention` keeps for calls'
    /// temporaries (split partials, e4m3 inputs dequantised or V transposed):
    /// at least the most its calls have needed at once, held until it is
    /// dropped or [`trim_scratch`](Attention::trim_scratch). An error, saying
    /// why, where it has no such pool (the device has no memory pools, or the
    /// driver refused one): its calls then allocate and free their temporaries
    /// each time. Under a CUDA graph capture they are the graph's allocations.
    pub fn scratch_bytes(&self) -> Result<u64> {
        self.scratch.reserved()
    }

    /// Gives the memory kept for calls' temporaries and not in use back to the
    /// driver; the next call that needs some maps it again.
    pub fn trim_scratch(&self) -> Result<()> {
        self.scratch.trim()
    }

    /// Whether the Hopper kernel was loaded (an sm_90 device with sm_90a fatbins).
    pub fn has_hopper(&self) -> bool {
        self.hopper
    }

    /// Waits for everything enqueued on the stream. A kernel that failed
    /// reports its error here (or at the next call that waits).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().cuda("waiting for the stream (a kernel failed)")
    }

    fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.kernels
            .get(name)
            .ok_or_else(|| Error::MissingKernels(format!("entry {name} is not in the loaded fatbins")))
    }

    /// out = softmax(q·kᵀ·scale [+ causal mask]) · v, and optionally the per-row
    /// log-sum-exp into `lse` ([B, H, Sq] fp32). Enqueued on the stream; errors in
    /// the kernel surface at the next synchronising call.
    ///
    /// q is [B, H, Sq, D], k and v [B, Hkv, Sk, D] with H a multiple of Hkv
    /// (GQA), out q's shape, all of one dtype (or e4m3 q, k and v with f16 or
    /// bf16 out: [`forward_descaled_on`](Attention::forward_descaled_on)); D one
    /// of [`HEAD_DIMS`](crate::tensor::HEAD_DIMS); any strides of 16-byte
    /// multiples (each tensor's [`Desc`](crate::Desc)). The
    /// causal mask is bottom-right aligned (query row i sees keys
    /// j ≤ i + Sk − Sq, PyTorch's `causal_lower_right`); a row that sees no key
    /// gets zeros and an LSE of −∞. Every rule is checked before anything is
    /// allocated or launched ([`Error::Invalid`] names the value and the rule).
    /// [`Options`] picks the mask, scale, splits and (optionally) the entry;
    /// the returned [`Launched`] says what ran.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        opts: &Options,
    ) -> Result<Launched> {
        self.forward_on(&self.stream, q, k, v, out, lse, opts)
    }

    /// `forward` enqueued on `stream` (of this context; `borrow_stream` wraps
    /// another library's) instead of the `Attention`'s own: split scratch is
    /// allocated and freed in that stream's order, nothing synchronises. A first
    /// persistent causal launch of a geometry uploads its schedule and waits for
    /// that copy, so capture a graph after a warm-up call.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        opts: &Options,
    ) -> Result<Launched> {
        self.forward_descaled_on(stream, q, k, v, Descales::default(), out, lse, opts)
    }

    /// `forward_on` with e4m3 inputs' dequantisation factors (FA3's
    /// `q_descale`, `k_descale`, `v_descale`: the scores are
    /// q_descale · k_descale · q·kᵀ, the output v_descale · softmax · v). Each is
    /// fp32 [B, Hkv], contiguous, or `None` for 1; other dtypes take none.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_descaled_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        descales: Descales,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        opts: &Options,
    ) -> Result<Launched> {
        let p = validate::forward(q, k, v, out, lse.as_deref(), opts.scale)?;
        validate::descales(&descales, q.dtype, &p)?;
        let precision = Precision { input: q.dtype, output: out.dtype };
        let family = self.resolve(&p, opts.choice.variant)?;
        if p.rows() == 0 {
            return Ok(Launched { family, ..Launched::default() }); // empty result: nothing to launch
        }
        let precision = self.entry_precision(family, precision, p.head_dim, opts.scores(p.seqlen_q, p.seqlen_k)?);
        if precision.input != q.dtype {
            return self.forward_dequantised(stream, family, [q, k, v], descales, out, lse, opts, &p);
        }
        let chosen = self.choose_entry(family, precision, &p, opts)?;
        // Every rule is checked before the first allocation or launch.
        let s = stream;
        validate::aligned([("q", q), ("k", k), ("v", v), ("out", out)], s)?;
        let causal = chosen.scores.band == Band::Causal;
        let grid = Grid::new(self.device.sm_count, &chosen, &p, causal)?;
        let partials = self.alloc_partials(s, &p, chosen.plan.num_splits)?;
        let lse = lse.map_or(0, |l| device_ptr(l, s));
        let params = Self::flash_params(s, [q, k, v, out], lse, partials.as_ref(), &p, &chosen.plan, chosen.scores);
        match family {
            Family::Portable if q.dtype == Dtype::E4m3 => Self::launch_e4m3(s, &chosen, &grid, params, &descales)?,
            Family::Portable => Self::launch_portable(s, &chosen, &grid, &params)?,
            Family::Hopper => self.launch_hopper(s, &chosen, &grid, [q, k, v, out], &p, params, causal, &descales)?,
        }
        if let Some(partials) = &partials {
            self.launch_combine(s, out.dtype, &p, chosen.plan.num_splits, partials, out, lse, None)?;
        }
        let geometry = chosen.kern.launch;
        Ok(Launched {
            kernel: chosen.name,
            num_splits: chosen.plan.num_splits,
            ctas: grid.ctas(),
            family,
            block_m: geometry.block_m,
            key_groups: geometry.key_groups,
            persistent: geometry.persistent,
            dequantised: false,
        })
    }

    /// e4m3 inputs where no e4m3 entry runs the call (windows and softcap; the
    /// Hopper kernel at head dim 64): each is dequantised (times its descale) into 16-bit
    /// scratch of out's dtype, which the 16-bit call on `family` then runs on
    /// (it resolves as this call did). Its entry and every rule are checked first.
    #[allow(clippy::too_many_arguments)]
    fn forward_dequantised(
        &self,
        s: &Arc<CudaStream>,
        family: Family,
        [q, k, v]: [&Tensor; 3],
        descales: Descales,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        opts: &Options,
        p: &crate::tensor::Problem,
    ) -> Result<Launched> {
        let chosen = self.choose_entry(family, Precision::from(out.dtype), p, opts)?;
        Grid::new(self.device.sm_count, &chosen, p, chosen.scores.band == Band::Causal)?;
        validate::aligned([("q", q), ("k", k), ("v", v), ("out", out)], s)?;
        let group = p.heads / p.kv_heads;
        let q = self.dequantise(s, q, descales.q, p.kv_heads, group, out.dtype)?;
        let k = self.dequantise(s, k, descales.k, p.kv_heads, 1, out.dtype)?;
        let v = self.dequantise(s, v, descales.v, p.kv_heads, 1, out.dtype)?;
        let launched = self.forward_descaled_on(s, &q, &k, &v, Descales::default(), out, lse, opts)?;
        Ok(Launched { dequantised: true, ..launched })
    }
}
