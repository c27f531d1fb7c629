//! Finding nvcc (and its sibling tools), or installing the pinned CUDA 13.0
//! compiler wheels from PyPI when a machine has none.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::process::{Cmd, write_file};

/// The CUDA 13.0 compiler wheels. nvvm must match nvcc exactly or ptxas rejects
/// the PTX cicc writes; cuobjdump/nvdisasm only exist as newer wheels and only read SASS.
pub const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cuobjdump==13.5.37",
    "nvidia-cuda-nvdisasm==13.5.37",
];

/// Where the wheels put their binaries, relative to the pip `--target` folder.
const WHEEL_BIN: &str = "nvidia/cu13/bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    NvccEnv,
    CudaHome,
    CudaPath,
    Path,
    UsrLocalCuda,
    Wheels,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Nvcc {
    pub path: PathBuf,
    pub origin: Origin,
    /// e.g. `13.0.88`, from `nvcc --version`.
    pub version: String,
}

/// The discovery order as a pure function of the environment and the file system:
/// `NVCC`, `CUDA_HOME`, `CUDA_PATH`, each `PATH` entry, `/usr/local/cuda`, then the
/// wheels previously installed under `wheel_dir`.
pub fn discover(
    env: impl Fn(&str) -> Option<String>,
    is_file: impl Fn(&Path) -> bool,
    wheel_dir: &Path,
) -> Option<(PathBuf, Origin)> {
    let mut candidates: Vec<(PathBuf, Origin)> = Vec::new();
    if let Some(p) = env("NVCC").filter(|s| !s.is_empty()) {
        candidates.push((PathBuf::from(p), Origin::NvccEnv));
    }
    candidates.extend(toolkit_candidates("nvcc", &env));
    candidates.push((wheel_dir.join(WHEEL_BIN).join("nvcc"), Origin::Wheels));
    candidates.into_iter().find(|(p, _)| is_file(p))
}

/// Where a CUDA toolkit binary may live: `CUDA_HOME/bin`, `CUDA_PATH/bin`, `PATH`,
/// `/usr/local/cuda/bin`, in that order.
fn toolkit_candidates(tool: &str, env: &impl Fn(&str) -> Option<String>) -> Vec<(PathBuf, Origin)> {
    let mut out = Vec::new();
    for (var, origin) in [("CUDA_HOME", Origin::CudaHome), ("CUDA_PATH", Origin::CudaPath)] {
        if let Some(home) = env(var).filter(|s| !s.is_empty()) {
            out.push((Path::new(&home).join("bin").join(tool), origin));
        }
    }
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path).filter(|d| !d.as_os_str().is_empty()) {
            out.push((dir.join(tool), Origin::Path));
        }
    }
    out.push((Path::new("/usr/local/cuda/bin").join(tool), Origin::UsrLocalCuda));
    out
}

/// A toolkit binary the wheels do not carry (compute-sanitizer, ncu), or an error
/// that says how to get it.
pub fn cuda_tool(tool: &str) -> Result<PathBuf> {
    toolkit_candidates(tool, &|k| std::env::var(k).ok()).into_iter().map(|(p, _)| p).find(|p| p.is_file()).ok_or_else(
        || {
            anyhow::Error::new(crate::CannotRun(format!(
                "{tool} not found in CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda; it ships with the \
                 CUDA toolkit (not with the compiler wheels): install the toolkit on the GPU machine"
            )))
        },
    )
}

/// `nvcc --version` → `13.0.88` (the `V…` token of the `release` line).
pub fn parse_nvcc_version(text: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.contains("release"))
        .flat_map(|l| l.split([' ', ',']))
        .find_map(|tok| tok.strip_prefix('V'))
        .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_string)
}

