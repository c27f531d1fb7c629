//! `cargo xtask bench`: timings from kernel-ffi's `fa-bench`, and the no >2%
//! regression gate (`gate`): base and candidate paired quad by quad on one GPU,
//! against a revision or a prebuilt base. `--self-test` runs the gate base
//! against base and against a planted slowdown. A saved baseline (`compare`)
//! and PyTorch SDPA are compared by plain medians: information, not a verdict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::errors::{CannotRun, CheckFailed};
use crate::measure::compare;
use crate::measure::gate::monitor::ClockSampler;
use crate::measure::gate::sequence::{Verdict, median};
use crate::measure::gate::{self, GateRun, Side, verdict_word};
use crate::measure::payload::{
    BIAS_LIMIT, BenchPayload, ProcessRun, SelfTest, SelfTestShape, TorchRatio, side_medians, side_methods,
};
use crate::report::{Device, Envelope, Toolchain, read_json};
use crate::run::Run;
use crate::table;
use crate::tools::drivers;
use crate::tools::process::{Cmd, write_file};
use crate::tools::toolchain;
use fa_schema::schema::{BenchCase, BenchRun};

pub struct Options {
    pub shapes: Vec<String>,
    pub dtypes: String,
    /// Build this git revision in a worktree and compare with it.
    pub against: Option<String>,
    /// A prebuilt base: `DIR/kernels/` (fatbins + manifest) and optionally `DIR/fa-bench`.
    pub base_dir: Option<PathBuf>,
    /// Processes of plain timing (no base), per side of `--vs-torch`.
    pub processes: usize,
    /// Per-case time budget inside each plain timing process.
    pub budget_ms: u64,
    /// The gate's most seconds of quads per shape.
    pub gate_secs: f64,
    /// Seeds the gate's quad order (recorded in the report).
    pub seed: u64,
    /// fa-bench's --variant (auto, portable, hopper).
    pub variant: String,
    /// Explain every gated shape, not only regressions and improvements.
    pub explain: bool,
    /// Save this run as a named baseline (`compare::locate`).
    pub save_baseline: Option<String>,
    /// Compare this run with a saved one (plain differences, not a verdict).
    pub baseline: Option<String>,
    pub vs_torch: bool,
    /// Run the gate A/A and against a planted slowdown of this fraction.
    pub self_test: Option<f64>,
    pub timeout: Duration,
}

impl Options {
    pub fn gate(&self) -> gate::Options {
        gate::Options {
            shapes: self.shapes.clone(),
            dtypes: self.dtypes.split(',').map(|d| d.trim().to_string()).collect(),
            variant: self.variant.clone(),
            budget_secs: self.gate_secs,
            seed: self.seed,
            explain: self.explain,
            ncu: crate::tools::toolchain::cuda_tool("ncu").map_err(|e| format!("{e:#}")),
        }
    }
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("bench")?;
    let cand = Side::new(drivers::binary(cx, "fa-bench")?, cx.kernels.clone(), cx.device.clone());
    let base = match (&opts.against, &opts.base_dir) {
        (Some(rev), _) => Some(build_revision(cx, rev)?),
        (None, Some(dir)) => {
            let bench = dir.join("fa-bench");
            Some(Side::new(
                if bench.is_file() { bench } else { cand.bench.clone() },
                dir.join("kernels"),
                cx.device.clone(),
            ))
        }
        (None, None) => None,
    };
    let dir = cx.reports().join("bench");
    let mut payload = BenchPayload::default();
    if let Some(plant) = opts.self_test {
        payload.mode = "self-test".into();
        payload.self_test = Some(self_test(&cand, plant, opts, &dir)?);
    } else if let Some(base) = &base {
        payload.mode = "gate".into();
        // The verdicts are saved as they stand before Nsight Compute explains them.
        let save_timed = |timed: &gate::GateRun| {
            let timed = BenchPayload { mode: "gate".into(), gate: Some(timed.clone()), ..BenchPayload::default() };
            let report = write_reports(cx, &envelope(cx, timed))?;
            eprintln!("gate: verdicts saved in {} (explanations follow)", report.display());
            Ok(())
        };
        payload.gate = Some(gate::run(base, &cand, &opts.gate(), &dir, save_timed)?);
    }
    if (base.is_none() && opts.self_test.is_none()) || opts.vs_torch {
        plain_runs(&cand, opts, &dir, &mut payload)?;
    }
    if let Some(g) = &payload.gate {
        println!("\n{}", gate_table(g));
    }
    if let Some(t) = &payload.self_test {
        println!("\n{}", self_test_table(t));
    }
    if opts.vs_torch {
        payload.torch = vs_torch(cx, &payload.runs, opts)?;
    }
    let mut envelope = envelope(cx, payload);
    if let Some(name) = &opts.baseline {
        let saved = compare::load(cx, name)?;
        let c = compare::compare(compare::Side::of(name, &saved), compare::Side::of("this run", &envelope));
        println!("\n{}", compare::render(&c));
        envelope.payload.baseline = Some(c);
    }
    let report = write_reports(cx, &envelope)?;
    println!("report: {} (and bench.md, bench.csv)", report.display());
    if let Some(name) = &opts.save_baseline {
        let path = compare::locate(cx, name);
        envelope.write(&path)?;
        println!("saved as baseline `{name}`: {}", path.display());
    }
    verdict(&envelope.payload)
}

