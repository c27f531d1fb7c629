//! `cargo xtask bench`: runs kernel-ffi's `fa-bench`, and the no >2% regression
//! gate: base and candidate as interleaved processes (A B A B …) on one GPU,
//! compared per shape by the median of per-process medians with a bootstrap
//! interval; or against a stored per-GPU baseline; or against PyTorch SDPA.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::paths::{Paths, slug};
use crate::process::{Cmd, write_file};
use crate::report::{Device, Envelope, Toolchain, read_json};
use crate::schema::{BenchCase, BenchRun};
use crate::stats::{self, Comparison, Verdict};
use crate::{CannotRun, CheckFailed, table, toolchain, tools};

pub struct Options {
    pub shapes: Vec<String>,
    pub dtypes: String,
    /// Build this git revision in a worktree and compare with it.
    pub against: Option<String>,
    /// A prebuilt base: `DIR/kernels/` (fatbins + manifest) and optionally `DIR/fa-bench`.
    pub base_dir: Option<PathBuf>,
    /// Processes per side.
    pub processes: usize,
    /// Per-case time budget inside each process.
    pub budget_ms: u64,
    /// fa-bench's --variant (auto, portable, hopper).
    pub variant: String,
    pub save_baseline: bool,
    pub vs_torch: bool,
    pub timeout: Duration,
}

/// One side of a comparison: a bench binary and the kernels it loads.
#[derive(Debug, Clone)]
pub struct Side {
    pub bench: PathBuf,
    pub kernels: PathBuf,
}

/// One fa-bench process: its results and the SM clock sampled while it ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessRun {
    pub side: String,
    pub run: BenchRun,
    pub sm_clock_mhz: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShapeComparison {
    pub name: String,
    pub base_medians_us: Vec<f64>,
    pub cand_medians_us: Vec<f64>,
    pub base_us: f64,
    pub cand_us: f64,
    #[serde(flatten)]
    pub comparison: Comparison,
    /// Why the verdict was overridden, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A stored per-GPU baseline: per-process medians per shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Baseline {
    pub device: String,
    pub git_rev: String,
    pub medians_us: BTreeMap<String, Vec<f64>>,
    pub sm_clock_mhz: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TorchRatio {
    pub name: String,
    pub fa_us: f64,
    /// How our processes timed the case ("graph-replay+events-cold-l2" if they differed).
    #[serde(default)]
    pub fa_method: String,
    /// Backend → (µs, speedup = backend µs / fa µs), from its runs timed by `fa_method`.
    pub backends: BTreeMap<String, (f64, f64)>,
    /// Backend → methods of its runs left out because they timed the case another way.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other_method: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchPayload {
    pub mode: String,
    pub runs: Vec<ProcessRun>,
    pub comparisons: Vec<ShapeComparison>,
    pub clock_warning: Option<String>,
    pub torch: Vec<TorchRatio>,
}

/// Per-shape comparisons of per-process medians (shapes present on both sides).
pub fn compare_runs(base: &BTreeMap<String, Vec<f64>>, cand: &BTreeMap<String, Vec<f64>>) -> Vec<ShapeComparison> {
    cand.iter()
        .filter_map(|(name, c)| {
            let b = base.get(name)?;
            Some(ShapeComparison {
                name: name.clone(),
                base_medians_us: b.clone(),
                cand_medians_us: c.clone(),
                base_us: stats::median(b),
                cand_us: stats::median(c),
                comparison: stats::compare(b, c),
                note: None,
            })
        })
        .collect()
}

/// A case the two sides timed by different methods (graph replay against cold-L2
/// events: microseconds apart on small shapes) cannot be called either way: its
/// verdict becomes ambiguous, with the methods in the note.
pub fn flag_method_changes(comparisons: &mut [ShapeComparison], runs: &[ProcessRun]) {
    let (base, cand) = (side_methods(runs, "base"), side_methods(runs, "candidate"));
    for c in comparisons {
        if let (Some(b), Some(m)) = (base.get(&c.name), cand.get(&c.name))
            && b != m
        {
            c.comparison.verdict = Verdict::Ambiguous;
            c.note = Some(format!("timed by {b} (base) and {m} (candidate)"));
        }
    }
}

/// Per-process medians per case, of one side's processes.
pub fn side_medians(runs: &[ProcessRun], side: &str) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.side == side) {
        for c in &r.run.cases {
            out.entry(c.name.clone()).or_default().push(c.median_us);
        }
    }
    out
}

