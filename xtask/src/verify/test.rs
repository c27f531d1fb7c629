//! `cargo xtask test`: the correctness matrix on the GPU, run by kernel-ffi's
//! `fa-test` driver, reported as `target/xtask/test.json` and a table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::errors::{CannotRun, CheckFailed};
use crate::paths::Paths;
use crate::report::{Device, Envelope, Toolchain};
use crate::schema::{TestCase, TestRun};
use crate::table;
use crate::tools::drivers;
use crate::tools::process::Cmd;
use crate::tools::progress::Progress;

#[derive(Clone)]
pub struct Options {
    pub filter: Option<String>,
    pub timeout: Duration,
}

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("test")?;
    let raw = paths.reports().join("fa-test.json");
    let _ = std::fs::remove_file(&raw);
    let driver = drivers::binary(paths, "fa-test")?;
    let (progress, hook) = case_progress("test");
    let out = command(driver, paths, opts, &raw).on_line(hook).run()?;
    drop(progress);
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

/// A progress bar fed by fa-test's stderr: `fa-test: N cases on …` sets the
/// total, each `[i/N] ok|FAIL …` line is one case (a failing one shown in full).
pub fn case_progress(label: &str) -> (Arc<Progress>, impl Fn(&str) + Send + Sync + 'static) {
    let progress = Arc::new(Progress::bar(label, 0));
    let feed = progress.clone();
    let hook = move |line: &str| match fa_test_line(line) {
        Some(FaTestLine::Cases(n)) => feed.set_total(n),
        Some(FaTestLine::Case { passed: true }) => feed.item(line),
        Some(FaTestLine::Case { passed: false }) => feed.report(line),
        None => {}
    };
    (progress, hook)
}

#[derive(Debug, PartialEq, Eq)]
enum FaTestLine {
    Cases(u64),
    Case { passed: bool },
}

/// fa-test's progress lines on stderr, as its `main` writes them.
fn fa_test_line(line: &str) -> Option<FaTestLine> {
    if let Some(rest) = line.strip_prefix("fa-test: ") {
        let (n, tail) = rest.split_once(' ')?;
        return tail.starts_with("cases on ").then_some(FaTestLine::Cases(n.parse().ok()?));
    }
    let (count, rest) = line.strip_prefix('[')?.split_once("] ")?;
    let (i, n) = count.split_once('/')?;
    i.parse::<u64>().ok()?;
    n.parse::<u64>().ok()?;
    match rest.split(' ').next()? {
        "ok" => Some(FaTestLine::Case { passed: true }),
        "FAIL" => Some(FaTestLine::Case { passed: false }),
        _ => None,
    }
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
    fn fa_test_progress_lines_are_read_as_it_writes_them() {
        assert_eq!(
            fa_test_line("fa-test: 114 cases on NVIDIA H100 80GB HBM3 (sm count 132), seed 7"),
            Some(FaTestLine::Cases(114))
        );
        assert_eq!(
            fa_test_line("[3/114] ok f16-b1-h1-s128-d64 rel_l2 1.2e-3 max_abs 2.0e-3"),
            Some(FaTestLine::Case { passed: true })
        );
        assert_eq!(
            fa_test_line("[4/114] FAIL f16-b1 rel_l2 NaN max_abs NaN"),
            Some(FaTestLine::Case { passed: false })
        );
        for other in
            ["fa-test: 1.5 s", "fa-test: stopping after a CUDA error", "[x/2] ok", "[1/2]ok", "", "[", "[1/2] maybe"]
        {
            assert_eq!(fa_test_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn fa_test_loads_the_kernel_set_the_user_named() {
        let mut paths = Paths::discover().unwrap();
        paths.kernels = PathBuf::from("/elsewhere/kernels");
        let opts = Options { filter: None, timeout: Duration::from_secs(1) };
        let cmd = command(PathBuf::from("fa-test"), &paths, &opts, Path::new("raw.json"));
        assert_eq!(cmd.env_value("FA_KERNEL_DIR"), Some("/elsewhere/kernels"));
    }
}
