//! `cargo xtask test`: the correctness matrix on the GPU, run by kernel-ffi's
//! `fa-test` driver, reported as `target/xtask/test.json` and a table.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::errors::{CannotRun, CheckFailed};
use crate::report::{Device, Envelope, Toolchain, read_json};
use crate::run::Run;
use crate::table;
use crate::tools::deal::{self, START_CHECK, Step, busy_lines, deal};
use crate::tools::drivers;
use crate::tools::gpu::ListedGpu;
use crate::tools::gpu::{self, GpuSpec};
use crate::tools::process::{Cmd, Session, write_file};
use crate::tools::progress::Progress;
use crate::verify::spread::{self, Shard, ShardRecord};
use fa_schema::schema::{DeviceInfo, ListedCase, SkippedCase, TestCase, TestRun, WorkerReply};

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
    /// Each worker's start and cases in time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<Step>,
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("test")?;
    let raw = cx.reports().join("fa-test.json");
    let _ = std::fs::remove_file(&raw);
    let driver = drivers::binary(cx, "fa-test")?;
    let report = run_workers(cx, opts, &driver, &gpu::workers(opts.gpus.as_ref(), cx.device.as_deref(), "test")?)?;
    write_file(&raw, serde_json::to_string_pretty(&report.run)?)?;
    finish(cx, report)
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
    if !report.gpus.is_empty() {
        for line in busy_lines(&report.timeline) {
            println!("  {line}");
        }
    }
    if !run.skipped.is_empty() {
        let why: std::collections::BTreeSet<&str> = run.skipped.iter().map(|s| s.why.as_str()).collect();
        let why: Vec<&str> = why.into_iter().collect();
        println!("{} cases skipped, each listed in the report: {}", run.skipped.len(), why.join("; "));
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

/// The matrix (or this shard of it) dealt case by case, longest first, to one
/// `fa-test --worker` per GPU (one on the default GPU without `--gpus`), so the
/// GPUs finish together and each process sets up once. A case whose worker
/// dies or hangs on it is reported failed, and the worker starts a new process
/// for the rest; a worker that cannot is retired, and the others take the rest. Every worker draws a case's inputs
/// from the run's seed and the case's name, so `fa-test --seed S --filter NAME`
/// reproduces any case.
fn run_workers(cx: &Run, opts: &Options, driver: &Path, gpus: &[Option<ListedGpu>]) -> Result<TestReport> {
    let dir = cx.reports().join("test-workers");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let listed = list_cases(driver, &dir, &[], opts.filter.as_deref())?;
    let (mine, shard) = take_shard(&listed, opts.shard);
    let queue: Vec<String> = spread::longest_first(&mine).into_iter().map(|c| c.name.clone()).collect();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let progress = Progress::bar("test", mine.len() as u64);
    let spawn = Spawner {
        cx,
        opts,
        driver,
        dir: &dir,
        seed,
        deadline: Instant::now() + opts.timeout,
        // The CPU reference's threads: this machine's cores shared by the workers.
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(gpus.len().max(1)),
        started: Default::default(),
        spawned: Default::default(),
    };
    let dealt = deal(
        "case",
        gpus,
        queue.clone(),
        |gpu| spawn.start(gpu),
        |w, _, name, gpu| {
            let outcome = spawn.ask(w, name, gpu)?;
            match &outcome {
                Outcome::Ran(c) if c.passed => progress.item(&format!("ok {}", c.name)),
                Outcome::Ran(c) => progress.report(&format!(
                    "FAIL {} rel_l2 {:.2e} max_abs {:.2e}{}",
                    c.name,
                    c.rel_l2,
                    c.max_abs,
                    c.error.as_deref().map(|e| format!(" error: {e}")).unwrap_or_default()
                )),
                Outcome::Skipped(s) => progress.item(&format!("skipped {}", s.name)),
            }
            Ok(outcome)
        },
        |what| progress.println(&format!("test: {what}")),
    );
    drop(progress);
    let started = spawn.started.into_inner().unwrap_or_else(|e| e.into_inner());
    let Some(first) = started.first().map(|(_, ready)| ready.clone()) else {
        return Err(CannotRun(format!("no fa-test worker started: {}", dealt.not_started.join("; "))).into());
    };
    // A worker's start check is its first process's start; its set-up, that process's.
    let mut setup: std::collections::HashMap<Option<String>, f64> = Default::default();
    for (gpu, r) in &started {
        setup.entry(gpu.clone()).or_insert(r.setup_s);
    }
    // Skipped cases take no time worth a row.
    let skips: std::collections::HashSet<usize> =
        dealt.done.iter().filter(|(_, o)| matches!(o, Outcome::Skipped(_))).map(|(i, _)| *i).collect();
    let timeline: Vec<Step> = dealt
        .spans
        .iter()
        .filter_map(|span| match span.item {
            None => Some(span.step(START_CHECK, setup.get(&span.gpu).copied())),
            Some(i) if skips.contains(&i) => None,
            Some(i) => Some(span.step(queue[i].clone(), None)),
        })
        .collect();
    let mut cases: Vec<TestCase> = Vec::new();
    let mut skipped = Vec::new();
    for (_, o) in dealt.done {
        match o {
            Outcome::Ran(c) => cases.push(*c),
            Outcome::Skipped(s) => skipped.push(s),
        }
    }
    for l in dealt.lost {
        cases.push(lost_case(l.item, l.gpu, &l.why));
    }
    let order: std::collections::HashMap<&str, usize> =
        listed.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
    cases.sort_by_key(|c| order.get(c.name.as_str()).copied().unwrap_or(usize::MAX));
    skipped.sort_by_key(|c| order.get(c.name.as_str()).copied().unwrap_or(usize::MAX));
    let mut devices: Vec<DeviceInfo> = started.into_iter().map(|(_, r)| r.device).collect();
    devices.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    devices.dedup_by(|a, b| a.uuid == b.uuid);
    if devices.len() < 2 {
        devices.clear(); // the run's device says it
    }
    let run = TestRun { device: first.device, seed, setup_s: first.setup_s, cases, skipped };
    Ok(TestReport { run, shard, gpus: devices, timeline })
}

/// What a worker did with a case.
enum Outcome {
    Ran(Box<TestCase>),
    Skipped(SkippedCase),
}

/// A worker's `fa-test --worker` process, while it has one.
struct Worker {
    session: Option<Session>,
    /// The UUID of the device the process opened, as it reported it.
    uuid: Option<String>,
    /// Processes in a row that died, hung or lost their context on a case.
    ended: u32,
    /// Why it takes no more cases.
    retired: Option<String>,
}

impl deal::Worker for Worker {
    fn retired(&self) -> Option<&str> {
        self.retired.as_deref()
    }
}

/// What fa-test says when it is ready.
#[derive(Clone)]
struct Ready {
    device: DeviceInfo,
    setup_s: f64,
}

/// Processes in a row that may end on their cases before a worker retires.
const MAX_ENDED: u32 = 4;
/// Most seconds one case may take: past it the case is a hang.
const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts workers' fa-test processes and asks them for cases.
struct Spawner<'a> {
    cx: &'a Run,
    opts: &'a Options,
    driver: &'a Path,
    dir: &'a Path,
    seed: u64,
    /// When the run's time (`--test-timeout`) is up.
    deadline: Instant,
    /// `fa-test --threads` of each worker.
    threads: usize,
    /// Every process started: its worker's GPU and what it said when ready.
    started: Mutex<Vec<(Option<String>, Ready)>>,
    /// Processes started so far, to name their logs.
    spawned: std::sync::atomic::AtomicUsize,
}