/// The report of `payload`: this checkout, its kernel set and the device timed.
fn envelope(cx: &Run, payload: BenchPayload) -> Envelope<BenchPayload> {
    let device = device_of(&payload);
    let driver = device.as_ref().and_then(|d| d.driver.clone());
    Envelope::new(
        "bench",
        crate::tools::process::git_state(&cx.root),
        Toolchain { driver, ..Toolchain::default() },
        device.as_ref().map(Device::from),
        payload,
    )
    .kernels(crate::compile::kernel_set::reported(&cx.kernels))
}

/// bench.json (returned), bench.md and bench.csv, each replaced whole.
fn write_reports(cx: &Run, envelope: &Envelope<BenchPayload>) -> Result<std::path::PathBuf> {
    let report = cx.report("bench");
    envelope.write(&report)?;
    write_file(&cx.reports().join("bench.md"), markdown(&envelope.payload))?;
    write_file(&cx.reports().join("bench.csv"), csv(&envelope.payload))?;
    Ok(report)
}

fn device_of(p: &BenchPayload) -> Option<fa_schema::schema::DeviceInfo> {
    let gate = p.gate.as_ref().or(p.self_test.as_ref().map(|t| &t.aa));
    gate.map(|g| g.device.clone()).or_else(|| p.runs.first().map(|r| r.run.device.clone()))
}

/// The exit: a failing gate is a failed check; an unhealthy self-test means the
/// harness cannot judge (could not run).
fn verdict(p: &BenchPayload) -> Result<()> {
    if let Some(g) = &p.gate {
        let fails = g.failures();
        if !fails.is_empty() {
            let list: Vec<String> = fails
                .iter()
                .map(|s| {
                    format!(
                        "{} {} ({:+.2}% [{:+.2}%, {:+.2}%] after {} quads)",
                        s.name,
                        verdict_word(s.verdict),
                        s.change * 100.0,
                        s.ci_low * 100.0,
                        s.ci_high * 100.0,
                        s.quads
                    )
                })
                .collect();
            let inconclusive = fails.iter().any(|s| s.verdict == Verdict::Inconclusive);
            let hint = if inconclusive {
                "; an inconclusive shape fails too: rerun on a quiet GPU, or give it more time (--gate-secs)"
            } else {
                ""
            };
            return Err(CheckFailed(format!("the gate fails on {}{hint}", list.join(", "))).into());
        }
    }
    if let Some(t) = &p.self_test {
        let biased: Vec<&str> = t.shapes.iter().filter(|s| s.biased).map(|s| s.name.as_str()).collect();
        let missed: Vec<&str> = t.shapes.iter().filter(|s| !s.caught).map(|s| s.name.as_str()).collect();
        if !biased.is_empty() || !missed.is_empty() {
            return Err(CannotRun(format!(
                "the gate is not healthy on this GPU: A/A biased on [{}], planted {:.0}% slowdown missed on [{}]; \
                 look for other work on the GPU (preflight) before trusting its verdicts",
                biased.join(", "),
                t.planted * 100.0,
                missed.join(", ")
            ))
            .into());
        }
    }
    Ok(())
}