/// The timing method per case of one side's processes, `+`-joined where they differed.
pub fn side_methods(runs: &[ProcessRun], side: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.side == side) {
        for c in &r.run.cases {
            out.entry(c.name.clone()).or_default().insert(&c.method);
        }
    }
    out.into_iter().map(|(k, m)| (k, m.into_iter().collect::<Vec<_>>().join("+"))).collect()
}

/// Fewest processes per side behind a verdict or a stored baseline.
pub const MIN_PROCESSES: usize = 5;

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    if opts.processes < MIN_PROCESSES && (opts.against.is_some() || opts.base_dir.is_some() || opts.save_baseline) {
        return Err(CannotRun(format!(
            "--processes {}: a verdict or a baseline needs at least {MIN_PROCESSES} per side",
            opts.processes
        ))
        .into());
    }
    crate::gpu::require("bench")?;
    let cand = Side { bench: tools::binary(paths, "fa-bench")?, kernels: paths.kernels_out() };
    let base = match (&opts.against, &opts.base_dir) {
        (Some(rev), _) => Some(build_revision(paths, rev)?),
        (None, Some(dir)) => {
            let bench = dir.join("fa-bench");
            Some(Side { bench: if bench.is_file() { bench } else { cand.bench.clone() }, kernels: dir.join("kernels") })
        }
        (None, None) => None,
    };
    let dir = paths.reports().join("bench");
    let mut runs = Vec::new();
    let mut comparisons = Vec::new();
    let mode;
    if let Some(base) = &base {
        mode = "a/b".to_string();
        runs = interleaved(base, &cand, &dir, opts)?;
        comparisons = compare_runs(&side_medians(&runs, "base"), &side_medians(&runs, "candidate"));
        flag_method_changes(&mut comparisons, &runs);
    } else {
        let first = run_process(&cand, "candidate", 0, &dir, opts)?;
        let device = first.run.device.name.clone();
        let baseline_path = paths.root.join("ci/baselines").join(format!("{}.json", slug(&device)));
        runs.push(first);
        let baseline =
            if opts.save_baseline || opts.processes < MIN_PROCESSES { None } else { read_baseline(&baseline_path)? };
        if opts.save_baseline || baseline.is_some() {
            for i in 1..opts.processes {
                runs.push(run_process(&cand, "candidate", i, &dir, opts)?);
            }
        }
        if opts.save_baseline {
            mode = "save-baseline".into();
            let b = Baseline {
                device: device.clone(),
                git_rev: crate::report::git_state().0,
                medians_us: side_medians(&runs, "candidate"),
                sm_clock_mhz: median_clock(&runs.iter().collect::<Vec<_>>()),
            };
            write_file(&baseline_path, serde_json::to_string_pretty(&b)? + "\n")?;
            println!("baseline for {device}: {}", baseline_path.display());
        } else if let Some(b) = baseline {
            mode = format!("baseline {}", baseline_path.display());
            comparisons = compare_runs(&b.medians_us, &side_medians(&runs, "candidate"));
        } else {
            mode = "single".into();
            eprintln!(
                "bench: timings only (a comparison needs {} and --processes {MIN_PROCESSES} or more)",
                baseline_path.display()
            );
        }
    }

    print_runs(&runs);
    let clock_warning = clock_warning(&runs);
    if !comparisons.is_empty() {
        println!("\n{}", comparison_table(&comparisons));
    }
    if let Some(w) = &clock_warning {
        println!("WARNING: {w}");
    }
    let torch = if opts.vs_torch { vs_torch(paths, &runs, opts)? } else { Vec::new() };
    let payload = BenchPayload { mode, runs, comparisons, clock_warning, torch };
    let device = payload.runs.first().map(|r| Device {
        name: r.run.device.name.clone(),
        compute_capability: r.run.device.compute_capability.clone(),
        sm_count: r.run.device.sm_count,
    });
    let driver = payload.runs.first().and_then(|r| r.run.device.driver.clone());
    let report = paths.report("bench");
    Envelope::new("bench", Toolchain { driver, ..Toolchain::default() }, device, &payload).write(&report)?;
    write_file(&paths.reports().join("bench.md"), markdown(&payload))?;
    println!("report: {} (and bench.md)", report.display());
    let regressions: Vec<&str> = payload
        .comparisons
        .iter()
        .filter(|c| c.comparison.verdict == Verdict::Regression)
        .map(|c| c.name.as_str())
        .collect();
    if !regressions.is_empty() {
        return Err(CheckFailed(format!("confirmed regression over 2% on {}", regressions.join(", "))).into());
    }
    Ok(())
}

