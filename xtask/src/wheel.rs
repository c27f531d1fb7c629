//! `cargo xtask wheel`: the Python package `python/` as a wheel that carries the
//! compiled kernels. The run's kernel set (built first) is copied, file by file
//! as its `kernel-set.json` records them, into `python/flash_pipeline/kernels`
//! (git-ignored), and maturin (pinned in ci/requirements-wheel.txt, installed
//! under target/maturin) builds an abi3 wheel into target/wheels, which is then
//! checked to hold every one of those files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::errors::CheckFailed;
use crate::run::Run;
use crate::tools::process::{Cmd, Lock, write_file};
use crate::tools::toolchain;
use fa_schema::kernel_set::{self, KernelSet};

const REQUIREMENTS: &str = include_str!("../../ci/requirements-wheel.txt");
const PYTEST: &str = include_str!("../../ci/requirements-pytest.txt");

/// Where the package takes its kernels from, relative to the checkout.
pub const PACKAGE_KERNELS: &str = "python/flash_pipeline/kernels";

pub fn run(cx: &Run) -> Result<PathBuf> {
    let set = KernelSet::load(&cx.kernels)?;
    if !set.defines.is_empty() {
        bail!(crate::errors::CannotRun(format!(
            "the kernel set in {} was built with --define {}: a wheel ships the committed kernels; rebuild without defines",
            cx.kernels.display(),
            set.defines.join(" --define ")
        )));
    }
    let into = cx.root.join(PACKAGE_KERNELS);
    let names = copy_set(&cx.kernels, &set, &into)?;
    let maturin = install_maturin(cx)?;
    let out = cx.target.join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    let python = toolchain::python();
    eprintln!("wheel: maturin build ({} kernel files)", names.len());
    Cmd::new(maturin.join("bin/maturin"))
        .args(["build", "--release", "--locked", "--manifest-path"])
        .arg(cx.root.join("python/Cargo.toml").display().to_string())
        .arg("--out")
        .arg(out.display().to_string())
        .cwd(cx.root.join("python"))
        .timeout(Duration::from_secs(1800))
        .log(cx.reports().join("wheel.log"))
        .run_checked()
        .context("maturin could not build the wheel")?;
    let wheel = only_wheel(&out)?;
    let listed = list_wheel(&python, &wheel)?;
    let missing = missing_kernels(&listed, &names);
    if !missing.is_empty() {
        bail!(CheckFailed(format!("{} lacks kernel files: {}", wheel.display(), missing.join(", "))));
    }
    println!("{}", wheel.display());
    Ok(wheel)
}

/// The files of the set (as its record lists them, and the record) copied into
/// `into`, emptied first; their names.
fn copy_set(from: &Path, set: &KernelSet, into: &Path) -> Result<Vec<String>> {
    if into.exists() {
        std::fs::remove_dir_all(into).with_context(|| format!("emptying {}", into.display()))?;
    }
    let mut names: Vec<String> = set.files.keys().cloned().collect();
    names.push(kernel_set::FILE.to_string());
    for name in &names {
        let bytes = if name == kernel_set::FILE {
            fa_schema::file::read(&from.join(name))?
        } else {
            set.read_checked(from, name)?
        };
        write_file(&into.join(name), bytes)?;
    }
    Ok(names)
}

/// The package's tests that need no GPU (python/tests/test_cpu.py), against
/// `wheel` installed with pytest under target/python-ci; the parts that need
/// torch skip where it is not installed.
pub fn test_cpu(cx: &Run, wheel: &Path) -> Result<()> {
    let site = cx.target.join("python-ci");
    let _ = std::fs::remove_dir_all(&site);
    pip_install(&site, &["--no-deps", &wheel.display().to_string()], "the wheel")?;
    let requirements = site.with_extension("requirements.txt");
    write_file(&requirements, PYTEST)?;
    pip_install(&site, &["--no-deps", "--require-hashes", "-r", &requirements.display().to_string()], "pytest")?;
    let python = toolchain::python();
    let out = Cmd::new(&python)
        // From the root, so that `flash_pipeline` is the installed wheel, not python/'s sources.
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests/test_cpu.py"])
        .env("PYTHONPATH", site.display().to_string())
        .cwd(&cx.root)
        .timeout(Duration::from_secs(600))
        .log(cx.reports().join("python-cpu-tests.log"))
        .echo()
        .run()?;
    if !out.success() {
        bail!(CheckFailed("the Python package's CPU tests failed; see the output above".into()));
    }
    Ok(())
}

