//! The CUDA side: loads the fatbins `cargo xtask build` wrote, validates every
//! launch, and launches. Never spawns processes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{
    self as cu, CUdevice_attribute, CUfunction_attribute, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{
    CudaContext as Ctx, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::device::Gpu;
use crate::error::{CudaContext, Error, Result, invalid};
use crate::manifest::{Launch, Manifest, is_hopper_entry};
use crate::params::{CombineParams, FastDiv, FlashParams, HopperParams, HopperSched, ReferenceParams, TmaDesc};
use crate::planner::{self, Plan};
use crate::schema::{DeviceInfo, EntryRecord};
use crate::tensor::{self, Arg, Desc, Dtype, Problem};

/// A device tensor of 16-bit elements (f16 or bf16 bits).
pub struct Tensor {
    pub data: CudaSlice<u16>,
    pub dtype: Dtype,
    pub desc: Desc,
}

impl Tensor {
    fn arg<'a>(&self, name: &'a str) -> Arg<'a> {
        Arg { name, dtype: self.dtype, desc: self.desc, len: self.data.len() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Splits {
    /// Let the planner choose from SM count, shape and occupancy.
    Auto,
    /// Exactly this many (clamped so no split is empty).
    Fixed(u32),
}

impl std::str::FromStr for Splits {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Splits, String> {
        match s {
            "auto" => Ok(Splits::Auto),
            n => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Splits::Fixed(n)),
                _ => Err(format!("`{s}` is not a split count; use auto or a number ≥ 1")),
            },
        }
    }
}

/// `auto` or the count, as `FromStr` reads it.
impl std::fmt::Display for Splits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Splits::Auto => f.write_str("auto"),
            Splits::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Which forward kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The Hopper kernel where it is loaded (sm_90a), else the portable one.
    #[default]
    Auto,
    /// The sm_80+ mma.sync kernel.
    Portable,
    /// The sm_90a wgmma/TMA kernel; an error on other devices.
    Hopper,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Auto, Variant::Portable, Variant::Hopper];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Auto => "auto",
            Variant::Portable => "portable",
            Variant::Hopper => "hopper",
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Variant, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown kernel variant `{s}`: expected auto, portable or hopper"))
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub causal: bool,
    /// Defaults to 1/sqrt(head_dim).
    pub scale: Option<f32>,
    pub splits: Splits,
    pub entry: Entry,
}

/// Which compiled entry runs a call; `Variant::Auto` and every `None` leave that
/// choice to the planner. The binaries take these fields as flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct Entry {
    /// Kernel: auto (Hopper where loaded), portable or hopper.
    #[arg(long, default_value = "auto")]
    pub variant: Variant,
    /// Query rows per CTA (64 or 128) where the kernel has both; default: the planner's choice.
    ///
    /// Both: an `_m64` entry beside the 128-row one; the planner's rule is `planner::prefer_m64`.
    #[arg(long)]
    pub block_m: Option<u32>,
    /// Key groups per CTA (1, or 2 where a `_kg2` entry is loaded); default: the planner's choice.
    ///
    /// The planner's rule is `planner::prefer_key_groups`.
    #[arg(long)]
    pub key_groups: Option<u32>,
    /// Persistent CTAs (true/false) where the entry has a persistent twin; default: the planner's choice.
    ///
    /// Some entries are persistent only; one (Hopper non-causal D=64) has a persistent
    /// twin (`…_persistent`), chosen by `planner::prefer_persistent`.
    #[arg(long)]
    pub persistent: Option<bool>,
}

/// What a forward call launched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Launched {
    pub num_splits: u32,
    /// CTAs of the attention kernel (0 when nothing was launched).
    pub ctas: u64,
    /// The kernel that ran (never `Auto`).
    pub variant: Variant,
    /// Its query rows per CTA (0 when nothing was launched).
    pub block_m: u32,
    /// Its key groups per CTA (0 when nothing was launched).
    pub key_groups: u32,
    /// Whether its CTAs were persistent.
    pub persistent: bool,
}

impl Launched {
    /// The entry as the reports record it.
    pub fn entry_record(&self) -> EntryRecord {
        EntryRecord {
            variant: self.variant.name().into(),
            block_m: self.block_m,
            key_groups: self.key_groups,
            persistent: self.persistent,
        }
    }
}

struct Kernel {
    func: CudaFunction,
    dynamic_smem: u32,
    launch: Launch,
    /// Resident CTAs per SM at this launch geometry (the occupancy calculator, once).
    ctas_per_sm: u32,
}