fn read_baseline(path: &Path) -> Result<Option<Baseline>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?)),
        Err(_) => Ok(None),
    }
}

/// Base and candidate processes alternating, A B A B …, `opts.processes` of each.
pub fn interleaved(base: &Side, cand: &Side, dir: &Path, opts: &Options) -> Result<Vec<ProcessRun>> {
    let mut runs = Vec::new();
    for i in 0..opts.processes {
        eprintln!("== bench: process pair {}/{}", i + 1, opts.processes);
        runs.push(run_process(base, "base", i, dir, opts)?);
        runs.push(run_process(cand, "candidate", i, dir, opts)?);
    }
    Ok(runs)
}

pub fn run_process(side: &Side, label: &str, i: usize, dir: &Path, opts: &Options) -> Result<ProcessRun> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join(format!("{label}-{i}.json"));
    let mut cmd = Cmd::new(&side.bench)
        .arg("--json")
        .arg(json.display().to_string())
        .args(["--dtype", &opts.dtypes, "--budget-ms", &opts.budget_ms.to_string()])
        .env("FA_KERNEL_DIR", side.kernels.display().to_string())
        .timeout(opts.timeout)
        .log(dir.join(format!("{label}-{i}.log")))
        .echo();
    for s in &opts.shapes {
        cmd = cmd.arg("--shape").arg(s.clone());
    }
    // Only when asked: a prebuilt base from before variants existed rejects the flag.
    if opts.variant != "auto" {
        cmd = cmd.args(["--variant", &opts.variant]);
    }
    let sampler = ClockSampler::start();
    let out = cmd.run()?;
    let sm_clock_mhz = sampler.stop();
    if !out.success() {
        return Err(CannotRun(format!("{} failed ({}): {}", side.bench.display(), out.status, out.tail())).into());
    }
    let run: BenchRun = read_json(&json)?;
    Ok(ProcessRun { side: label.into(), run, sm_clock_mhz })
}

/// Samples the SM clock with nvidia-smi every 250 ms while a bench process runs.
struct ClockSampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<f64>>,
}

impl ClockSampler {
    fn start() -> ClockSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let out = Cmd::new("nvidia-smi")
                    .args(["--query-gpu=clocks.sm", "--format=csv,noheader,nounits"])
                    .quiet()
                    .timeout(Duration::from_secs(10))
                    .run();
                match out {
                    Ok(o) if o.success() => {
                        samples.extend(o.stdout.lines().next().and_then(|l| l.trim().parse::<f64>().ok()))
                    }
                    _ => break, // no nvidia-smi: no clock record
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            samples
        });
        ClockSampler { stop, handle }
    }

    /// Median SM clock over the samples taken while the GPU was busy (the top
    /// three quarters; idle gaps between cases read low).
    fn stop(self) -> Option<f64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut s = self.handle.join().ok()?;
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let busy = &s[s.len() / 4..];
        Some(stats::median(busy))
    }
}

fn median_clock(runs: &[&ProcessRun]) -> Option<f64> {
    let clocks: Vec<f64> = runs.iter().filter_map(|r| r.sm_clock_mhz).collect();
    (!clocks.is_empty()).then(|| stats::median(&clocks))
}

/// Base and candidate ran at different clocks: the comparison measures the clocks too.
fn clock_warning(runs: &[ProcessRun]) -> Option<String> {
    let side = |s: &str| median_clock(&runs.iter().filter(|r| r.side == s).collect::<Vec<_>>());
    let (b, c) = (side("base")?, side("candidate")?);
    ((c / b - 1.0).abs() > 0.02).then(|| format!("SM clock differed: base {b:.0} MHz, candidate {c:.0} MHz"))
}

