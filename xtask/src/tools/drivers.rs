//! The kernel-ffi binaries xtask drives (fa-test, fa-run, …). Under cargo they are
//! built first; otherwise (a GPU machine without Rust) they must sit next to
//! xtask's own executable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::errors::CannotRun;
use crate::run::Run;
use crate::tools::gpu::ListedGpu;
use crate::tools::process::Cmd;
use crate::tools::progress::Progress;
use fa_schema::env;
use fa_schema::schema::DeviceInfo;

pub fn binary(cx: &Run, name: &str) -> Result<PathBuf> {
    let dir = if let Some(cargo) = std::env::var_os("CARGO") {
        let progress = Arc::new(Progress::spinner("cargo build --release (kernel-ffi binaries)"));
        let feed = progress.clone();
        Cmd::new(cargo)
            .args(["build", "--locked", "--release", "-p", "kernel-ffi", "--bins"])
            .on_line(move |line| feed.message(line.trim()))
            .log(cx.reports().join("cargo-build-release.log"))
            .cwd(&cx.root)
            .timeout(Duration::from_secs(1800))
            .run_checked()
            .context("building the kernel-ffi binaries")?;
        cx.target.join("release")
    } else {
        let exe = std::env::current_exe().context("locating xtask's executable")?;
        exe.parent().context("xtask's executable has no parent directory")?.to_path_buf()
    };
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found; build with `cargo build --release` and keep xtask, fa-test and fa-run \
             in one directory",
            path.display()
        );
    }
    Ok(path)
}

/// `cmd` (a kernel-ffi binary, or ncu or compute-sanitizer running one) aimed
/// at the kernel set in `kernels` and, where the run names one, the GPU
/// `device`: the one place xtask sets the environment the binaries read.
pub fn aim(cmd: Cmd, kernels: &Path, device: Option<&str>) -> Cmd {
    let cmd = cmd.env(env::KERNEL_DIR, kernels.display().to_string());
    match device {
        Some(d) => cmd.env(env::DEVICE, d),
        None => cmd,
    }
}

/// `cmd` pinned to `gpu` (where one is named): it sees only that GPU, as device 0.
pub fn on_gpu(cmd: Cmd, gpu: Option<&ListedGpu>) -> Cmd {
    match gpu {
        Some(g) => cmd.env("CUDA_VISIBLE_DEVICES", g.uuid.clone()).env(env::DEVICE, "0"),
        None => cmd,
    }
}

/// The start check of a `--gpus` worker (`deal`'s start) where it names a GPU:
/// the driver opens it and loads the kernels; why not, as one line. A worker on
/// the default GPU has none.
pub fn start_check(driver: &Path, kernels: &Path, gpu: Option<&ListedGpu>) -> Result<(), String> {
    gpu.map_or(Ok(()), |g| device_info(driver, kernels, None, Some(g)).map(drop).map_err(|e| format!("{e:#}")))
}

/// Asks the driver which device it sees (and proves it can load the fatbins):
/// `device`, or `gpu` where one is named.
pub fn device_info(driver: &Path, kernels: &Path, device: Option<&str>, gpu: Option<&ListedGpu>) -> Result<DeviceInfo> {
    let cmd = aim(Cmd::new(driver).arg("--info"), kernels, device);
    let out = on_gpu(cmd, gpu).quiet().timeout(Duration::from_secs(60)).run()?;
    if !out.success() {
        return Err(CannotRun(format!("{} --info failed: {}", driver.display(), out.tail())).into());
    }
    serde_json::from_str(out.stdout.trim()).context("parsing fa-test --info")
}
