//! `cargo xtask test`: the correctness matrix on the GPU, run by kernel-ffi's
//! `fa-test` driver, reported as `target/xtask/test.json` and a table.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::errors::{CannotRun, CheckFailed};
use crate::paths::Paths;
use crate::report::{Device, Envelope, Toolchain};
use crate::schema::{TestCase, TestRun};
use crate::table;
use crate::tools::drivers;
use crate::tools::process::Cmd;

#[derive(Clone)]
pub struct Options {
    pub filter: Option<String>,
    pub timeout: Duration,
}

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("test")?;
    let raw = paths.reports().join("fa-test.json");
    let _ = std::fs::remove_file(&raw);
    let out = command(drivers::binary(paths, "fa-test")?, paths, opts, &raw).run()?;
    let text = match std::fs::read_to_string(&raw) {
        Ok(text) if out.success() || out.status.code() == Some(1) => text, // 1: cases failed
        _ => {
            return Err(CannotRun(format!(
                "fa-test exited with {} and wrote no results; last output:\n{}",
                out.status,
                out.tail()
            ))
            .into());
        }
    };
    let run: TestRun = serde_json::from_str(&text).with_context(|| format!("parsing {}", raw.display()))?;
    let failed: Vec<&TestCase> = run.cases.iter().filter(|c| !c.passed).collect();
    crate::tools::process::table(&paths.reports().join("test.txt"), &case_table(run.cases.iter()))?;
    if !failed.is_empty() && !crate::tools::process::detail() {
        println!("{}", case_table(failed.iter().copied()));
    }
    let device = Device::from(&run.device);
    let toolchain = Toolchain { driver: run.device.driver.clone(), ..Toolchain::default() };
    let report = paths.report("test");
    Envelope::new("test", toolchain, Some(device), &run).kernels(&paths.kernels).write(&report)?;
    println!("{} cases, {} failed, seed {}; report: {}", run.cases.len(), failed.len(), run.seed, report.display());
    if run.cases.is_empty() {
        return Err(CheckFailed("no test case ran (filter matched nothing?)".into()).into());
    }
    if !failed.is_empty() {
        let names: Vec<&str> = failed.iter().take(10).map(|c| c.name.as_str()).collect();
        return Err(CheckFailed(format!("{} case(s) failed: {}", failed.len(), names.join(", "))).into());
    }
    Ok(())
}

/// fa-test over the run's kernel set, writing its results to `raw`.
fn command(driver: PathBuf, paths: &Paths, opts: &Options, raw: &Path) -> Cmd {
    let mut cmd = Cmd::new(driver)
        .arg("--json")
        .arg(raw.display().to_string())
        .env("FA_KERNEL_DIR", paths.kernels_out().display().to_string())
        .timeout(opts.timeout)
        .log(paths.reports().join("test.log"))
        .echo();
    if let Some(f) = &opts.filter {
        cmd = cmd.arg("--filter").arg(f.clone());
    }
    cmd
}

fn case_table<'a>(cases: impl Iterator<Item = &'a TestCase>) -> String {
    let rows: Vec<Vec<String>> = cases
        .map(|c| {
            vec![
                c.name.clone(),
                c.num_splits.to_string(),
                c.reference.clone(),
                format!("{:.2e}", c.rel_l2),
                format!("{:.2e}", c.max_abs),
                format!("{:.1e}/{:.1e}", c.tol_rel_l2, c.tol_max_abs),
                if c.passed { "ok".into() } else { c.error.clone().unwrap_or_else(|| "FAIL".into()) },
            ]
        })
        .collect();
    table::render(&["case", "splits", "reference", "rel L2", "max abs", "tol", "result"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fa_test_loads_the_kernel_set_the_user_named() {
        let mut paths = Paths::discover().unwrap();
        paths.kernels = PathBuf::from("/elsewhere/kernels");
        let opts = Options { filter: None, timeout: Duration::from_secs(1) };
        let cmd = command(PathBuf::from("fa-test"), &paths, &opts, Path::new("raw.json"));
        assert_eq!(cmd.env_value("FA_KERNEL_DIR"), Some("/elsewhere/kernels"));
    }
}