/// Finds nvcc, installing the pinned wheels under `wheel_dir` when none exists.
pub fn nvcc(wheel_dir: &Path) -> Result<Nvcc> {
    let found = discover(|k| std::env::var(k).ok(), Path::is_file, wheel_dir);
    let (path, origin) = match found {
        Some(found) if found.1 != Origin::Wheels || wheels_current(wheel_dir) => found,
        _ => {
            install_wheels(wheel_dir)?;
            (wheel_dir.join(WHEEL_BIN).join("nvcc"), Origin::Wheels)
        }
    };
    let out = Cmd::new(&path)
        .arg("--version")
        .quiet()
        .timeout(Duration::from_secs(30))
        .run_checked()
        .with_context(|| format!("asking {} for its version", path.display()))?;
    let version = parse_nvcc_version(&out.stdout).with_context(|| {
        format!("no `release … V<version>` line in `{} --version`:\n{}", path.display(), out.stdout)
    })?;
    Ok(Nvcc { path, origin, version })
}

fn pins_file(wheel_dir: &Path) -> PathBuf {
    wheel_dir.join("PINS")
}

fn wheels_current(wheel_dir: &Path) -> bool {
    std::fs::read_to_string(pins_file(wheel_dir)).is_ok_and(|s| s == WHEELS.join("\n"))
}

fn install_wheels(wheel_dir: &Path) -> Result<()> {
    eprintln!(
        "xtask: no CUDA toolkit found (NVCC, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda); \
         installing the pinned CUDA 13.0 compiler wheels from PyPI into {}",
        wheel_dir.display()
    );
    if wheel_dir.exists() {
        std::fs::remove_dir_all(wheel_dir).with_context(|| format!("removing stale {}", wheel_dir.display()))?;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    Cmd::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .arg("--target")
        .arg(wheel_dir.display().to_string())
        .args(WHEELS.iter().copied())
        .timeout(Duration::from_secs(900))
        .log(wheel_dir.with_extension("pip.log"))
        .run_checked()
        .context(
            "installing the CUDA wheels failed; install a CUDA 13.0 toolkit and set CUDA_HOME, \
             or make `python3 -m pip` reach PyPI",
        )?;
    let nvcc = wheel_dir.join(WHEEL_BIN).join("nvcc");
    if !nvcc.is_file() {
        bail!("the wheels installed, but {} is missing", nvcc.display());
    }
    write_file(&pins_file(wheel_dir), WHEELS.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn find(vars: &[(&str, &str)], files: &[&str]) -> Option<(PathBuf, Origin)> {
        let env: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        discover(|k| env.get(k).cloned(), |p| files.iter().any(|f| Path::new(f) == p), Path::new("/t/cuda"))
    }

    #[test]
    fn discovery_order() {
        let all = [
            "/x/nvcc",
            "/home/cuda/bin/nvcc",
            "/cp/bin/nvcc",
            "/p2/nvcc",
            "/usr/local/cuda/bin/nvcc",
            "/t/cuda/nvidia/cu13/bin/nvcc",
        ];
        let vars = [("NVCC", "/x/nvcc"), ("CUDA_HOME", "/home/cuda"), ("CUDA_PATH", "/cp"), ("PATH", "/p1:/p2")];
        assert_eq!(find(&vars, &all).unwrap().1, Origin::NvccEnv);
        assert_eq!(find(&vars[1..], &all).unwrap().1, Origin::CudaHome);
        assert_eq!(find(&vars[2..], &all).unwrap().1, Origin::CudaPath);
        assert_eq!(find(&vars[3..], &all).unwrap(), (PathBuf::from("/p2/nvcc"), Origin::Path));
        assert_eq!(find(&[], &all).unwrap().1, Origin::UsrLocalCuda);
        assert_eq!(find(&[], &all[5..]).unwrap().1, Origin::Wheels);
        assert_eq!(find(&vars, &[]), None);
    }

    #[test]
    fn env_pointing_nowhere_falls_through() {
        let got = find(&[("NVCC", "/missing/nvcc"), ("CUDA_HOME", "")], &["/usr/local/cuda/bin/nvcc"]);
        assert_eq!(got.unwrap().1, Origin::UsrLocalCuda);
    }

    #[test]
    fn version_line() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\n\
            Copyright (c) 2005-2025 NVIDIA Corporation\n\
            Built on Wed_Aug_20_01:58:59_PM_PDT_2025\n\
            Cuda compilation tools, release 13.0, V13.0.88\n\
            Build cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_nvcc_version(text).as_deref(), Some("13.0.88"));
        assert_eq!(parse_nvcc_version("garbage"), None);
    }
}