/// Base against base, then base against a copy of itself slowed by `plant`.
fn self_test(side: &Side, plant: f64, opts: &Options, dir: &Path) -> Result<SelfTest> {
    eprintln!("== bench --self-test: A/A");
    let aa = gate::run(side, side, &opts.gate(), &dir.join("self-test-aa"), |_| Ok(()))?;
    eprintln!("== bench --self-test: planted {:.1}% slowdown", plant * 100.0);
    let planted_side = Side { plant, ..side.clone() };
    let planted_run = gate::run(side, &planted_side, &opts.gate(), &dir.join("self-test-planted"), |_| Ok(()))?;
    Ok(SelfTest { planted: plant, shapes: self_test_shapes(&aa, &planted_run), aa, planted_run })
}

pub fn self_test_shapes(aa: &GateRun, planted: &GateRun) -> Vec<SelfTestShape> {
    aa.shapes
        .iter()
        .filter_map(|a| {
            let p = planted.shapes.iter().find(|p| p.name == a.name)?;
            Some(SelfTestShape {
                name: a.name.clone(),
                aa_change: a.change,
                aa_low: a.ci_low,
                aa_high: a.ci_high,
                aa_verdict: a.verdict,
                biased: a.ci_low > BIAS_LIMIT || a.ci_high < -BIAS_LIMIT || a.verdict != Verdict::Same,
                planted_change: p.change,
                planted_low: p.ci_low,
                planted_verdict: p.verdict,
                caught: p.verdict == Verdict::Regression,
            })
        })
        .collect()
}

/// Plain timing processes of the candidate: `--processes` of them for a
/// baseline (saved or compared) or `--vs-torch`, else one.
fn plain_runs(cand: &Side, opts: &Options, dir: &Path, payload: &mut BenchPayload) -> Result<()> {
    let more = opts.save_baseline.is_some() || opts.baseline.is_some() || opts.vs_torch;
    for i in 0..if more { opts.processes } else { 1 } {
        payload.runs.push(run_process(cand, "candidate", i, dir, opts)?);
    }
    print_runs(&payload.runs);
    if payload.mode.is_empty() {
        payload.mode = match (&opts.save_baseline, &opts.baseline) {
            (Some(name), _) => format!("save-baseline {name}"),
            (None, Some(name)) => format!("baseline {name}"),
            (None, None) => "single".into(),
        };
    }
    Ok(())
}

pub fn run_process(side: &Side, label: &str, i: usize, dir: &Path, opts: &Options) -> Result<ProcessRun> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join(format!("{label}-{i}.json"));
    let cmd = Cmd::new(&side.bench)
        .arg("--json")
        .arg(json.display().to_string())
        .args(["--dtype", &opts.dtypes, "--budget-ms", &opts.budget_ms.to_string()])
        .timeout(opts.timeout)
        .log(dir.join(format!("{label}-{i}.log")))
        .echo();
    let mut cmd = drivers::aim(cmd, &side.kernels, side.device.as_deref());
    for s in &opts.shapes {
        cmd = cmd.arg("--shape").arg(s.clone());
    }
    // Only when asked: a prebuilt base from before variants existed rejects the flag.
    if opts.variant != "auto" {
        cmd = cmd.args(["--variant", &opts.variant]);
    }
    let sampler = ClockSampler::start();
    let out = cmd.run()?;
    let clocks = sampler.stop();
    if !out.success() {
        return Err(CannotRun(format!("{} failed ({}): {}", side.bench.display(), out.status, out.tail())).into());
    }
    let run: BenchRun = read_json(&json)?;
    let sm_clock_mhz = run.device.uuid.as_deref().and_then(|u| clocks.get(u)).and_then(|s| busy_median(s));
    Ok(ProcessRun { side: label.into(), run, sm_clock_mhz })
}

/// Median SM clock over the samples taken while the GPU was busy (the top
/// three quarters; idle gaps between cases read low).
fn busy_median(samples: &[f64]) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| median(&s[s.len() / 4..]))
}