pub struct Attention {
    ctx: Arc<Ctx>,
    stream: Arc<CudaStream>,
    device: DeviceInfo,
    kernels: HashMap<String, Kernel>,
    /// The Hopper kernel was loaded (an sm_90 device with sm_90a fatbins).
    hopper: bool,
    /// Simulated split plans already made (`planner::plan_simulated`: up to a
    /// few hundred µs of CPU), one per launch geometry.
    sim_plans: Mutex<HashMap<(planner::LaunchGrid, Variant), Plan>>,
    /// Persistent causal launches' schedules on the device (planner::causal_order),
    /// by (grid, tiles per split, CTAs); kept because they are read by launches in flight.
    causal_orders: Mutex<HashMap<(planner::LaunchGrid, u32, u32), Option<CausalOrder>>>,
    _modules: Vec<Arc<CudaModule>>,
}

/// The kernel folder `kernel_dir::find` picks (`FA_KERNEL_DIR`, the checkout's
/// `target/kernels`, beside the executable), else the first place it looked.
pub fn default_kernel_dir() -> PathBuf {
    crate::kernel_dir::find().unwrap_or_else(|e| e.fallback())
}

impl Attention {
    pub fn new(gpu: &Gpu) -> Result<Attention> {
        Attention::with_kernel_dir(gpu, &default_kernel_dir())
    }