impl Spawner<'_> {
    fn start(&self, gpu: Option<&ListedGpu>) -> std::result::Result<Worker, String> {
        let (session, uuid) = self.spawn(gpu)?;
        Ok(Worker { session: Some(session), uuid, ended: 0, retired: None })
    }

    /// The command of a worker's process on `gpu`, logging to `log`.
    fn command(&self, gpu: Option<&ListedGpu>, log: PathBuf) -> Cmd {
        let cmd = Cmd::new(self.driver)
            .arg("--worker")
            .args(["--seed".to_string(), self.seed.to_string(), "--threads".into(), self.threads.to_string()])
            .log(log);
        let mut cmd = drivers::aim(cmd, &self.cx.kernels, self.cx.device.as_deref());
        if let Some(f) = &self.opts.filter {
            cmd = cmd.arg("--filter").arg(f.clone());
        }
        drivers::on_gpu(cmd, gpu)
    }

    /// A new process on `gpu`, once it says it is ready, and its device's UUID.
    fn spawn(&self, gpu: Option<&ListedGpu>) -> std::result::Result<(Session, Option<String>), String> {
        let k = self.spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut session =
            self.command(gpu, self.dir.join(format!("worker-{k}.log"))).session().map_err(|e| format!("{e:#}"))?;
        let ready = session
            .read_line(self.time_left()?.min(CASE_TIMEOUT))
            .map_err(|e| format!("{e:#}"))
            .and_then(|line| serde_json::from_str::<WorkerReply>(&line).map_err(|e| format!("`{line}`: {e}")))?;
        let WorkerReply::Ready { device, setup_s, .. } = ready else {
            return Err(format!("fa-test --worker began with {ready:?}, not ready"));
        };
        let uuid = device.uuid.clone();
        let ready = (gpu.map(|g| g.uuid.clone()), Ready { device, setup_s });
        self.started.lock().unwrap_or_else(|e| e.into_inner()).push(ready);
        Ok((session, uuid))
    }

    /// What is left of the run's time, or why none is.
    fn time_left(&self) -> std::result::Result<Duration, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("the run's {} s (--test-timeout) are up", self.opts.timeout.as_secs()));
        }
        Ok(left)
    }

    /// `name` run by `w`'s process. A case the process dies or hangs on is
    /// failed, and the worker goes on with a new process (the old one killed
    /// first, so it holds no GPU memory); it retires, keeping that result, when
    /// the new one cannot start, processes keep ending, or the run's time is up.
    fn ask(&self, w: &mut Worker, name: &str, gpu: Option<&ListedGpu>) -> std::result::Result<Outcome, String> {
        let uuid = w.uuid.clone();
        let timeout = self.time_left()?.min(CASE_TIMEOUT);
        let session = w.session.as_mut().ok_or("the worker has no fa-test process")?;
        let reply = session.request(name, timeout).map_err(|e| format!("{e:#}")).and_then(|line| {
            serde_json::from_str::<WorkerReply>(&line).map_err(|e| format!("fa-test answered `{line}`: {e}"))
        });
        let failed = |why: &str| Outcome::Ran(Box::new(lost_case(name.into(), uuid.clone(), why)));
        let (outcome, ended) = match reply {
            Ok(WorkerReply::Ran { case, last }) if case.name == name => {
                (Outcome::Ran(Box::new(TestCase { gpu: uuid.clone(), ..*case })), last)
            }
            Ok(WorkerReply::Skipped { case }) if case.name == name => (Outcome::Skipped(case), false),
            Ok(WorkerReply::Unknown { .. }) => (failed("fa-test's matrix has no such case"), false),
            Ok(other) => (failed(&format!("fa-test answered {other:?}")), true),
            Err(why) => (failed(&format!("its fa-test died or hung: {why}")), true),
        };
        if !ended {
            w.ended = 0;
            return Ok(outcome);
        }
        w.session = None;
        w.ended += 1;
        w.retired = if w.ended >= MAX_ENDED {
            Some(format!("{MAX_ENDED} fa-test processes in a row ended on their cases"))
        } else {
            match self.spawn(gpu) {
                Ok((session, uuid)) => {
                    (w.session, w.uuid) = (Some(session), uuid);
                    None
                }
                Err(e) => Some(format!("a new fa-test did not start: {e}")),
            }
        };
        Ok(outcome)
    }
}

