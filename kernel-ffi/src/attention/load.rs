//! Setting up: the driver, a context and stream on the GPU, the device's
//! description, and the fatbins of its arch, each entry with its shared-memory
//! opt-in and occupancy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext as Ctx, CudaModule};
use cudarc::nvrtc::Ptx;

use super::{Attention, Kernel, scratch};
use crate::device::{Gpu, Open};
use crate::error::{CudaContext, Error, Result};
use crate::manifest::{Manifest, is_hopper_entry};
use crate::schema::DeviceInfo;
use fa_schema::kernel_set::KernelSet;

/// The kernel folder [`Attention::new`] loads: `FA_KERNEL_DIR`, else the
/// `target/kernels` of the flash-pipeline checkout the current directory is in
/// ([`kernel_dir::find_for_library`](crate::kernel_dir::find_for_library)).
/// The error names every place looked and what to do.
pub fn default_kernel_dir() -> Result<PathBuf> {
    Ok(crate::kernel_dir::find_for_library()?)
}

impl Attention {
    /// Opens `gpu` and loads the kernel set found by the library's rule:
    ///
    /// 1. `FA_KERNEL_DIR`, when set (then the only place looked);
    /// 2. else `target/kernels` of the flash-pipeline checkout the current
    ///    directory is in (`$CARGO_TARGET_DIR/kernels` where that is set).
    ///
    /// A program that depends on kernel-ffi and runs outside the checkout sets
    /// `FA_KERNEL_DIR`, or names the folder with [`Attention::with_kernel_dir`];
    /// nothing is looked for beside the executable or in the program's own
    /// `target/`. Where no kernel set is found the error
    /// ([`Error::MissingKernels`]) lists the places looked and says how to build
    /// one (`cargo xtask build` in the flash-pipeline checkout). The module
    /// [`kernel_dir`](crate::kernel_dir) has the rule in full, and the one
    /// kernel-ffi's own tools follow.
    ///
    /// ```no_run
    /// use kernel_ffi::{Attention, Gpu};
    ///
    /// // GPU 0, kernels from FA_KERNEL_DIR or the checkout the current directory is in.
    /// let att = Attention::new(&Gpu::default())?;
    /// println!("{} (sm {})", att.device().name, att.device().compute_capability);
    /// # Ok::<(), kernel_ffi::Error>(())
    /// ```
    pub fn new(gpu: &Gpu) -> Result<Attention> {
        Attention::with_kernel_dir(gpu, &default_kernel_dir()?)
    }

    /// Opens `gpu` and loads the kernel set in `dir`: a folder `cargo xtask
    /// build` wrote (`target/kernels` of the flash-pipeline checkout) or a copy
    /// of one. Every file is checked against the set's `kernel-set.json`, so a
    /// set whose build did not finish is refused, not half-loaded; then the
    /// fatbins of the device's arch are loaded, each entry with its
    /// shared-memory opt-in and occupancy.
    ///
    /// Errors: [`Error::MissingKernels`] for a folder that is not a complete
    /// kernel set (checked first, so without a GPU too), [`Error::Unsupported`]
    /// without an NVIDIA driver, for a GPU that does not exist or an arch the set
    /// was not built for, [`Error::Cuda`] when the driver fails.
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use kernel_ffi::{Attention, Gpu};
    ///
    /// let att = Attention::with_kernel_dir(&Gpu::Ordinal(0), Path::new("/opt/flash-pipeline/kernels"))?;
    /// println!("{}: Hopper kernel loaded: {}", att.device().name, att.has_hopper());
    /// # Ok::<(), kernel_ffi::Error>(())
    /// ```
    pub fn with_kernel_dir(gpu: &Gpu, dir: &Path) -> Result<Attention> {
        let manifest_path = dir.join("manifest.json");
        if !manifest_path.is_file() {
            return Err(Error::MissingKernels(format!(
                "{} does not exist, so {} is not a kernel set; build one with `cargo xtask build` in the \
                 flash-pipeline checkout (it writes target/kernels there) and pass that folder",
                manifest_path.display(),
                dir.display()
            )));
        }
        // Every file is checked against the record of the build that wrote the
        // set, so a failed or interrupted build is refused, not half-loaded.
        let set = KernelSet::load(dir).map_err(|e| Error::MissingKernels(format!("{e:#}")))?;
        let manifest = set
            .read_checked(dir, "manifest.json")
            .and_then(|b| Manifest::parse(&String::from_utf8(b)?))
            .map_err(|e| Error::MissingKernels(format!("{}: {e:#}", manifest_path.display())))?;
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
                "{}: {}; add a matching arch to kernels/manifest.json",
                device.name,
                manifest.unsupported(major, minor)
            ))
        })?;
        // A created stream, not the legacy default one, so that it can be captured into graphs.
        let stream = ctx.new_stream().cuda("creating a stream")?;
        let Loaded { kernels, modules } = load(&ctx, dir, &set, &manifest, &arch)?;
        let hopper = kernels.keys().any(|k| is_hopper_entry(k));
        Ok(Attention {
            scratch: scratch::Scratch::new(&ctx),
            ctx,
            stream,
            device,
            kernels,
            hopper,
            dependent_launch: combine_waits(&arch),
            sim_plans: Mutex::default(),
            causal_orders: Mutex::default(),
            _modules: modules,
        })
    }
}

/// The entries the manifest builds for an arch, by name, and the modules that hold them.
struct Loaded {
    kernels: HashMap<String, Kernel>,
    modules: Vec<Arc<CudaModule>>,
}

/// Loads every entry the manifest builds for `arch` from the fatbins in `dir`.
fn load(ctx: &Arc<Ctx>, dir: &Path, set: &KernelSet, manifest: &Manifest, arch: &str) -> Result<Loaded> {
    let mut kernels = HashMap::new();
    let mut modules = Vec::new();
    for src in manifest.sources.iter().filter(|s| s.archs.iter().any(|a| a == arch)) {
        let name = src.fatbin(arch);
        let path = dir.join(&name);
        let image = set.read_checked(dir, &name).map_err(|e| Error::MissingKernels(format!("{e:#}")))?;
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
    Ok(Loaded { kernels, modules })
}

/// Whether the combine entries of `arch` wait for the forward grid
/// (`griddepcontrol.wait`, compiled in from sm_90 on), so that they may be
/// launched as its programmatic dependents.
fn combine_waits(arch: &str) -> bool {
    let digits = arch.strip_prefix("sm_").map(|a| a.trim_end_matches('a'));
    digits.and_then(|d| d.parse::<u32>().ok()).is_some_and(|n| n >= 90)
}

/// The driver's CUDA version, e.g. `13.0`.
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
    fn only_combines_built_for_sm_90_on_wait_for_the_forward_grid() {
        assert!(combine_waits("sm_90a") && combine_waits("sm_90") && combine_waits("sm_100"));
        assert!(!combine_waits("sm_89") && !combine_waits("sm_80") && !combine_waits("compute_90"));
    }

    #[test]
    fn uuids_read_as_nvidia_smi_prints_them() {
        let bytes: [std::ffi::c_char; 16] = std::array::from_fn(|i| (i as u8 * 17) as std::ffi::c_char);
        assert_eq!(uuid_string(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
