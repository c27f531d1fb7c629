//! `cargo xtask test`: the correctness matrix on the GPU, run by kernel-ffi's
//! `fa-test` driver, reported as `target/xtask/test.json` and a table.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::errors::{CannotRun, CheckFailed};
use crate::report::{Device, Envelope, Toolchain, read_json};
use crate::run::Run;
use crate::table;
use crate::tools::deal::{START_CHECK, Step, busy_lines, deal};
use crate::tools::drivers;
use crate::tools::gpu::ListedGpu;
use crate::tools::gpu::{self, GpuSpec};
use crate::tools::process::{Cmd, write_file};
use crate::tools::progress::Progress;
use crate::verify::spread::{self, Shard, ShardRecord};
use fa_schema::schema::{DeviceInfo, ListedCase, TestCase, TestRun};

#[derive(Clone)]
pub struct Options {
    pub filter: Option<String>,
    pub timeout: Duration,
    /// `--gpus all|N|LIST`: one worker per GPU.
    pub gpus: Option<GpuSpec>,
    /// `--shard I/N`: only this part of the matrix.
    pub shard: Option<Shard>,
}

/// `test.json`'s payload: fa-test's run, and how it was spread where it was.
#[derive(Debug, Serialize, Deserialize)]
pub struct TestReport {
    #[serde(flatten)]
    pub run: TestRun,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardRecord>,
    /// The GPUs the cases were dealt to (each case names its own), where several were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<DeviceInfo>,
    /// Each worker's start check and batches in time, where the run was spread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<Step>,
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("test")?;
    let raw = cx.reports().join("fa-test.json");
    let _ = std::fs::remove_file(&raw);
    let driver = drivers::binary(cx, "fa-test")?;
    let report = if opts.gpus.is_none() && opts.shard.is_none() {
        TestReport { run: run_whole(cx, opts, driver, &raw)?, shard: None, gpus: Vec::new(), timeline: Vec::new() }
    } else {
        let report = run_spread(cx, opts, &driver, &gpu::workers(opts.gpus.as_ref(), cx.device.as_deref(), "test")?)?;
        write_file(&raw, serde_json::to_string_pretty(&report.run)?)?;
        report
    };
    finish(cx, report)
}

