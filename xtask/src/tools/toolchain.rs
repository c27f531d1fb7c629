//! Finding nvcc (and its sibling tools), or installing the pinned CUDA 13.0
//! compiler wheels from PyPI when a machine has none.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::tools::process::{self, Cmd, Lock, write_file};
use crate::tools::progress::Progress;

/// The CUDA 13.0 compiler wheels, pinned with the hash of every wheel of each release
/// (pip `--require-hashes`). Compiled in, so a prebuilt xtask carries its pins.
pub const REQUIREMENTS: &str = include_str!("../../../ci/requirements-cuda.txt");

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
/// The Python that installs pinned packages and runs the Python scripts:
/// `PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Installs from a pinned list into `dir` unless `dir/PINS` already records that
/// list: a changed pin reinstalls, an unchanged one costs nothing.
pub fn install_pinned(dir: &Path, pins: &str, what: &str, install: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let stamp = dir.join("PINS");
    if fa_schema::file::read_text(&stamp).is_ok_and(|s| s == pins) {
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing stale {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("xtask: installing {what} into {}", dir.display());
    install(dir).map_err(|e| crate::errors::CannotRun(format!("installing {what} failed: {e:#}")))?;
    write_file(&stamp, pins)
}

/// nvcc compiles host code with gcc/g++ from `PATH` unless `NVCC_CCBIN` names
/// another; without one every unit fails with the cause only in its log.
pub fn require_host_compiler() -> Result<()> {
    if std::env::var_os("NVCC_CCBIN").is_some_and(|c| !c.is_empty()) {
        return Ok(());
    }
    process::require_tools(
        &["gcc", "g++"],
        "nvcc (its host compiler)",
        "install them (Debian/Ubuntu: `apt install g++`) or set NVCC_CCBIN to another host compiler",
    )
}

pub fn cuda_tool(tool: &str) -> Result<PathBuf> {
    toolkit_candidates(tool, &|k| std::env::var(k).ok()).into_iter().map(|(p, _)| p).find(|p| p.is_file()).ok_or_else(
        || {
            anyhow::Error::new(crate::errors::CannotRun(format!(
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
            install_once(wheel_dir, wheels_current, install_wheels)?;
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

/// One requirement of a hash-pinned requirements file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub name: String,
    pub version: String,
    /// The environment marker after `;`, if any.
    pub marker: Option<String>,
    pub sha256: Vec<String>,
}

impl Pin {
    /// `name==version [; marker] (N hashes)`.
    pub fn describe(&self) -> String {
        let marker = self.marker.as_ref().map(|m| format!(" ; {m}")).unwrap_or_default();
        format!("{}=={}{marker} ({} hashes)", self.name, self.version, self.sha256.len())
    }
}

/// A requirements file as `pip --require-hashes` needs it: every requirement
/// `name==version` with at least one sha256. Comments, continuation lines and
/// markers are read; anything else (a range, an option, a hash-less pin) is an error.
pub fn parse_requirements(text: &str) -> Result<Vec<Pin>> {
    let joined = text
        .lines()
        .map(|l| l.split_once(" #").map_or(l, |(code, _)| code))
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut pins = Vec::new();
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace().peekable();
        let mut spec = String::new();
        while let Some(w) = words.next_if(|w| !w.starts_with("--hash=")) {
            spec.push_str(w);
            spec.push(' ');
        }
        let (req, marker) = match spec.split_once(';') {
            Some((r, m)) => (r.trim(), Some(m.trim().to_string())),
            None => (spec.trim(), None),
        };
        let (name, version) = req.split_once("==").with_context(|| format!("`{req}` is not pinned with `==`"))?;
        if name.is_empty() || version.is_empty() || version.contains(['*', ',', '<', '>', '=']) {
            bail!("`{req}` is not one exact version");
        }
        let sha256 = words
            .map(|w| {
                w.strip_prefix("--hash=sha256:")
                    .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_string)
                    .with_context(|| format!("`{w}` in `{req}` is not --hash=sha256:<64 hex digits>"))
            })
            .collect::<Result<Vec<_>>>()?;
        if sha256.is_empty() {
            bail!("`{req}` has no --hash");
        }
        pins.push(Pin { name: name.to_string(), version: version.to_string(), marker, sha256 });
    }
    if pins.is_empty() {
        bail!("no requirements");
    }
    Ok(pins)
}

fn pins_file(wheel_dir: &Path) -> PathBuf {
    wheel_dir.join("PINS")
}

fn wheels_current(wheel_dir: &Path) -> bool {
    fa_schema::file::read_text(&pins_file(wheel_dir)).is_ok_and(|s| s == REQUIREMENTS)
}

/// Runs `install` under a lock beside `wheel_dir`, unless another process
/// finished it while this one waited: two first builds on a fresh clone (or the
/// tests, in parallel) install once, and neither removes the other's wheels.
fn install_once(
    wheel_dir: &Path,
    current: impl Fn(&Path) -> bool,
    install: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let _lock = Lock::hold(&wheel_dir.with_extension("lock"), "installing the CUDA wheels")?;
    if current(wheel_dir) { Ok(()) } else { install(wheel_dir) }
}

fn install_wheels(wheel_dir: &Path) -> Result<()> {
    let pins = parse_requirements(REQUIREMENTS).context("ci/requirements-cuda.txt")?;
    let pins: Vec<String> = pins.iter().map(Pin::describe).collect();
    eprintln!(
        "xtask: no CUDA toolkit found (NVCC, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda); \
         installing the pinned CUDA 13.0 compiler wheels from PyPI into {}: {}",
        wheel_dir.display(),
        pins.join(", ")
    );
    if wheel_dir.exists() {
        std::fs::remove_dir_all(wheel_dir).with_context(|| format!("removing stale {}", wheel_dir.display()))?;
    }
    let python = python();
    // pip reads the requirements from a file; it lives beside the wheels' folder.
    let requirements = wheel_dir.with_extension("requirements.txt");
    write_file(&requirements, REQUIREMENTS)?;
    let progress = Arc::new(Progress::spinner("pip install (CUDA 13.0 wheels, about 280 MB)"));
    let feed = progress.clone();
    Cmd::new(&python)
        .args(["-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check", "--no-deps"])
        .arg("--require-hashes")
        .on_line(move |line| feed.message(line.trim()))
        .arg("--target")
        .arg(wheel_dir.display().to_string())
        .arg("-r")
        .arg(requirements.display().to_string())
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
    write_file(&pins_file(wheel_dir), REQUIREMENTS)
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
    fn cuda_wheels_are_pinned_by_hash_with_matching_nvvm() {
        let pins = parse_requirements(REQUIREMENTS).unwrap();
        let version = |n: &str| pins.iter().find(|p| p.name == n).map(|p| p.version.as_str());
        assert_eq!(pins.len(), 7);
        // ptxas rejects the PTX of an nvvm other than nvcc's own.
        assert_eq!(version("nvidia-nvvm"), version("nvidia-cuda-nvcc"));
        assert!(version("nvidia-cuda-nvcc").unwrap().starts_with("13.0."));
    }

    #[test]
    fn every_requirements_file_is_hash_pinned() {
        for text in
            [include_str!("../../../ci/requirements-lint.txt"), include_str!("../../../ci/requirements-torch.txt")]
        {
            let pins = parse_requirements(text).unwrap();
            assert!(pins.iter().all(|p| !p.sha256.is_empty()));
        }
        let torch = parse_requirements(include_str!("../../../ci/requirements-torch.txt")).unwrap();
        assert!(torch.iter().any(|p| p.name == "torch" && p.version.starts_with("2.11.")));
        assert!(torch.iter().any(|p| p.name == "safetensors"));
    }

    #[test]
    fn unpinned_or_hashless_requirements_are_errors() {
        let h = "--hash=sha256:".to_string() + &"a".repeat(64);
        let ok = parse_requirements(&format!("# c\nx==1.0 ; sys_platform == 'linux' \\\n    {h}\n")).unwrap();
        assert_eq!(ok[0].marker.as_deref(), Some("sys_platform == 'linux'"));
        for bad in [
            String::new(),
            "x==1.0\n".into(),
            format!("x>=1.0 {h}\n"),
            format!("x==1.* {h}\n"),
            "x==1.0 --hash=sha256:abc\n".into(),
            format!("--index-url https://example.invalid {h}\n"),
        ] {
            assert!(parse_requirements(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn concurrent_first_installs_install_once_and_remove_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let wheels = dir.path().join("cuda");
        let installs = std::sync::atomic::AtomicUsize::new(0);
        let current = |d: &Path| pins_file(d).is_file();
        let install = |d: &Path| {
            installs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if d.exists() {
                std::fs::remove_dir_all(d).unwrap();
            }
            std::fs::create_dir_all(d).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            assert!(d.is_dir(), "another install removed the wheels under this one");
            std::fs::write(pins_file(d), "pins").unwrap();
            Ok(())
        };
        std::thread::scope(|s| {
            let runs: Vec<_> = (0..4).map(|_| s.spawn(|| install_once(&wheels, current, install))).collect();
            for r in runs {
                r.join().unwrap().unwrap();
            }
        });
        assert_eq!(installs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(current(&wheels));
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