/// fa-test's cases (`--list --json`, with `args` choosing the set), written to
/// `dir/cases.json`: the same on every machine, so shards of one run join; a
/// case this GPU's kernel set lacks is reported skipped when it is dealt.
pub fn list_cases(driver: &Path, dir: &Path, args: &[&str], filter: Option<&str>) -> Result<Vec<ListedCase>> {
    let list = dir.join("cases.json");
    let mut cmd =
        Cmd::new(driver).args(args.iter().copied()).arg("--list").arg("--json").arg(list.display().to_string());
    if let Some(f) = filter {
        cmd = cmd.arg("--filter").arg(f);
    }
    cmd.quiet().run_checked().context("listing the cases")?;
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
        let run = &p.payload.run;
        let reported = run.cases.iter().map(|c| c.name.clone()).chain(run.skipped.iter().map(|s| s.name.clone()));
        records.push((rec, reported.collect()));
    }
    spread::check_parts(&records).map_err(|e| CheckFailed(format!("the shard reports do not join: {e}")))?;
    parts.sort_by_key(|p| p.payload.shard.as_ref().map_or(0, |s| s.shard.index));
    let mut it = parts.into_iter();
    let Some(mut merged) = it.next() else { return Err(CannotRun("no shard reports to merge".into()).into()) };
    for p in it {
        merged.payload.run.cases.extend(p.payload.run.cases);
        merged.payload.run.skipped.extend(p.payload.run.skipped);
        merged.payload.gpus.extend(p.payload.gpus);
        merged.payload.timeline.extend(p.payload.timeline);
    }
    merged.payload.shard = None;
    let path = out.map_or_else(|| cx.report("test"), Path::to_path_buf);
    let run = &merged.payload.run;
    let failed = run.cases.iter().filter(|c| !c.passed).count();
    merged.write(&path)?;
    println!("{} shards, {} cases, {failed} failed; report: {}", files.len(), run.cases.len(), path.display());
    all_passed(&run.cases)
}

