//! The kernel-ffi binaries xtask drives (fa-test, fa-run, …). Under cargo they are
//! built first; otherwise (a GPU machine without Rust) they must sit next to
//! xtask's own executable.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::paths::Paths;
use crate::process::Cmd;

pub fn binary(paths: &Paths, name: &str) -> Result<PathBuf> {
    let dir = if let Some(cargo) = std::env::var_os("CARGO") {
        Cmd::new(cargo)
            .args(["build", "--locked", "--release", "--quiet", "-p", "kernel-ffi", "--bins"])
            .cwd(&paths.root)
            .timeout(Duration::from_secs(1800))
            .run_checked()
            .context("building the kernel-ffi binaries")?;
        paths.target.join("release")
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
