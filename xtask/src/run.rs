//! The run context `main` builds once: where things live, the kernel set every
//! stage builds and loads, and the GPU the kernel-ffi binaries open. Works both
//! under cargo and from prebuilt binaries copied to a machine without Rust (the
//! GPU machine).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

#[derive(Debug, Clone)]
pub struct Run {
    pub root: PathBuf,
    pub target: PathBuf,
    /// The pip `--target` folder for the CUDA wheels.
    pub cuda_wheels: PathBuf,
    /// The kernel set every stage builds into and loads: `target/kernels`, or
    /// the `--out-dir` (or prebuilt `--kernels`) the user named.
    pub kernels: PathBuf,
    /// The GPU every kernel-ffi binary opens: `--device`, else `FA_DEVICE`; none
    /// lets CUDA pick its first. `tools::drivers::aim` hands it to the children.
    pub device: Option<String>,
}

impl Run {
    /// The workspace root is `XTASK_ROOT`, else the nearest ancestor of the current
    /// directory holding `kernels/manifest.json`.
    pub fn discover() -> Result<Run> {
        let root = match std::env::var_os("XTASK_ROOT") {
            Some(r) if Path::new(&r).join("kernels/manifest.json").is_file() => PathBuf::from(r),
            Some(r) => bail!(
                "XTASK_ROOT={} holds no kernels/manifest.json; point it at a checkout or unset it",
                Path::new(&r).display()
            ),
            None => {
                let cwd = std::env::current_dir()?;
                match cwd.ancestors().find(|d| d.join("kernels/manifest.json").is_file()) {
                    Some(r) => r.to_path_buf(),
                    None => bail!(
                        "no kernels/manifest.json in {} or its parents; run xtask inside the \
                         workspace or set XTASK_ROOT",
                        cwd.display()
                    ),
                }
            }
        };
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .map(|t| if t.is_absolute() { t } else { root.join(t) })
            .unwrap_or_else(|| root.join("target"));
        let cuda_wheels = target.join("cuda");
        let kernels = target.join("kernels");
        let device = std::env::var(fa_schema::env::DEVICE).ok().filter(|d| !d.is_empty());
        Ok(Run { root, target, cuda_wheels, kernels, device })
    }

    /// The context of one command: `discover`ed, with the kernel set the
    /// command names (`--out-dir`, `--kernels`) and the `--device` it names.
    pub fn new(device: Option<String>, kernels: Option<&Path>) -> Result<Run> {
        let mut cx = Run::discover()?;
        if let Some(dir) = kernels {
            cx.kernels = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
        }
        cx.device = device.or(cx.device);
        Ok(cx)
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join("kernels/manifest.json")
    }

    /// Reports and raw tool logs.
    pub fn reports(&self) -> PathBuf {
        self.target.join("xtask")
    }

    pub fn report(&self, kind: &str) -> PathBuf {
        self.reports().join(format!("{kind}.json"))
    }
}

/// `NVIDIA H200` → `nvidia-h200`: lower-case alphanumeric words joined by `-`,
/// safe as a file name.
pub fn slug(text: &str) -> String {
    let s: String = text.to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    #[test]
    fn slugs() {
        assert_eq!(super::slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(super::slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(super::slug("NVIDIA L4"), "nvidia-l4");
    }
}