/// The record of a case no worker could finish: failed, with the reason.
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

    /// Every shard of `n` run on the default GPU, each written to `dir`, and
    /// their merge (the shard files too, for merge's own checks).
    fn merged_shards(cx: &Run, driver: &Path, dir: &Path, n: u32) -> (Vec<PathBuf>, TestReport) {
        let mut files = Vec::new();
        for i in 1..=n {
            let part = run_workers(cx, &opts(Some(&format!("{i}/{n}"))), driver, &[None]).unwrap();
            let file = dir.join(format!("shard-{i}.json"));
            Envelope::new("test", crate::tools::process::git_state(&cx.root), Toolchain::default(), None, &part)
                .write(&file)
                .unwrap();
            files.push(file);
        }
        let out = dir.join("merged.json");
        merge(cx, &files, Some(&out)).unwrap();
        let merged: Envelope<TestReport> = read_json(&out).unwrap();
        (files, merged.payload)
    }

    fn names(r: &TestReport) -> Vec<String> {
        r.run.cases.iter().map(|c| c.name.clone()).collect()
    }

    #[test]
    fn spread_runs_keep_every_case_once_in_matrix_order_with_its_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        let all: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
        let two = run_workers(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(names(&two), all);
        assert!(
            two.run.cases.iter().all(|c| c.passed && c.gpu.as_deref().is_some_and(|g| g == "GPU-a" || g == "GPU-b"))
        );
        assert_eq!(two.gpus.len(), 2);
        // The timeline: each worker's start with fa-test's set-up, then every case once.
        let starts: Vec<&Step> = two.timeline.iter().filter(|s| s.what == START_CHECK).collect();
        assert!(starts.len() == 2 && starts.iter().all(|s| s.setup_s == Some(0.25)), "{starts:?}");
        let mut ran: Vec<&str> =
            two.timeline.iter().filter(|s| s.what != START_CHECK).map(|s| s.what.as_str()).collect();
        ran.sort();
        assert_eq!(ran, all.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(two.timeline.iter().all(|s| s.start_s <= s.end_s));
        assert_eq!(busy_lines(&two.timeline).len(), 2);
        // Shards on one GPU each: their union is the matrix, and they merge.
        let (files, merged) = merged_shards(&cx, &driver, dir.path(), 3);
        let mut got = names(&merged);
        got.sort();
        let mut want = all.clone();
        want.sort();
        assert_eq!(got, want);
        assert!(merged.shard.is_none());
        let out = dir.path().join("again.json");
        let gap = merge(&cx, &files[..2], Some(&out)).unwrap_err().to_string();
        assert!(gap.contains("missing shard report(s): 3/3"), "{gap}");
        let twice = merge(&cx, &[files[0].clone(), files[0].clone()], Some(&out)).unwrap_err().to_string();
        assert!(twice.contains("appears twice"), "{twice}");
    }

    #[test]
    fn a_case_a_worker_dies_on_fails_and_the_worker_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        // c0 kills its process; c4 ends it as a CUDA error does.
        write_file(&cx.kernels.join("die"), "c0").unwrap();
        write_file(&cx.kernels.join("fault"), "c4").unwrap();
        let r = run_workers(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(r.run.cases.len(), 10, "every case is reported");
        let c0 = &r.run.cases[0];
        assert!(!c0.passed && c0.rel_l2.is_nan(), "{c0:?}");
        assert!(c0.error.as_deref().is_some_and(|e| e.contains("died or hung")), "{c0:?}");
        let failed: Vec<&str> = r.run.cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["c0"], "a new process ran the rest, c4's too");
        // So does the one worker of a run without --gpus: a fault hides no later case.
        let one = run_workers(&cx, &opts(None), &driver, &[None]).unwrap();
        assert_eq!(one.run.cases.len(), 10);
        assert_eq!(one.run.cases.iter().filter(|c| !c.passed).count(), 1);
        assert!(one.gpus.is_empty(), "one device: the run's own");
    }

    #[test]
    fn a_hung_case_fails_and_a_worker_that_cannot_start_leaves_the_rest_to_others() {
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        write_file(&cx.kernels.join("hang"), "c2").unwrap();
        // c2 hangs until the run's 2 s are up: it fails, and so does what no
        // worker had time left to run; nothing is dropped.
        let quick = Options { timeout: Duration::from_secs(2), ..opts(None) };
        let r = run_workers(&cx, &quick, &driver, &[gpu("a")]).unwrap();
        assert_eq!(r.run.cases.len(), 10);
        let failed: Vec<&str> = r.run.cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"]);
        assert!(r.run.cases[2].error.as_deref().is_some_and(|e| e.contains("died or hung")), "{:?}", r.run.cases[2]);
        // No worker starts: the run cannot be made, and says why.
        write_file(&cx.kernels.join("die"), "start").unwrap();
        let err = format!("{:#}", run_workers(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap_err());
        assert!(err.contains("no fa-test worker started: GPU a (Fake GPU): "), "{err}");
        assert_eq!(err.matches("does not start").count(), 2, "each worker's reason once: {err}");
    }

    #[test]
    fn cases_the_driver_skips_are_recorded_not_failed() {
        // Cases for entries the kernel set lacks are in the matrix; the driver
        // skips them and says why. They were reported failed: 4116 of 5662 on
        // two H200s.
        let dir = tempfile::tempdir().unwrap();
        let (cx, driver) = fake(dir.path());
        write_file(&cx.kernels.join("skip"), "c2,c5").unwrap();
        let r = run_workers(&cx, &opts(None), &driver, &[gpu("a"), gpu("b")]).unwrap();
        assert_eq!(r.run.cases.len(), 8);
        assert!(r.run.cases.iter().all(|c| c.passed));
        let skipped: Vec<&str> = r.run.skipped.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(skipped, ["c2", "c5"]);
        assert!(finish(&cx, r).is_ok());
        // Shards count their skips as reported, and the merge keeps every shard's.
        let (_, merged) = merged_shards(&cx, &driver, dir.path(), 2);
        let mut skipped: Vec<String> = merged.run.skipped.iter().map(|s| s.name.clone()).collect();
        skipped.sort();
        assert_eq!((merged.run.cases.len(), skipped), (8, vec!["c2".to_string(), "c5".into()]));
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
        let spawn = Spawner {
            cx: &cx,
            opts: &opts,
            driver: Path::new("fa-test"),
            dir: Path::new("."),
            seed: 1,
            deadline: Instant::now(),
            threads: 3,
            started: Default::default(),
            spawned: Default::default(),
        };
        let cmd = spawn.command(None, PathBuf::from("w.log"));
        assert_eq!(cmd.env_value("FA_KERNEL_DIR"), Some("/elsewhere/kernels"));
        assert!(cmd.display().contains("--worker --seed 1 --threads 3"), "{}", cmd.display());
    }
}