/// Builds `rev` in a git worktree under target/ (never touching the working tree):
/// its kernel-ffi binaries and its kernels, with this checkout's nvcc.
fn build_revision(paths: &Paths, rev: &str) -> Result<Side> {
    let cargo = std::env::var_os("CARGO").context(
        "--against builds the base with cargo; on a machine without Rust, pass a prebuilt base with --base-dir",
    )?;
    let sha = Cmd::new("git")
        .args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .cwd(&paths.root)
        .quiet()
        .run_checked()
        .with_context(|| format!("`{rev}` is not a commit"))?
        .stdout
        .trim()
        .to_string();
    let wt = paths.reports().join("worktrees").join(&sha[..12]);
    if !wt.join("Cargo.toml").is_file() {
        Cmd::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(wt.display().to_string())
            .arg(&sha)
            .cwd(&paths.root)
            .run_checked()?;
    }
    let target = wt.join("target");
    let nvcc = toolchain::nvcc(&paths.cuda_wheels)?;
    Cmd::new(&cargo)
        .args(["build", "--release", "--quiet", "-p", "kernel-ffi", "--bins"])
        .cwd(&wt)
        .env("CARGO_TARGET_DIR", target.display().to_string())
        .timeout(Duration::from_secs(1800))
        .log(paths.reports().join("bench/base-build.log"))
        .run_checked()
        .with_context(|| format!("building {rev} ({sha}) in {}", wt.display()))?;
    Cmd::new(&cargo)
        .args(["run", "--release", "--quiet", "-p", "xtask", "--", "build"])
        .cwd(&wt)
        .env("CARGO_TARGET_DIR", target.display().to_string())
        .env("XTASK_ROOT", wt.display().to_string())
        .env("NVCC", nvcc.path.display().to_string())
        .timeout(Duration::from_secs(1800))
        .log(paths.reports().join("bench/base-kernels.log"))
        .run_checked()
        .with_context(|| format!("building {rev}'s kernels"))?;
    Ok(Side { bench: target.join("release/fa-bench"), kernels: target.join("kernels") })
}