/// Builds `rev` in a git worktree under target/ (never touching the working tree):
/// its kernel-ffi binaries and its kernels, with this checkout's nvcc.
fn build_revision(cx: &Run, rev: &str) -> Result<Side> {
    let cargo = std::env::var_os("CARGO").context(
        "--against builds the base with cargo; on a machine without Rust, pass a prebuilt base with --base-dir",
    )?;
    let sha = crate::tools::process::git(&cx.root, &["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("`{rev}` is not a commit of {}", cx.root.display()))?;
    let wt = cx.reports().join("worktrees").join(&sha[..12]);
    if !wt.join("Cargo.toml").is_file() {
        Cmd::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(wt.display().to_string())
            .arg(&sha)
            .cwd(&cx.root)
            .run_checked()?;
    }
    let target = wt.join("target");
    let nvcc = toolchain::nvcc(&cx.cuda_wheels)?;
    Cmd::new(&cargo)
        .args(["build", "--locked", "--release", "--quiet", "-p", "kernel-ffi", "--bins"])
        .cwd(&wt)
        .env("CARGO_TARGET_DIR", target.display().to_string())
        .timeout(Duration::from_secs(1800))
        .log(cx.reports().join("bench/base-build.log"))
        .run_checked()
        .with_context(|| format!("building {rev} ({sha}) in {}", wt.display()))?;
    Cmd::new(&cargo)
        .args(["run", "--locked", "--release", "--quiet", "-p", "xtask", "--", "build"])
        .cwd(&wt)
        .env("CARGO_TARGET_DIR", target.display().to_string())
        .env("XTASK_ROOT", wt.display().to_string())
        .env("NVCC", nvcc.path.display().to_string())
        .timeout(Duration::from_secs(1800))
        .log(cx.reports().join("bench/base-kernels.log"))
        .run_checked()
        .with_context(|| format!("building {rev}'s kernels"))?;
    Ok(Side::new(target.join("release/fa-bench"), target.join("kernels"), cx.device.clone()))
}

/// PyTorch SDPA timed by `ci/bench_torch.py` in as many processes as our side ran,
/// compared median to median where both sides timed a case the same way.
pub fn vs_torch(cx: &Run, runs: &[ProcessRun], opts: &Options) -> Result<Vec<TorchRatio>> {
    let python = toolchain::python();
    // The shapes fa-bench ran, so both sides time the same cases.
    let mut shapes = Vec::new();
    // Serving shapes have their own anchors (ci/bench_serving.py), not dense SDPA.
    for c in runs.iter().flat_map(|r| &r.run.cases).filter(|c| c.kv_tbps.is_none()) {
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
        let json = cx.reports().join(format!("bench/torch-{i}.json"));
        let mut cmd = Cmd::new(&python)
            .arg(cx.root.join("ci/bench_torch.py").display().to_string())
            .arg("--json")
            .arg(json.display().to_string())
            .args(["--dtype", &opts.dtypes, "--budget-ms", &opts.budget_ms.to_string()])
            .timeout(opts.timeout)
            .log(cx.reports().join(format!("bench/torch-{i}.log")))
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
            let fa_us = median(m);
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
                    let us = median(&us);
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
                    c.kv_tbps.map_or("-".into(), |t| format!("{t:.2}")),
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
            &[
                "side",
                "case",
                "median us",
                "IQR",
                "rel sd",
                "n",
                "TFLOP/s",
                "KV TB/s",
                "CTAs",
                "splits",
                "method",
                "SM MHz"
            ],
            &rows
        )
    );
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", x * 100.0)
}

fn interval(lo: f64, hi: f64) -> String {
    format!("[{}, {}]", pct(lo), pct(hi))
}

fn clock_range(g: &gate::ShapeGate) -> String {
    g.sm_mhz.map_or("n/a".into(), |[lo, mid, hi]| format!("{mid:.0} ({lo:.0}-{hi:.0})"))
}

/// The gate's verdicts, one row per shape.
pub fn gate_table(g: &GateRun) -> String {
    let rows: Vec<Vec<String>> = g
        .shapes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                format!("{:.2}", s.base_us),
                format!("{:.2}", s.cand_us),
                pct(s.change),
                interval(s.ci_low, s.ci_high),
                format!("{}/{}", s.quads - s.set_aside, s.quads),
                clock_range(s),
                verdict_word(s.verdict).into(),
            ]
        })
        .collect();
    table::render(&["case", "base us", "cand us", "change", "interval", "quads", "SM MHz", "verdict"], &rows)
}