/// The matrix in one fa-test process on one GPU.
fn run_whole(cx: &Run, opts: &Options, driver: PathBuf, raw: &Path) -> Result<TestRun> {
    let (progress, hook) = case_progress("test", None);
    let out = command(driver, cx, opts, raw).on_line(hook).run()?;
    drop(progress);
    let text = match fa_schema::file::read_text(raw) {
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
    serde_json::from_str(&text).with_context(|| format!("parsing {}", raw.display()))
}

/// Tables, `test.json`, and the verdict.
pub fn finish(cx: &Run, report: TestReport) -> Result<()> {
    let run = &report.run;
    let failed: Vec<&TestCase> = run.cases.iter().filter(|c| !c.passed).collect();
    crate::tools::process::table(&cx.reports().join("test.txt"), &case_table(run.cases.iter()))?;
    if !failed.is_empty() && !crate::tools::process::detail() {
        println!("{}", case_table(failed.iter().copied()));
    }
    let device = Device::from(&run.device);
    let toolchain = Toolchain { driver: run.device.driver.clone(), ..Toolchain::default() };
    let path = cx.report("test");
    Envelope::new("test", crate::tools::process::git_state(&cx.root), toolchain, Some(device), &report)
        .kernels(crate::compile::kernel_set::reported(&cx.kernels))
        .write(&path)?;
    let spread = match (&report.shard, report.gpus.len()) {
        (Some(s), _) => format!(" (shard {}/{})", s.shard.index, s.shard.count),
        (None, n) if n > 1 => format!(" on {n} GPUs"),
        _ => String::new(),
    };
    for line in busy_lines(&report.timeline) {
        println!("  {line}");
    }
    if !run.skipped.is_empty() {
        let why: std::collections::BTreeSet<&str> = run.skipped.iter().map(|s| s.why.as_str()).collect();
        let why: Vec<&str> = why.into_iter().collect();
        println!("{} cases not run here ({}); they are listed in the report", run.skipped.len(), why.join("; "));
    }
    println!(
        "{} cases{spread}, {} failed, seed {}; report: {}",
        run.cases.len(),
        failed.len(),
        run.seed,
        path.display()
    );
    if run.cases.is_empty() && report.shard.as_ref().is_none_or(|s| !s.assigned.is_empty()) {
        return Err(CheckFailed("no test case ran (filter matched nothing?)".into()).into());
    }
    all_passed(&run.cases)
}

/// A `CheckFailed` naming the first ten failed cases, if any failed.
fn all_passed(cases: &[TestCase]) -> Result<()> {
    let failed: Vec<&str> = cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let more = if failed.len() > 10 { ", …" } else { "" };
    let first = failed[..failed.len().min(10)].join(", ");
    Err(CheckFailed(format!("{} case(s) failed: {first}{more}", failed.len())).into())
}

/// The matrix (or this shard of it) dealt out in batches, longest first, to one
/// worker per GPU. A worker whose fa-test dies, hangs or writes no results
/// retires; its batch's cases are reported failed, never dropped, and the other
/// workers take the rest.
fn run_spread(cx: &Run, opts: &Options, driver: &Path, gpus: &[Option<ListedGpu>]) -> Result<TestReport> {
    let dir = cx.reports().join("test-spread");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let listed = list_cases(driver, (&cx.kernels, cx.device.as_deref()), &dir, &[], opts.filter.as_deref())?;
    let (mine, shard) = take_shard(&listed, opts.shard);
    let batches = if gpus.len() == 1 {
        vec![mine.iter().map(|c| c.name.clone()).collect()]
    } else {
        spread::batches(&mine, gpus.len())
    };
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    let (progress, hook) = case_progress("test", Some(mine.len() as u64));
    let hook = Arc::new(hook);
    let devices: Mutex<Vec<DeviceInfo>> = Mutex::new(Vec::new());
    let dealt = deal(
        "batch",
        gpus,
        batches,
        |g| {
            // Preflight of this GPU: the driver opens it and loads the kernels.
            let d = drivers::check_gpu(driver, &cx.kernels, g)?;
            devices.lock().unwrap_or_else(|e| e.into_inner()).push(d);
            Ok(())
        },
        |k, names, gpu| run_batch(cx, opts, driver, &dir, k, names, gpu, hook.clone()),
        |what| progress.println(&format!("test: {what}")),
    );
    drop(progress);
    let Some(first) = dealt.done.first().map(|(_, r)| r.clone()) else {
        let why: Vec<String> = dealt.lost.iter().map(|l| format!("batch {}: {}", l.index, l.why)).collect();
        return Err(CannotRun(format!("no batch of cases ran: {}", why.join("; "))).into());
    };
    let setup: std::collections::HashMap<usize, f64> = dealt.done.iter().map(|(k, r)| (*k, r.setup_s)).collect();
    let timeline = dealt
        .spans
        .iter()
        .map(|s| match s.item {
            None => s.step(START_CHECK, None),
            Some(k) => s.step(format!("batch {k}, {} cases", sizes[k]), setup.get(&k).copied()),
        })
        .collect();
    let mut cases: Vec<TestCase> = Vec::new();
    let mut skipped = Vec::new();
    for (_, run) in dealt.done {
        let uuid = run.device.uuid.clone();
        cases.extend(run.cases.into_iter().map(|c| TestCase { gpu: uuid.clone(), ..c }));
        skipped.extend(run.skipped);
    }
    for l in dealt.lost {
        cases.extend(l.item.into_iter().map(|name| lost_case(name, l.gpu.clone(), &l.why)));
    }
    let order: std::collections::HashMap<&str, usize> =
        listed.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
    cases.sort_by_key(|c| order.get(c.name.as_str()).copied().unwrap_or(usize::MAX));
    skipped.sort_by_key(|c| order.get(c.name.as_str()).copied().unwrap_or(usize::MAX));
    let mut devices = devices.into_inner().unwrap_or_else(|e| e.into_inner());
    devices.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    Ok(TestReport { run: TestRun { cases, skipped, ..first }, shard, gpus: devices, timeline })
}

/// The cases fa-test runs on this machine's GPU with the kernels in `kernels`
/// (`--list --runnable --json`, with `args` choosing the set), written to
/// `dir/cases.json`.
pub fn list_cases(
    driver: &Path,
    (kernels, device): (&Path, Option<&str>),
    dir: &Path,
    args: &[&str],
    filter: Option<&str>,
) -> Result<Vec<ListedCase>> {
    let list = dir.join("cases.json");
    let mut cmd = Cmd::new(driver)
        .args(args.iter().copied())
        .args(["--list", "--runnable", "--json"])
        .arg(list.display().to_string());
    if let Some(f) = filter {
        cmd = cmd.arg("--filter").arg(f);
    }
    drivers::aim(cmd, kernels, device).quiet().run_checked().context("listing the cases")?;
    read_json(&list)
}

/// This shard's cases (all of them without `--shard`) and the record merge checks.
pub fn take_shard(listed: &[ListedCase], shard: Option<Shard>) -> (Vec<ListedCase>, Option<ShardRecord>) {
    let Some(s) = shard else { return (listed.to_vec(), None) };
    let assigned = spread::partition(listed, s.count).swap_remove(s.index as usize - 1);
    let mut universe: Vec<String> = listed.iter().map(|c| c.name.clone()).collect();
    universe.sort();
    let mine = listed.iter().filter(|c| assigned.contains(&c.name)).cloned().collect();
    (mine, Some(ShardRecord { shard: s, universe, assigned }))
}

/// One batch in one fa-test process: its results, or why there are none.
#[allow(clippy::too_many_arguments)]
fn run_batch(
    cx: &Run,
    opts: &Options,
    driver: &Path,
    dir: &Path,
    k: usize,
    names: &[String],
    gpu: Option<&ListedGpu>,
    hook: Arc<impl Fn(&str) + Send + Sync + 'static>,
) -> std::result::Result<TestRun, String> {
    let (list, json) = (dir.join(format!("batch-{k}.txt")), dir.join(format!("batch-{k}.json")));
    write_file(&list, names.join("\n") + "\n").map_err(|e| format!("{e:#}"))?;
    let cmd = command(driver.to_path_buf(), cx, opts, &json)
        .arg("--cases")
        .arg(list.display().to_string())
        .log(dir.join(format!("batch-{k}.log")))
        .on_line(move |line| hook(line));
    let out = drivers::on_gpu(cmd, gpu).run().map_err(|e| format!("{e:#}"))?;
    let run = fa_schema::file::read_text(&json).ok().and_then(|t| serde_json::from_str::<TestRun>(&t).ok());
    match run {
        Some(run) if out.success() || out.status.code() == Some(1) => account(names, run),
        _ => Err(format!("fa-test exited with {} and wrote no results: {}", out.status, out.tail().trim())),
    }
}

/// A batch's results against the names it was given: a case fa-test left out
/// without saying why is reported failed, never dropped; one it says it skipped
/// (an entry this kernel set lacks) is neither; a case it was not given, or gave
/// twice, makes the whole batch untrustworthy.
fn account(names: &[String], mut run: TestRun) -> std::result::Result<TestRun, String> {
    let mut seen = std::collections::BTreeSet::new();
    let reported = run.cases.iter().map(|c| &c.name).chain(run.skipped.iter().map(|s| &s.name));
    for name in reported {
        if !names.contains(name) {
            return Err(format!("fa-test reported case {name}, which it was not given"));
        }
        if !seen.insert(name.clone()) {
            return Err(format!("fa-test reported case {name} twice"));
        }
    }
    let gpu = run.device.uuid.clone();
    for name in names.iter().filter(|n| !seen.contains(*n)) {
        run.cases.push(lost_case(name.clone(), gpu.clone(), "fa-test returned no result for it"));
    }
    Ok(run)
}

/// `cargo xtask report merge`: shard reports (`test.json` of each `--shard I/N`
/// run) into one report at `out`, failing on a missing or repeated shard or case.
pub fn merge(cx: &Run, files: &[PathBuf], out: Option<&Path>) -> Result<()> {
    let mut parts: Vec<Envelope<TestReport>> = Vec::new();
    for f in files {
        let env: Envelope<TestReport> =
            read_json(f).with_context(|| format!("reading the shard report {}", f.display()))?;
        if env.kind != "test" {
            return Err(
                CannotRun(format!("{} is a `{}` report; merge takes test reports", f.display(), env.kind)).into()
            );
        }
        parts.push(env);
    }
    let mut records = Vec::new();
    for (f, p) in files.iter().zip(&parts) {
        let rec = p.payload.shard.clone().ok_or_else(|| {
            CannotRun(format!("{} is not a shard's report (it was run without --shard)", f.display()))
        })?;
        records.push((rec, p.payload.run.cases.iter().map(|c| c.name.clone()).collect()));
    }
    spread::check_parts(&records).map_err(|e| CheckFailed(format!("the shard reports do not join: {e}")))?;
    parts.sort_by_key(|p| p.payload.shard.as_ref().map_or(0, |s| s.shard.index));
    let mut it = parts.into_iter();
    let Some(mut merged) = it.next() else { return Err(CannotRun("no shard reports to merge".into()).into()) };
    for p in it {
        merged.payload.run.cases.extend(p.payload.run.cases);
        merged.payload.gpus.extend(p.payload.gpus);
    }
    merged.payload.shard = None;
    let path = out.map_or_else(|| cx.report("test"), Path::to_path_buf);
    let run = &merged.payload.run;
    let failed = run.cases.iter().filter(|c| !c.passed).count();
    merged.write(&path)?;
    println!("{} shards, {} cases, {failed} failed; report: {}", files.len(), run.cases.len(), path.display());
    all_passed(&run.cases)
}

/// The record of a case a lost batch held: failed, with the reason.
fn lost_case(name: String, gpu: Option<String>, why: &str) -> TestCase {
    TestCase {
        name,
        gpu,
        rel_l2: f64::NAN,
        max_abs: f64::NAN,
        lse_max_abs: f64::NAN,
        passed: false,
        error: Some(format!("not run: {why}")),
        ..TestCase::default()
    }
}

/// A progress bar fed by fa-test's stderr: `fa-test: N cases on …` sets the
/// total, each `[i/N] ok|FAIL …` line is one case (a failing one shown in full).
/// Where `total` is given (a run over several processes), it stands.
pub fn case_progress(label: &str, total: Option<u64>) -> (Arc<Progress>, impl Fn(&str) + Send + Sync + 'static) {
    let progress = Arc::new(Progress::bar(label, total.unwrap_or(0)));
    let feed = progress.clone();
    let hook = move |line: &str| match fa_test_line(line) {
        Some(FaTestLine::Cases(n)) if total.is_none() => feed.set_total(n),
        Some(FaTestLine::Cases(_)) => {}
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
fn command(driver: PathBuf, cx: &Run, opts: &Options, raw: &Path) -> Cmd {
    let cmd = Cmd::new(driver).arg("--json").arg(raw.display().to_string());
    let mut cmd = drivers::aim(cmd, &cx.kernels, cx.device.as_deref())
        .timeout(opts.timeout)
        .log(cx.reports().join("test.log"))
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

    fn fake(dir: &Path) -> (Run, PathBuf) {
        let target = dir.join("target");
        let cx = Run {
            root: dir.to_path_buf(),
            cuda_wheels: target.join("cuda"),
            kernels: dir.join("k"),
            target,
            device: None,
        };
        (cx, Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fake-fa-test.py"))
    }

    pub(super) fn opts(shard: Option<&str>) -> Options {
        Options { filter: None, timeout: Duration::from_secs(60), gpus: None, shard: shard.map(|s| s.parse().unwrap()) }
    }

    fn gpu(uuid: &str) -> Option<ListedGpu> {
        Some(ListedGpu { name: "Fake GPU".into(), uuid: uuid.into() })
    }

    /// The fake driver's matrix: c0…c9 with work 10…1.
    fn listed_fake() -> Vec<ListedCase> {
        (0..10).map(|i| ListedCase { name: format!("c{i}"), work: f64::from(10 - i) }).collect()
    }

    fn names(r: &TestReport) -> Vec<String> {
        r.run.cases.iter().map(|c| c.name.clone()).collect()
    }

    #[test]
    fn spread_runs_keep_every_case_once_in_matrix_order_with_its_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        let all: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
        let two = run_spread(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(names(&two), all);
        assert!(
            two.run.cases.iter().all(|c| c.passed && c.gpu.as_deref().is_some_and(|g| g == "GPU-a" || g == "GPU-b"))
        );
        assert_eq!(two.gpus.len(), 2);
        // The timeline: both start checks, then every batch once with fa-test's set-up time.
        assert_eq!(two.timeline.iter().filter(|s| s.what == START_CHECK).count(), 2);
        let batches: Vec<&Step> = two.timeline.iter().filter(|s| s.what.starts_with("batch ")).collect();
        assert_eq!(batches.len(), spread::batches(&listed_fake(), 2).len());
        assert!(batches.iter().all(|s| s.setup_s == Some(0.25) && s.start_s <= s.end_s), "{batches:?}");
        assert_eq!(busy_lines(&two.timeline).len(), 2);
        // Shards on one GPU each: their union is the matrix, and they merge.
        let mut files = Vec::new();
        for i in 1..=3 {
            let part = run_spread(&cx, &opts(Some(&format!("{i}/3"))), &driver, &[None]).unwrap();
            let file = dir.path().join(format!("shard-{i}.json"));
            Envelope::new("test", crate::tools::process::git_state(&cx.root), Toolchain::default(), None, &part)
                .write(&file)
                .unwrap();
            files.push(file);
        }
        let out = dir.path().join("merged.json");
        merge(&cx, &files, Some(&out)).unwrap();
        let merged: Envelope<TestReport> = read_json(&out).unwrap();
        let mut got = names(&merged.payload);
        got.sort();
        let mut want = all.clone();
        want.sort();
        assert_eq!(got, want);
        assert!(merged.payload.shard.is_none());
        let gap = merge(&cx, &files[..2], Some(&out)).unwrap_err().to_string();
        assert!(gap.contains("missing shard report(s): 3/3"), "{gap}");
        let twice = merge(&cx, &[files[0].clone(), files[0].clone()], Some(&out)).unwrap_err().to_string();
        assert!(twice.contains("appears twice"), "{twice}");
    }

    #[test]
    fn a_worker_that_dies_is_reported_and_its_cases_are_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        write_file(&cx.kernels.join("die"), "c0").unwrap();
        let r = run_spread(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(r.run.cases.len(), 10, "every case is reported");
        let c0 = r.run.cases.iter().find(|c| c.name == "c0").unwrap();
        assert!(!c0.passed && c0.error.as_deref().is_some_and(|e| e.starts_with("not run:")), "{c0:?}");
        assert!(c0.rel_l2.is_nan());
        // c0's batch (the two longest cases) is lost with it; the other worker ran the rest.
        let failed: Vec<&str> = r.run.cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["c0", "c1"]);
    }

    #[test]
    fn a_batch_that_returns_fewer_cases_reports_the_rest_failed() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        write_file(&cx.kernels.join("drop"), "c3,c7").unwrap();
        let r = run_spread(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(r.run.cases.len(), 10, "every case is reported");
        let failed: Vec<&str> = r.run.cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["c3", "c7"]);
        let c3 = &r.run.cases[3];
        assert!(c3.error.as_deref().is_some_and(|e| e.contains("returned no result")), "{c3:?}");
        assert!(finish(&cx, r).is_err(), "a run with unreported cases fails");
    }

    #[test]
    fn cases_the_driver_skips_are_recorded_not_failed() {
        // Cases for entries the kernel set lacks are in the matrix; the driver
        // skips them and says why. They were reported failed ("returned no
        // result"): 4116 of 5662 on two H200s.
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        write_file(&cx.kernels.join("skip"), "c2,c5").unwrap();
        let r = run_spread(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(r.run.cases.len(), 8);
        assert!(r.run.cases.iter().all(|c| c.passed));
        let skipped: Vec<&str> = r.run.skipped.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(skipped, ["c2", "c5"]);
        assert!(finish(&cx, r).is_ok());
    }

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
        let mut cx = Run::discover().unwrap();
        cx.kernels = PathBuf::from("/elsewhere/kernels");
        let opts = Options { timeout: Duration::from_secs(1), ..super::tests::opts(None) };
        let cmd = command(PathBuf::from("fa-test"), &cx, &opts, Path::new("raw.json"));
        assert_eq!(cmd.env_value("FA_KERNEL_DIR"), Some("/elsewhere/kernels"));
    }
}