/// PyTorch SDPA timed by `ci/bench_torch.py` in as many processes as our side ran,
/// compared median to median where both sides timed a case the same way.
fn vs_torch(paths: &Paths, runs: &[ProcessRun], opts: &Options) -> Result<Vec<TorchRatio>> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    // The shapes fa-bench ran, so both sides time the same cases.
    let mut shapes = Vec::new();
    for c in runs.iter().flat_map(|r| &r.run.cases) {
        let shape = format!(
            "{},{},{},{}{}",
            c.shape.batch,
            c.shape.heads,
            c.shape.seqlen_q,
            c.shape.head_dim,
            if c.shape.causal { ",causal" } else { "" }
        );
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    }
    let processes = opts.processes.max(1);
    let mut torch: Vec<BenchRun> = Vec::new();
    for i in 0..processes {
        eprintln!("== bench: PyTorch SDPA process {}/{processes}", i + 1);
        let json = paths.reports().join(format!("bench/torch-{i}.json"));
        let mut cmd = Cmd::new(&python)
            .arg(paths.root.join("ci/bench_torch.py").display().to_string())
            .arg("--json")
            .arg(json.display().to_string())
            .args(["--dtype", &opts.dtypes, "--budget-ms", &opts.budget_ms.to_string()])
            .timeout(opts.timeout)
            .log(paths.reports().join(format!("bench/torch-{i}.log")))
            .echo();
        for shape in &shapes {
            cmd = cmd.arg("--shape").arg(shape);
        }
        let out = cmd.run()?;
        if !out.success() {
            bail!(CannotRun(format!("ci/bench_torch.py failed (is PyTorch installed?): {}", out.tail())));
        }
        torch.extend(read_json::<Vec<BenchRun>>(&json)?);
    }
    let ratios = torch_ratios(&side_medians(runs, "candidate"), &side_methods(runs, "candidate"), &torch);
    let mut backends: Vec<String> = torch.iter().map(|t| t.implementation.clone()).collect();
    backends.sort();
    backends.dedup();
    let mut header = vec!["shape".to_string(), "fa us".to_string()];
    header.extend(backends.iter().map(|b| format!("{b} us (speedup)")));
    let rows: Vec<Vec<String>> = ratios
        .iter()
        .map(|r| {
            let mut row = vec![r.name.clone(), format!("{:.2}", r.fa_us)];
            row.extend(backends.iter().map(|b| match (r.backends.get(b), r.other_method.get(b)) {
                (Some((us, x)), _) => format!("{us:.2} ({x:.2}x)"),
                (None, Some(m)) => format!("n/a: timed by {}", m.join("+")),
                (None, None) => "n/a".into(),
            }));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    println!("\nvs PyTorch SDPA (speedup = torch time / fa time, same method)\n{}", table::render(&header, &rows));
    Ok(ratios)
}

/// Speedup against each PyTorch backend per case: the median over our processes
/// against the median over `torch`'s runs of that backend (one per process), only
/// from runs that timed the case by our method (`fa_methods`): graph replay and
/// cold-L2 events differ by microseconds on small shapes, so a mixed median would
/// compare methods, not kernels.
pub fn torch_ratios(
    fa: &BTreeMap<String, Vec<f64>>,
    fa_methods: &BTreeMap<String, String>,
    torch: &[BenchRun],
) -> Vec<TorchRatio> {
    fa.iter()
        .map(|(name, m)| {
            let fa_us = stats::median(m);
            let fa_method = fa_methods.get(name).cloned().unwrap_or_default();
            let mut per_backend: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            let mut other_method: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for t in torch {
                if let Some(c) = t.cases.iter().find(|c: &&BenchCase| &c.name == name) {
                    if c.method == fa_method {
                        per_backend.entry(t.implementation.clone()).or_default().push(c.median_us);
                    } else {
                        let m = other_method.entry(t.implementation.clone()).or_default();
                        if !m.contains(&c.method) {
                            m.push(c.method.clone());
                        }
                    }
                }
            }
            let backends = per_backend
                .into_iter()
                .map(|(backend, us)| {
                    let us = stats::median(&us);
                    (backend, (us, us / fa_us))
                })
                .collect();
            TorchRatio { name: name.clone(), fa_us, fa_method, backends, other_method }
        })
        .collect()
}

fn print_runs(runs: &[ProcessRun]) {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .flat_map(|r| {
            r.run.cases.iter().map(move |c| {
                vec![
                    r.side.clone(),
                    c.name.clone(),
                    format!("{:.2}", c.median_us),
                    format!("{:.2}-{:.2}", c.q1_us, c.q3_us),
                    format!("{:.2}%", c.rel_stdev * 100.0),
                    c.samples.to_string(),
                    format!("{:.1}", c.tflops),
                    c.ctas.to_string(),
                    c.num_splits.to_string(),
                    c.method.clone(),
                    r.sm_clock_mhz.map_or("n/a".into(), |m| format!("{m:.0}")),
                ]
            })
        })
        .collect();
    println!(
        "{}",
        table::render(
            &["side", "case", "median us", "IQR", "rel sd", "n", "TFLOP/s", "CTAs", "splits", "method", "SM MHz"],
            &rows
        )
    );
}

fn comparison_table(cs: &[ShapeComparison]) -> String {
    let rows: Vec<Vec<String>> = cs
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                format!("{:.2}", c.base_us),
                format!("{:.2}", c.cand_us),
                format!("{:+.2}%", c.comparison.change * 100.0),
                format!("[{:+.2}%, {:+.2}%]", c.comparison.ci_low * 100.0, c.comparison.ci_high * 100.0),
                match &c.note {
                    Some(n) => format!("{:?} ({n})", c.comparison.verdict).to_lowercase(),
                    None => format!("{:?}", c.comparison.verdict).to_lowercase(),
                },
            ]
        })
        .collect();
    table::render(&["case", "base us", "cand us", "change", "95% CI", "verdict"], &rows)
}