fn self_test_table(t: &SelfTest) -> String {
    let rows: Vec<Vec<String>> = t
        .shapes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                interval(s.aa_low, s.aa_high),
                if s.biased { "BIASED".into() } else { "ok".into() },
                pct(s.planted_change),
                verdict_word(s.planted_verdict).into(),
                if s.caught { "caught".into() } else { "MISSED".into() },
            ]
        })
        .collect();
    let planted = format!("planted +{:.1}%", t.planted * 100.0);
    table::render(&["case", "A/A interval", "A/A", &planted, "verdict", "power"], &rows)
}

/// The plain timings, one row per process and case, for spreadsheets.
pub fn csv(p: &BenchPayload) -> String {
    let mut out = String::from("side,process,case,method,samples,median_us,q1_us,q3_us,min_us,tflops\n");
    for (i, r) in p.runs.iter().enumerate() {
        for c in &r.run.cases {
            out.push_str(&format!(
                "{},{i},{},{},{},{},{},{},{},{}\n",
                r.side, c.name, c.method, c.samples, c.median_us, c.q1_us, c.q3_us, c.min_us, c.tflops
            ));
        }
    }
    out
}

pub fn markdown(p: &BenchPayload) -> String {
    let mut md = format!("### Bench ({})\n\n", p.mode);
    if let Some(g) = &p.gate {
        md.push_str(&format!(
            "Paired gate on {} ({}), seed {}, α {:.4} per shape; interval: anytime-valid, of the median per-quad ratio.\n\n",
            g.device.name,
            g.device.uuid.as_deref().unwrap_or("uuid n/a"),
            g.seed,
            g.rule.alpha
        ));
        md.push_str("| case | base µs | candidate µs | change | interval | quads | SM MHz | verdict |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---|\n");
        for s in &g.shapes {
            let mark = match s.verdict {
                Verdict::Regression => "❌ regression",
                Verdict::Improvement => "✅ improvement",
                Verdict::Same => "same",
                Verdict::Inconclusive => "❌ inconclusive",
            };
            md.push_str(&format!(
                "| {} | {:.2} | {:.2} | {} | {} | {}/{} | {} | {mark} |\n",
                s.name,
                s.base_us,
                s.cand_us,
                pct(s.change),
                interval(s.ci_low, s.ci_high),
                s.quads - s.set_aside,
                s.quads,
                clock_range(s)
            ));
        }
        if g.clocks_locked {
            md.push_str("\n> Clocks were locked (application or user-defined clocks) during the gate.\n");
        }
        let explained: Vec<_> = g.shapes.iter().filter(|s| !s.explanation.is_empty()).collect();
        if !explained.is_empty() {
            md.push_str("\nWhat differs where the gate saw a change (entry and plan from each side's fa-bench; ptxas and SASS of that entry from each side's kernel directory):\n");
            for s in explained {
                md.push_str(&format!("\n- **{}** ({})\n", s.name, verdict_word(s.verdict)));
                for line in &s.explanation {
                    md.push_str(&format!("  - {line}\n"));
                }
            }
        }
    }
    if let Some(t) = &p.self_test {
        md.push_str(&format!("Self-test: A/A and a planted +{:.1}% slowdown.\n\n", t.planted * 100.0));
        md.push_str("| case | A/A interval | A/A | planted change | verdict |\n|---|---:|---|---:|---|\n");
        for s in &t.shapes {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                s.name,
                interval(s.aa_low, s.aa_high),
                if s.biased { "❌ biased" } else { "ok" },
                pct(s.planted_change),
                if s.caught { "caught" } else { "❌ missed" }
            ));
        }
    }
    if let Some(c) = &p.baseline {
        md.push_str(&compare::markdown(c));
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
            serde_json::from_str(include_str!("../../tests/data/h200/bench-torch-sdpa.json")).unwrap();
        let fa = BTreeMap::from([("f16-b4h16s2048d128".to_string(), vec![240.0])]);
        let methods = BTreeMap::from([("f16-b4h16s2048d128".to_string(), "events-cold-l2".to_string())]);
        let r = torch_ratios(&fa, &methods, &torch);
        let names: Vec<&str> = r[0].backends.keys().map(String::as_str).collect();
        assert_eq!(names, ["torch-cudnn", "torch-default", "torch-efficient", "torch-flash"]);
        for (us, x) in r[0].backends.values() {
            assert!(us.is_finite() && *us > 100.0 && (x - us / 240.0).abs() < 1e-12, "{us} {x}");
        }
    }

    fn gate_shape(name: &str, change: f64, lo: f64, hi: f64, verdict: Verdict) -> gate::ShapeGate {
        let rule = gate::sequence::Rule::for_shapes(1, 6.0);
        gate::ShapeGate {
            change,
            ci_low: lo,
            ci_high: hi,
            ..gate::summarise(
                name.into(),
                "events-cold-l2".into(),
                (1, 1e9),
                Default::default(),
                &rule,
                vec![],
                verdict,
                1.0,
            )
        }
    }

    fn gate_run(shapes: Vec<gate::ShapeGate>) -> GateRun {
        GateRun {
            device: fa_schema::schema::DeviceInfo {
                name: "NVIDIA H100 80GB HBM3".into(),
                compute_capability: "9.0".into(),
                sm_count: 132,
                driver: None,
                uuid: Some("GPU-62b9475d-913e-016c-1900-e1ee75cb8d6c".into()),
            },
            rule: gate::sequence::Rule::for_shapes(shapes.len(), 6.0),
            seed: 2,
            clocks_locked: false,
            monitored: true,
            shapes,
            not_gated: Vec::new(),
        }
    }

    #[test]
    fn the_self_test_flags_a_biased_aa_and_a_missed_plant() {
        let aa = gate_run(vec![
            gate_shape("steady", 0.0002, -0.0004, 0.0006, Verdict::Same),
            gate_shape("offset", -0.0098, -0.0104, -0.0092, Verdict::Same),
        ]);
        let planted = gate_run(vec![
            gate_shape("steady", 0.03, 0.028, 0.032, Verdict::Regression),
            gate_shape("offset", 0.0198, 0.019, 0.021, Verdict::Inconclusive),
        ]);
        let shapes = self_test_shapes(&aa, &planted);
        assert_eq!((shapes[0].biased, shapes[0].caught), (false, true));
        assert_eq!((shapes[1].biased, shapes[1].caught), (true, false));
        let payload = |t: Option<SelfTest>, g: Option<GateRun>| BenchPayload {
            mode: "x".into(),
            gate: g,
            self_test: t,
            ..BenchPayload::default()
        };
        let t = SelfTest { planted: 0.03, shapes, aa: aa.clone(), planted_run: planted.clone() };
        let err = verdict(&payload(Some(t), None)).unwrap_err();
        assert!(err.downcast_ref::<CannotRun>().is_some_and(|e| e.0.contains("biased on [offset]")), "{err}");
        // The same run as a gate: an inconclusive shape fails, naming it and what to try.
        let err = verdict(&payload(None, Some(planted))).unwrap_err();
        let msg = err.downcast_ref::<CheckFailed>().unwrap().0.clone();
        assert!(msg.contains("steady REGRESSION") && msg.contains("offset INCONCLUSIVE"), "{msg}");
        assert!(msg.contains("--gate-secs"), "{msg}");
        assert!(verdict(&payload(None, Some(aa.clone()))).is_ok());
        let md = markdown(&payload(None, Some(aa)));
        assert!(md.contains("GPU-62b9475d") && md.contains("| offset | ") && md.contains("[-1.04%, -0.92%]"), "{md}");
        assert!(!md.contains("What differs"), "{md}");
        // A regression's explanation goes into bench.md under its shape.
        let mut slow = gate_shape("slow", 0.05, 0.04, 0.06, Verdict::Regression);
        slow.explanation = vec!["plan: splits 1 → 3, CTAs 132 → 396".into()];
        let md = markdown(&payload(None, Some(gate_run(vec![slow]))));
        assert!(md.contains("- **slow** (REGRESSION)\n  - plan: splits 1 → 3, CTAs 132 → 396"), "{md}");
    }
}