/// maturin under target/maturin, installed once per pin set.
fn install_maturin(cx: &Run) -> Result<PathBuf> {
    let dir = cx.target.join("maturin");
    let _lock = Lock::hold(&dir.with_extension("lock"), "installing maturin")?;
    toolchain::install_pinned(&dir, REQUIREMENTS, "maturin", |dir| {
        let requirements = dir.with_extension("requirements.txt");
        write_file(&requirements, REQUIREMENTS)?;
        pip_install(dir, &["--no-deps", "--require-hashes", "-r", &requirements.display().to_string()], "maturin")
    })?;
    Ok(dir)
}

/// `pip install --target dir ARGS`: what, said where it fails.
fn pip_install(dir: &Path, args: &[&str], what: &str) -> Result<()> {
    let python = toolchain::python();
    Cmd::new(&python)
        .args(["-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check", "--target"])
        .arg(dir.display().to_string())
        .args(args.iter().copied())
        .timeout(Duration::from_secs(600))
        .log(dir.with_extension("pip.log"))
        .run_checked()
        .with_context(|| {
            format!("installing {what} under {} failed; make `python3 -m pip` reach PyPI", dir.display())
        })?;
    Ok(())
}

fn only_wheel(dir: &Path) -> Result<PathBuf> {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("maturin left {} wheels in {}; expected one", wheels.len(), dir.display()),
    }
}

/// The wheel's file names (`python -m zipfile -l`).
fn list_wheel(python: &str, wheel: &Path) -> Result<String> {
    let out = Cmd::new(python)
        .args(["-m", "zipfile", "-l"])
        .arg(wheel.display().to_string())
        .quiet()
        .timeout(Duration::from_secs(60))
        .run_checked()
        .with_context(|| format!("listing {}", wheel.display()))?;
    Ok(out.stdout)
}

/// The kernel files `names` that the wheel listing lacks under
/// `flash_pipeline/kernels/`. Pure.
pub fn missing_kernels(listing: &str, names: &[String]) -> Vec<String> {
    let present: std::collections::BTreeSet<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|p| p.strip_prefix("flash_pipeline/kernels/"))
        .collect();
    names.iter().filter(|n| !present.contains(n.as_str())).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wheel_without_every_kernel_file_is_named() {
        let listing = "File Name    Modified    Size\n\
                       flash_pipeline/__init__.py 2026-11-28 00:00:00 10\n\
                       flash_pipeline/kernels/manifest.json 2026-11-28 00:00:00 10\n\
                       flash_pipeline/kernels/flash_fwd_f16.sm_90.fatbin 2026-11-28 00:00:00 10\n";
        let names = ["manifest.json", "flash_fwd_f16.sm_90.fatbin", "kernel-set.json"].map(String::from);
        assert_eq!(missing_kernels(listing, &names), ["kernel-set.json"]);
        assert!(missing_kernels(listing, &names[..2]).is_empty());
    }

    #[test]
    fn the_copy_takes_exactly_the_recorded_files_and_refuses_a_changed_one() {
        let d = tempfile::tempdir().unwrap();
        let (from, into) = (d.path().join("k"), d.path().join("pkg/kernels"));
        std::fs::create_dir_all(&from).unwrap();
        std::fs::write(from.join("a.fatbin"), b"a").unwrap();
        std::fs::write(from.join("stray.log"), b"log").unwrap();
        let mut set = KernelSet { sources: "s".into(), defines: vec![], files: Default::default() };
        set.files.insert("a.fatbin".into(), kernel_set::sha256_hex(b"a"));
        std::fs::write(from.join(kernel_set::FILE), serde_json::to_string(&set).unwrap()).unwrap();
        std::fs::create_dir_all(&into).unwrap();
        std::fs::write(into.join("old.fatbin"), b"old").unwrap();
        let names = copy_set(&from, &set, &into).unwrap();
        assert_eq!(names, ["a.fatbin", kernel_set::FILE]);
        assert!(!into.join("old.fatbin").exists() && !into.join("stray.log").exists());
        std::fs::write(from.join("a.fatbin"), b"changed").unwrap();
        assert!(format!("{:#}", copy_set(&from, &set, &into).unwrap_err()).contains("changed after the build"));
    }
}