pub fn markdown(p: &BenchPayload) -> String {
    let mut md = format!("### Bench ({})\n\n", p.mode);
    if !p.comparisons.is_empty() {
        md.push_str("| case | base µs | candidate µs | change | 95% CI | verdict |\n|---|---:|---:|---:|---:|---|\n");
        for c in &p.comparisons {
            let v = c.comparison.verdict;
            let mark = match v {
                Verdict::Regression => "❌ regression",
                Verdict::Improvement => "✅ improvement",
                Verdict::Same => "same",
                Verdict::Ambiguous => "⚠️ ambiguous: rerun",
            };
            let mark = match &c.note {
                Some(n) => format!("{mark} ({n})"),
                None => mark.to_string(),
            };
            md.push_str(&format!(
                "| {} | {:.2} | {:.2} | {:+.2}% | [{:+.2}%, {:+.2}%] | {mark} |\n",
                c.name,
                c.base_us,
                c.cand_us,
                c.comparison.change * 100.0,
                c.comparison.ci_low * 100.0,
                c.comparison.ci_high * 100.0
            ));
        }
    }
    if let Some(w) = &p.clock_warning {
        md.push_str(&format!("\n> ⚠️ {w}\n"));
    }
    if !p.torch.is_empty() {
        md.push_str("\n| case | fa µs | vs PyTorch SDPA (speedup) |\n|---|---:|---|\n");
        for t in &p.torch {
            let mut b: Vec<String> =
                t.backends.iter().map(|(k, (us, x))| format!("{k} {us:.2} µs ({x:.2}×)")).collect();
            b.extend(
                t.other_method
                    .iter()
                    .map(|(k, m)| format!("{k} n/a (timed by {}, ours by {})", m.join("+"), t.fa_method)),
            );
            md.push_str(&format!("| {} | {:.2} | {} |\n", t.name, t.fa_us, b.join(", ")));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("NVIDIA L4"), "nvidia-l4");
    }

    #[test]
    fn torch_ratios_compare_medians_over_processes() {
        // Three torch processes, as `vs_torch` collects them: flash timed only twice.
        let run = |backend: &str, us: f64, method: &str| -> BenchRun {
            let case = serde_json::json!({"name": "f16-b2h8s512d64", "dtype": "f16", "batch": 2, "heads": 8,
                "kv_heads": 8, "seqlen_q": 512, "seqlen_k": 512, "head_dim": 64, "causal": false,
                "method": method, "samples": 40, "median_us": us, "q1_us": us, "q3_us": us,
                "min_us": us, "mean_us": us, "rel_stdev": 0.0, "tflops": 0.0, "ctas": 0, "num_splits": 0});
            serde_json::from_value(serde_json::json!({
                "device": {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": null},
                "implementation": backend, "cases": [case]}))
            .unwrap()
        };
        let g = "graph-replay";
        let torch = [
            run("torch-default", 9.4, g),
            run("torch-flash", 12.8, g),
            run("torch-default", 10.2, g),
            run("torch-flash", 13.0, g),
            run("torch-default", 10.0, g),
            // Timed with cold-L2 events (its estimate was CPU-bound): not comparable.
            run("torch-default", 11.9, "events-cold-l2"),
            run("torch-efficient", 22.0, "events-cold-l2"),
        ];
        let fa = BTreeMap::from([
            ("f16-b2h8s512d64".to_string(), vec![5.1, 5.0, 4.9]),
            ("f16-b1h1s64d64".to_string(), vec![3.0]),
        ]);
        let methods = fa.keys().map(|k| (k.clone(), g.to_string())).collect();
        let r = torch_ratios(&fa, &methods, &torch);
        let small = r.iter().find(|r| r.name == "f16-b2h8s512d64").unwrap();
        assert_eq!(small.fa_us, 5.0);
        assert_eq!(small.backends["torch-default"], (10.0, 2.0));
        assert_eq!(small.backends["torch-flash"].0, 12.9);
        assert!(!small.backends.contains_key("torch-efficient"));
        assert_eq!(small.other_method["torch-efficient"], ["events-cold-l2"]);
        assert_eq!(small.other_method["torch-default"], ["events-cold-l2"]);
        // A case no torch process timed has no ratios, not a zero or NaN one.
        assert!(r.iter().find(|r| r.name == "f16-b1h1s64d64").unwrap().backends.is_empty());
    }

    #[test]
    fn a_captured_torch_run_yields_every_backend() {
        // ci/bench_torch.py's output on an H200 (PyTorch 2.11, the default shape set).
        let torch: Vec<BenchRun> =
            serde_json::from_str(include_str!("../tests/data/h200/bench-torch-sdpa.json")).unwrap();
        let fa = BTreeMap::from([("f16-b4h16s2048d128".to_string(), vec![240.0])]);
        let methods = BTreeMap::from([("f16-b4h16s2048d128".to_string(), "events-cold-l2".to_string())]);
        let r = torch_ratios(&fa, &methods, &torch);
        let names: Vec<&str> = r[0].backends.keys().map(String::as_str).collect();
        assert_eq!(names, ["torch-cudnn", "torch-default", "torch-efficient", "torch-flash"]);
        for (us, x) in r[0].backends.values() {
            assert!(us.is_finite() && *us > 100.0 && (x - us / 240.0).abs() < 1e-12, "{us} {x}");
        }
    }

    #[test]
    fn comparisons_join_on_case_names() {
        let base = BTreeMap::from([("a".to_string(), vec![100.0; 5]), ("gone".to_string(), vec![1.0; 5])]);
        let cand = BTreeMap::from([
            ("a".to_string(), vec![103.0, 103.1, 102.9, 103.0, 103.2]),
            ("new".to_string(), vec![1.0]),
        ]);
        let c = compare_runs(&base, &cand);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].comparison.verdict, Verdict::Regression);
        let md = markdown(&BenchPayload {
            mode: "a/b".into(),
            runs: vec![],
            comparisons: c,
            clock_warning: None,
            torch: vec![],
        });
        assert!(md.contains("| a | 100.00 | 103.00 | +3.00%"), "{md}");
        assert!(md.contains("regression"));
    }

    #[test]
    fn clock_mismatch_is_reported() {
        let run = |side: &str, mhz| ProcessRun {
            side: side.into(),
            run: BenchRun {
                device: crate::schema::DeviceInfo {
                    name: "x".into(),
                    compute_capability: "9.0".into(),
                    sm_count: 1,
                    driver: None,
                },
                implementation: "fa".into(),
                cases: vec![],
            },
            sm_clock_mhz: Some(mhz),
        };
        assert!(clock_warning(&[run("base", 1980.0), run("candidate", 1755.0)]).is_some());
        assert!(clock_warning(&[run("base", 1980.0), run("candidate", 1975.0)]).is_none());
    }

    #[test]
    fn a_case_timed_two_ways_cannot_be_called() {
        // B1 H4 S2048 D64 causal sat near --graph-below-us: one side's processes
        // graph-replayed it (28 µs), the other's timed cold-L2 events (42 µs).
        let run = |side: &str, method: &str, us: f64| -> ProcessRun {
            let case = |name: &str, method: &str, us: f64| {
                serde_json::json!({"name": name, "dtype": "f16", "batch": 1, "heads": 4, "kv_heads": 4,
                    "seqlen_q": 2048, "seqlen_k": 2048, "head_dim": 64, "causal": true, "method": method,
                    "samples": 40, "median_us": us, "q1_us": us, "q3_us": us, "min_us": us, "mean_us": us,
                    "rel_stdev": 0.0, "tflops": 0.0, "ctas": 0, "num_splits": 0})
            };
            let run = serde_json::json!({
                "device": {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": null},
                "implementation": "fa",
                "cases": [case("flipped", method, us), case("steady", "graph-replay", 10.0)]});
            ProcessRun { side: side.into(), run: serde_json::from_value(run).unwrap(), sm_clock_mhz: None }
        };
        let runs: Vec<ProcessRun> = (0..5)
            .flat_map(|_| [run("base", "events-cold-l2", 42.0), run("candidate", "graph-replay", 28.0)])
            .collect();
        let mut c = compare_runs(&side_medians(&runs, "base"), &side_medians(&runs, "candidate"));
        assert_eq!(c.iter().find(|c| c.name == "flipped").unwrap().comparison.verdict, Verdict::Improvement);
        flag_method_changes(&mut c, &runs);
        let flipped = c.iter().find(|c| c.name == "flipped").unwrap();
        assert_eq!(flipped.comparison.verdict, Verdict::Ambiguous);
        assert_eq!(flipped.note.as_deref(), Some("timed by events-cold-l2 (base) and graph-replay (candidate)"));
        let steady = c.iter().find(|c| c.name == "steady").unwrap();
        assert_eq!((steady.comparison.verdict, steady.note.as_deref()), (Verdict::Same, None));
    }
}