    pub fn with_kernel_dir(gpu: &Gpu, dir: &Path) -> Result<Attention> {
        let manifest_path = dir.join("manifest.json");
        if !manifest_path.is_file() {
            return Err(Error::MissingKernels(format!(
                "{} does not exist; run `cargo xtask build` (or set FA_KERNEL_DIR to its target/kernels)",
                manifest_path.display()
            )));
        }
        let manifest = Manifest::load(&manifest_path).map_err(|e| Error::MissingKernels(format!("{e:#}")))?;
        // SAFETY: only tries to open the driver library; cudarc would panic on first use otherwise.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Unsupported(
                "no NVIDIA driver here (libcuda.so cannot be loaded); run on a machine with a GPU".into(),
            ));
        }
        let ordinal = gpu.ordinal()?;
        let ctx = Ctx::new(ordinal).cuda(format!("creating a context on GPU {gpu}"))?;
        // One stream, launches in order: per-buffer event tracking is pure overhead.
        // SAFETY: every buffer is used on `stream` only, so stream order is the only order needed.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().cuda("reading the compute capability")?;
        let device = DeviceInfo {
            name: ctx.name().cuda("reading the device name")?,
            compute_capability: format!("{major}.{minor}"),
            sm_count: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .cuda("reading the SM count")? as u32,
            driver: driver_version(),
            uuid: ctx.uuid().ok().map(|u| uuid_string(&u.bytes)),
        };
        let arch = manifest.pick_arch(major, minor).ok_or_else(|| {
            Error::Unsupported(format!(
                "{} is sm_{major}{minor}; the manifest builds for {}; add a matching arch to kernels/manifest.json",
                device.name,
                manifest.archs.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        // A created stream, not the legacy default one, so that it can be captured into graphs.
        let stream = ctx.new_stream().cuda("creating a stream")?;
        let mut kernels = HashMap::new();
        let mut modules = Vec::new();
        for src in manifest.sources.iter().filter(|s| s.archs.contains(&arch)) {
            let stem = Path::new(&src.file).file_stem().and_then(|s| s.to_str()).unwrap_or(&src.file);
            let path = dir.join(format!("{stem}.{arch}.fatbin"));
            let image = std::fs::read(&path)
                .map_err(|e| Error::MissingKernels(format!("{}: {e}; run `cargo xtask build`", path.display())))?;
            let module = ctx.load_module(Ptx::from_binary(image)).cuda(format!("loading {}", path.display()))?;
            for k in &src.kernels {
                let func = module.load_function(&k.entry).cuda(format!("finding {} in {}", k.entry, path.display()))?;
                // Opt in whenever dynamic shared memory is used: static + dynamic may pass
                // 48 KB even when the dynamic part alone does not.
                if k.dynamic_smem > 0 {
                    func.set_attribute(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        k.dynamic_smem as i32,
                    )
                    .cuda(format!("raising {}'s shared memory to {} bytes", k.entry, k.dynamic_smem))?;
                }
                let launch = k.launch.ok_or_else(|| {
                    Error::MissingKernels(format!("{} has no \"launch\" geometry in the manifest", k.entry))
                })?;
                let ctas_per_sm = func
                    .occupancy_max_active_blocks_per_multiprocessor(launch.threads, k.dynamic_smem as usize, None)
                    .cuda(format!("querying {}'s occupancy", k.entry))?;
                kernels.insert(k.entry.clone(), Kernel { func, dynamic_smem: k.dynamic_smem, launch, ctas_per_sm });
            }
            modules.push(module);
        }
        let hopper = kernels.keys().any(|k| is_hopper_entry(k));
        Ok(Attention {
            ctx,
            stream,
            device,
            kernels,
            hopper,
            sim_plans: Mutex::default(),
            causal_orders: Mutex::default(),
            _modules: modules,
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    pub fn context(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.kernels
            .get(name)
            .ok_or_else(|| Error::MissingKernels(format!("entry {name} is not in the loaded fatbins")))
    }

    /// Copies host bits to a new device tensor.
    pub fn upload(&self, dtype: Dtype, desc: Desc, bits: &[u16]) -> Result<Tensor> {
        if bits.len() < desc.span() {
            invalid!(
                "host data has {} elements; dims {:?} with strides {:?} need {}",
                bits.len(),
                desc.dims,
                desc.strides,
                desc.span()
            );
        }
        let data = self.stream.clone_htod(bits).cuda("copying a tensor to the device")?;
        Ok(Tensor { data, dtype, desc })
    }

    /// A new device tensor filled with NaN (outputs start poisoned).
    pub fn alloc_poisoned(&self, dtype: Dtype, desc: Desc) -> Result<Tensor> {
        self.upload(dtype, desc, &vec![dtype.nan(); desc.span()])
    }

    /// A new LSE buffer for `rows` rows, filled with NaN (at least one element, so
    /// that an empty problem still has a valid allocation).
    pub fn alloc_lse(&self, rows: usize) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(&vec![f32::NAN; rows.max(1)]).cuda("allocating the LSE buffer")
    }

    /// The first `rows` values of an LSE buffer.
    pub fn download_lse(&self, lse: &CudaSlice<f32>, rows: usize) -> Result<Vec<f32>> {
        let mut all = self.stream.clone_dtoh(lse).cuda("copying the LSE to the host")?;
        all.truncate(rows);
        Ok(all)
    }

    pub fn download(&self, t: &Tensor) -> Result<Vec<u16>> {
        self.stream.clone_dtoh(&t.data).cuda("copying a tensor to the host")
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().cuda("waiting for the stream (a kernel failed)")
    }

    /// The loaded forward entries of a kernel for (dtype, head dim, causal), one-group
    /// entries first (64 rows, 128 rows, then the two-group `_kg2`), and their
    /// common name stem.
    fn fwd_entries(
        &self,
        variant: Variant,
        dtype: Dtype,
        head_dim: usize,
        causal: bool,
    ) -> (String, Vec<(String, &Kernel)>) {
        let family = if variant == Variant::Hopper { "flash_fwd_hopper" } else { "flash_fwd" };
        let base = format!("{family}_{}_d{head_dim}{}", dtype.name(), if causal { "_causal" } else { "" });
        let loaded = [format!("{base}_m64"), base.clone(), format!("{base}_kg2")]
            .into_iter()
            .filter_map(|name| self.kernels.get(&name).map(|k| (name, k)))
            .collect();
        (base, loaded)
    }

    /// (query rows per CTA, key groups, persistent) of the loaded entries for
    /// (dtype, head dim, causal) and their persistent twins: what
    /// `Entry::block_m`, `Entry::key_groups` and `Entry::persistent` may name.
    pub fn geometries(&self, variant: Variant, dtype: Dtype, head_dim: usize, causal: bool) -> Vec<(u32, u32, bool)> {
        let entries = self.fwd_entries(variant, dtype, head_dim, causal).1;
        let mut out = Vec::new();
        for (name, k) in entries {
            out.push((k.launch.block_m, k.launch.key_groups, k.launch.persistent));
            if let Some(twin) = self.persistent_twin(&name) {
                out.push((twin.launch.block_m, twin.launch.key_groups, true));
            }
        }
        out
    }

    /// The persistent twin of a non-persistent entry, where loaded.
    fn persistent_twin(&self, name: &str) -> Option<&Kernel> {
        self.kernels.get(&format!("{name}_persistent")).filter(|k| k.launch.persistent)
    }

    /// Query blocks × batch × heads: the grid of an unsplit launch of `k`.
    fn work_ctas(k: &Kernel, p: &Problem) -> u64 {
        (p.batch * p.heads) as u64 * (p.seqlen_q as u64).div_ceil(u64::from(k.launch.block_m))
    }

    /// The forward entry for this problem and its name: `flash_fwd[_hopper]_<dtype>_d<D>[_causal]`
    /// or the same with `_m64` (64-row CTAs) or `_kg2` (64-row CTAs of two key
    /// groups), whichever is loaded. Rows per CTA: `block_m`, or else
    /// `planner::prefer_m64` between the one-group entries (Hopper causal D=64:
    /// `planner::prefer_wide_causal_d64`); then key groups:
    /// `key_groups`, or else `planner::prefer_key_groups` from the one-group entry's plan.
    /// Returns the entry's split plan too (the twin's, where that was already made).
    fn fwd_kernel(
        &self,
        variant: Variant,
        dtype: Dtype,
        p: &Problem,
        opts: &Options,
    ) -> Result<(String, &Kernel, Plan)> {
        let causal = opts.causal;
        let (base, loaded) = self.fwd_entries(variant, dtype, p.head_dim, causal);
        let single: Vec<&Kernel> = loaded.iter().map(|(_, k)| *k).filter(|k| k.launch.key_groups == 1).collect();
        let slots = |k: &Kernel| u64::from(self.device.sm_count) * u64::from(k.ctas_per_sm.max(1));
        let rows = opts.entry.block_m.or_else(|| match single.as_slice() {
            [narrow, wide] => {
                let r = |k: &Kernel| u64::from(k.launch.block_m);
                let ctas = Self::work_ctas(narrow, p);
                let m64 = if variant == Variant::Hopper && causal && p.head_dim == 64 {
                    !planner::prefer_wide_causal_d64(Self::work_ctas(wide, p), slots(wide), p.seqlen_k)
                } else {
                    planner::prefer_m64(causal, ctas, slots(narrow), r(narrow), slots(wide), r(wide))
                };
                Some(if m64 { narrow.launch.block_m } else { wide.launch.block_m })
            }
            _ => None,
        });
        let mut twin_plan = None;
        let groups = opts.entry.key_groups.or_else(|| {
            let (_, grouped) =
                loaded.iter().find(|(_, k)| k.launch.key_groups > 1 && rows.is_none_or(|m| k.launch.block_m == m))?;
            let one = single.iter().find(|k| k.launch.block_m == grouped.launch.block_m)?;
            let plan = self.plan_for(variant, one, p, opts).ok()?;
            twin_plan = Some(((one.launch.block_m, one.launch.block_n), plan));
            let ctas = Self::work_ctas(one, p) * u64::from(plan.num_splits);
            let blocks = plan.keys_per_split / one.launch.block_n.max(1);
            Some(if planner::prefer_key_groups(ctas, self.device.sm_count, blocks) {
                grouped.launch.key_groups
            } else {
                1
            })
        });
        let found: Vec<(u32, u32)> = loaded.iter().map(|(_, k)| (k.launch.block_m, k.launch.key_groups)).collect();
        let (name, kern) = loaded
            .into_iter()
            .find(|(_, k)| rows.is_none_or(|m| k.launch.block_m == m) && groups.is_none_or(|g| k.launch.key_groups == g))
            .ok_or_else(|| {
                if found.is_empty() {
                    Error::MissingKernels(format!("entry {base} (or {base}_m64, {base}_kg2) is not in the loaded fatbins"))
                } else {
                    let shown = |x: Option<u32>| x.map_or_else(|| "any".to_string(), |v| v.to_string());
                    Error::Invalid(format!(
                        "block_m {}, key_groups {}: {base} is loaded with (rows, key groups) {found:?}; pick one of those or leave it to the planner",
                        shown(rows),
                        shown(groups)
                    ))
                }
            })?;
        // The planner counts one useful CTA per SM, so the twin's plan is the chosen
        // entry's wherever both tile the problem alike.
        let plan = match twin_plan {
            Some((tiles, plan)) if tiles == (kern.launch.block_m, kern.launch.block_n) => plan,
            _ => self.plan_for(variant, kern, p, opts)?,
        };
        // A persistent twin runs the same tiles and plan: taken for grids over a wave.
        let twin = self.persistent_twin(&name);
        let persistent = match opts.entry.persistent {
            Some(want) if want != kern.launch.persistent && (!want || twin.is_none()) => invalid!(
                "persistent {want}: {name} is loaded {} a persistent twin; leave it to the planner",
                if kern.launch.persistent { "as persistent, without" } else { "without" }
            ),
            Some(want) => want && !kern.launch.persistent,
            None => {
                twin.is_some()
                    && planner::prefer_persistent(Self::work_ctas(kern, p) * u64::from(plan.num_splits), slots(kern))
            }
        };
        match twin {
            Some(twin) if persistent => Ok((format!("{name}_persistent"), twin, plan)),
            _ => Ok((name, kern, plan)),
        }
    }

    /// A launch of `k` for this problem as the planner sees it.
    fn launch_grid(k: &Kernel, p: &Problem, causal: bool) -> planner::LaunchGrid {
        planner::LaunchGrid {
            causal,
            heads: (p.batch * p.heads) as u64,
            seqlen_q: p.seqlen_q as u32,
            seqlen_k: p.seqlen_k as u32,
            block_m: k.launch.block_m,
            block_n: k.launch.block_n,
            ctas_per_sm: k.ctas_per_sm,
            persistent: k.launch.persistent,
        }
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
                    Some((stride, self.stream.clone_htod(&table).cuda("copying a causal schedule to the device")?))
                }
                None => None,
            }),
        };
        Ok(schedule.as_ref().map_or((0, 0), |(stride, table)| (device_ptr(table, &self.stream), *stride as i32)))
    }

    /// Whether the Hopper kernel was loaded (an sm_90 device with sm_90a fatbins).
    pub fn has_hopper(&self) -> bool {
        self.hopper
    }

    /// The kernel `forward` runs for this problem: `Auto` takes the Hopper kernel
    /// where loaded and measured faster (`planner::prefer_hopper`).
    pub fn resolve(&self, p: &Problem, variant: Variant) -> Result<Variant> {
        match variant {
            Variant::Auto if self.has_hopper() && planner::prefer_hopper(p.seqlen_k) => Ok(Variant::Hopper),
            Variant::Auto | Variant::Portable => Ok(Variant::Portable),
            Variant::Hopper if self.has_hopper() => Ok(Variant::Hopper),
            Variant::Hopper => Err(Error::Unsupported(format!(
                "the Hopper kernel needs compute capability 9.0 (sm_90a fatbins); {} is {}; use the portable variant",
                self.device.name, self.device.compute_capability
            ))),
        }
    }

    /// The split plan `forward` would use for this problem.
    pub fn plan(&self, p: &Problem, dtype: Dtype, opts: &Options) -> Result<Plan> {
        let variant = self.resolve(p, opts.entry.variant)?;
        Ok(self.fwd_kernel(variant, dtype, p, opts)?.2)
    }

    /// `variant`: the resolved kernel (Portable or Hopper), whose model and
    /// constants `planner::grid_cost` picks.
    fn plan_for(&self, variant: Variant, k: &Kernel, p: &Problem, opts: &Options) -> Result<Plan> {
        let block_n = k.launch.block_n;
        let n_blocks = (p.seqlen_k as u32).div_ceil(block_n).max(1);
        let plan = match opts.splits {
            Splits::Fixed(0) => invalid!("a fixed split count must be at least 1"),
            Splits::Fixed(n) => {
                let per = n_blocks.div_ceil(n.min(planner::MAX_SPLITS));
                Plan { num_splits: n_blocks.div_ceil(per), keys_per_split: per * block_n }
            }
            Splits::Auto => match planner::grid_cost(variant == Variant::Hopper, p.head_dim, opts.causal) {
                Some(cost) => {
                    let grid = Self::launch_grid(k, p, opts.causal);
                    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
                    let mut plans = self.sim_plans.lock().unwrap_or_else(|e| e.into_inner());
                    *plans
                        .entry((grid, variant))
                        .or_insert_with(|| planner::plan_simulated(self.device.sm_count, &grid, &cost))
                }
                // A two-group entry gets its one-group twin's plan (the planner counts one
                // useful CTA per SM either way), the plan prefer_key_groups chose it by.
                None => planner::plan(
                    self.device.sm_count,
                    k.ctas_per_sm,
                    Self::work_ctas(k, p),
                    p.seqlen_k as u32,
                    block_n,
                ),
            },
        };
        Ok(plan)
    }

    /// out = softmax(q·kᵀ·scale [+ causal mask]) · v, and optionally the per-row
    /// log-sum-exp into `lse` ([B, H, Sq] fp32). Enqueued on the stream; errors in
    /// the kernel surface at the next synchronising call.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut CudaSlice<f32>>,
        opts: &Options,
    ) -> Result<Launched> {
        let p = tensor::validate(q.arg("q"), k.arg("k"), v.arg("v"), out.arg("out"), opts.scale)?;
        let rows = p.batch * p.heads * p.seqlen_q;
        if let Some(l) = &lse
            && l.len() < rows
        {
            invalid!("lse holds {} floats but batch × heads × seqlen_q = {rows}", l.len());
        }
        let variant = self.resolve(&p, opts.entry.variant)?;
        if rows == 0 {
            return Ok(Launched { num_splits: 0, ctas: 0, variant, block_m: 0, key_groups: 0, persistent: false }); // empty result: nothing to launch
        }
        let (name, kern, plan) = self.fwd_kernel(variant, q.dtype, &p, opts)?;
        let m_blocks = (p.seqlen_q as u32).div_ceil(kern.launch.block_m);
        let splits = plan.num_splits;
        let (mut o_part, mut lse_part) = if splits > 1 {
            let n = splits as usize * rows;
            // SAFETY: every element is written by the forward kernel before the combine reads it
            // (each split writes all its rows, including those that saw no key).
            let o = unsafe { self.stream.alloc::<f32>(n * p.head_dim) }.cuda("allocating split partials")?;
            let l = unsafe { self.stream.alloc::<f32>(n) }.cuda("allocating split LSEs")?;
            (Some(o), Some(l))
        } else {
            (None, None)
        };
        let s = &self.stream;
        let ptr = |t: &Tensor| device_ptr(&t.data, s);
        let lse_ptr = lse.as_ref().map_or(0, |l| device_ptr(*l, s));
        for (name, t) in [("q", q), ("k", k), ("v", v), ("out", &*out)] {
            if ptr(t) % 16 != 0 {
                invalid!("{name} device pointer {:#x} is not 16-byte aligned", ptr(t));
            }
        }
        let strides = |d: &Desc| d.strides.map(|x| x as i64);
        let params = FlashParams {
            q: ptr(q),
            k: ptr(k),
            v: ptr(v),
            o: ptr(out),
            lse: lse_ptr,
            o_partial: o_part.as_ref().map_or(0, |b| device_ptr(b, s)),
            lse_partial: lse_part.as_ref().map_or(0, |b| device_ptr(b, s)),
            q_strides: strides(&q.desc),
            k_strides: strides(&k.desc),
            v_strides: strides(&v.desc),
            o_strides: strides(&out.desc),
            batch: p.batch as i32,
            heads: p.heads as i32,
            kv_heads: p.kv_heads as i32,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            num_splits: splits as i32,
            keys_per_split: plan.keys_per_split as i32,
            scale_log2: p.scale * std::f32::consts::LOG2_E,
        };
        // A persistent entry: as many CTAs as are resident at once, each looping over
        // its units from a 1-D grid (causal: pairs of query blocks, longest with
        // shortest; else single blocks); the others take (query block, batch × head,
        // split) from a 3-D grid.
        let per_head = planner::blocks_to_units(m_blocks, opts.causal);
        let units = u64::from(per_head) * (p.batch * p.heads) as u64 * u64::from(splits);
        let blocks = u64::from(m_blocks) * (p.batch * p.heads) as u64 * u64::from(splits);
        if kern.launch.persistent && blocks > i32::MAX as u64 {
            return Err(Error::Unsupported(format!(
                "{blocks} query blocks × batch × heads × splits exceed {}; {name} decodes them in 32 bits",
                i32::MAX
            )));
        }
        let grid_dim = if kern.launch.persistent {
            let slots = u64::from(self.device.sm_count) * u64::from(kern.ctas_per_sm.max(1));
            (units.min(slots) as u32, 1, 1)
        } else {
            (m_blocks, (p.batch * p.heads) as u32, splits)
        };
        let cfg =
            LaunchConfig { grid_dim, block_dim: (kern.launch.threads, 1, 1), shared_mem_bytes: kern.dynamic_smem };
        if variant == Variant::Hopper {
            // The 128-row causal entries read a schedule (the kernel's kScheduled); the
            // 64-row one always runs the pairs.
            let scheduled = kern.launch.persistent && opts.causal && kern.launch.block_m >= 128;
            let (order, order_stride) =
                if scheduled { self.causal_order(kern, &p, &plan, grid_dim.0)? } else { (0, 0) };
            let map = |t: &Tensor, rows: u32| tensor_map(ptr(t), t.dtype, &t.desc, rows);
            let hparams = HopperParams {
                q_map: map(q, kern.launch.block_m)?,
                k_map: map(k, kern.launch.block_n)?,
                v_map: map(v, kern.launch.block_n)?,
                p: params,
                sched: HopperSched {
                    units: units as i32,
                    per_head: FastDiv::new(per_head),
                    bh: FastDiv::new((p.batch * p.heads) as u32),
                    heads: FastDiv::new(p.heads as u32),
                    group: FastDiv::new((p.heads / p.kv_heads) as u32),
                    blocks: FastDiv::new(m_blocks),
                    order,
                    order_stride,
                    pad: 0,
                },
            };
            // SAFETY: matches `flash_fwd_hopper_<dtype>_d<D>[_causal][_m64](const __grid_constant__
            // HopperParams p)` in kernels/flash_fwd_hopper_<dtype>.cu. The tensor maps describe
            // exactly the validated q/k/v extents (TMA zero-fills and never reads past them);
            // `sched` describes this grid (units checked < 2^31 above; a causal schedule holds
            // grid × order_stride block indices below m_blocks × B·H × splits, and stays in
            // `causal_orders` while launches that read it may run); the rest as for the
            // portable kernel below.
            unsafe { s.launch_builder(&kern.func).arg(&hparams).launch(cfg) }.cuda(format!("launching {name}"))?;
        } else {
            // SAFETY: matches `flash_fwd_<dtype>_d<D>[_causal][_m64|_kg2](const FlashParams p)` in
            // kernels/flash_fwd_<dtype>.cu. validate() proved every (b, h, s) row of q/k/v/out
            // lies inside its buffer, strides are 16-byte multiples and pointers 16-byte
            // aligned; lse (if any) holds B·H·Sq floats; the partials hold splits·B·H·Sq(·D).
            // The buffers outlive the launch because the stream frees in order.
            unsafe { s.launch_builder(&kern.func).arg(&params).launch(cfg) }.cuda(format!("launching {name}"))?;
        }

        if let (Some(o_part), Some(lse_part)) = (o_part.as_mut(), lse_part.as_mut()) {
            let cname = format!("flash_combine_{}_d{}", q.dtype.name(), p.head_dim);
            let comb = self.kernel(&cname)?;
            let rows_per_block = comb.launch.threads / 32;
            let cparams = CombineParams {
                o_partial: device_ptr(o_part, s),
                lse_partial: device_ptr(lse_part, s),
                o: ptr(out),
                lse: lse_ptr,
                o_strides: strides(&out.desc),
                batch: p.batch as i32,
                heads: p.heads as i32,
                seqlen_q: p.seqlen_q as i32,
                num_splits: splits as i32,
            };
            let cfg = LaunchConfig {
                grid_dim: ((rows as u32).div_ceil(rows_per_block), 1, 1),
                block_dim: (comb.launch.threads, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `flash_combine_<dtype>_d<D>(const CombineParams p)`; it reads
            // splits·rows(·D) partials written above and writes `out` rows validated above.
            unsafe { s.launch_builder(&comb.func).arg(&cparams).launch(cfg) }.cuda(format!("launching {cname}"))?;
        }
        let ctas = u64::from(grid_dim.0) * u64::from(grid_dim.1) * u64::from(grid_dim.2);
        Ok(Launched {
            num_splits: splits,
            ctas,
            variant,
            block_m: kern.launch.block_m,
            key_groups: kern.launch.key_groups,
            persistent: kern.launch.persistent,
        })
    }

    /// The fp32 GPU reference: returns (out [B, H, Sq, D], lse [B, H, Sq]) on the host.
    pub fn reference(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let p = tensor::validate(q.arg("q"), k.arg("k"), v.arg("v"), q.arg("q (as out)"), scale)?;
        let name = format!("reference_attention_{}", q.dtype.name());
        let kern = self.kernel(&name)?;
        // Rounded up to 16 bytes: nvcc reads the score row with LDS.128 even in the loop's
        // remainder, so the tail of the last chunk must lie inside the allocation.
        let smem = p.seqlen_k.next_multiple_of(4) * 4;
        if smem > kern.dynamic_smem as usize {
            invalid!(
                "the GPU reference holds {} keys per row in shared memory; seqlen_k is {}",
                kern.dynamic_smem / 4,
                p.seqlen_k
            );
        }
        let rows = p.batch * p.heads * p.seqlen_q;
        if rows == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let s = &self.stream;
        let o = s.alloc_zeros::<f32>(rows * p.head_dim).cuda("allocating the reference output")?;
        let l = s.alloc_zeros::<f32>(rows).cuda("allocating the reference LSE")?;
        let strides = |d: &Desc| d.strides.map(|x| x as i64);
        let params = ReferenceParams {
            q: device_ptr(&q.data, s),
            k: device_ptr(&k.data, s),
            v: device_ptr(&v.data, s),
            o: device_ptr(&o, s),
            lse: device_ptr(&l, s),
            q_strides: strides(&q.desc),
            k_strides: strides(&k.desc),
            v_strides: strides(&v.desc),
            batch: p.batch as i32,
            heads: p.heads as i32,
            kv_heads: p.kv_heads as i32,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            head_dim: p.head_dim as i32,
            causal: causal.into(),
            scale: p.scale,
        };
        let cfg = LaunchConfig {
            grid_dim: (p.seqlen_q as u32, (p.batch * p.heads) as u32, 1),
            block_dim: (kern.launch.threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: matches `reference_attention_<dtype>(const ReferenceParams p)` in
        // kernels/reference.cu; inputs validated as in `forward`, o/lse sized rows·D and
        // rows, dynamic smem holds seqlen_k floats rounded up to 16 bytes (≤ the manifest's allotment).
        unsafe { s.launch_builder(&kern.func).arg(&params).launch(cfg) }.cuda(format!("launching {name}"))?;
        let o = s.clone_dtoh(&o).cuda("copying the reference output")?;
        let l = s.clone_dtoh(&l).cuda("copying the reference LSE")?;
        Ok((o, l))
    }
}

/// A TMA map of a [B, H, S, D] tensor at `ptr`: 4-D innermost first (d, seq, head,
/// batch), boxes of 64 columns × `rows` rows with the 128-byte swizzle the wgmma
/// descriptors expect. A zero-length sequence is described as one row; the kernel
/// issues no load for it.
fn tensor_map(ptr: u64, dtype: Dtype, desc: &Desc, rows: u32) -> Result<TmaDesc> {
    let [b, h, seq, d] = desc.dims.map(|x| x as u64);
    let [sb, sh, ss] = desc.strides.map(|x| x as u64 * 2);
    let dims = [d, seq.max(1), h, b];
    let strides = [ss, sh, sb];
    let boxes = [64u32, rows, 1, 1];
    let element_strides = [1u32; 4];
    let data_type = match dtype {
        Dtype::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        Dtype::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
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
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    res.result().cuda(format!("encoding a TMA map of dims {dims:?} with byte strides {strides:?}"))?;
    // SAFETY: written by the successful call above.
    Ok(TmaDesc(unsafe { map.assume_init() }.opaque))
}

/// A persistent causal launch's schedule on the device: (row length, the rows).
type CausalOrder = (u32, CudaSlice<u32>);

fn device_ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (ptr, _sync) = buf.device_ptr(stream);
    ptr
}

fn driver_version() -> Option<String> {
    let mut v = 0;
    // SAFETY: cuDriverGetVersion writes one int; the driver is loaded by Ctx::new.
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (ok == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, v % 1000 / 10))
}

/// A CUDA device UUID in NVML's and nvidia-smi's form: `GPU-` and 8-4-4-4-12 hex digits.
pub fn uuid_string(bytes: &[std::ffi::c_char; 16]) -> String {
    let hex: String = bytes.iter().map(|&b| format!("{:02x}", b as u8)).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_as_nvidia_smi_prints_them() {
        let bytes: [std::ffi::c_char; 16] = std::array::from_fn(|i| (i as u8 * 17) as std::ffi::c_char);
        assert_eq!(uuid_string(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn variant_names_round_trip_and_unknown_ones_say_what_is_accepted() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>(), Ok(v));
        }
        let err = "wgmma".parse::<Variant>().unwrap_err();
        assert!(err.contains("`wgmma`") && err.contains("auto, portable or hopper"), "{err}");
        assert_eq!(Variant::default(), Variant::Auto);
    }
}
