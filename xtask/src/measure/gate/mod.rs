//! The no >2% regression gate. The base and the candidate are two builds, each
//! a long-lived `fa-bench --serve` with its own CUDA context and buffers, timed
//! turn by turn (never at once) in quads: A B B A or B A A B in a seeded order,
//! a few launches per half, L2 flushed. Each quad gives r = ln((B₁+B₂)/(A₁+A₂)),
//! which cancels linear drift of the clock within the quad; each shape measures
//! until its confidence sequence (`sequence`) decides or its budget runs out.
//!
//! Clocks are diagnostics: the SM clock is read by a probe kernel in every quad
//! and NVML's clock-event reasons beside it. A candidate that runs at a lower
//! clock because it draws more power is slower, so no quad is dropped or scaled
//! for its clock; only quads under a hardware slowdown (thermal, power brake)
//! are set aside, and more than 10% of those leaves the shape inconclusive.

pub mod monitor;
pub mod sequence;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::measure::explain::{Facts, Launch, Plan, explain, profile_lines};
use crate::measure::profile::{self, Launch as Profiled, Target};
use crate::tools::drivers;
use crate::tools::process::{Cmd, Session};
use crate::tools::progress::Progress;
use fa_schema::schema::{DeviceInfo, EntryRecord, SERVE_PROTOCOL, ServeReply, ServeRequest};
use fa_schema::shape::Shape;
use fa_schema::tensor::Dtype;
use monitor::Monitor;
use sequence::{Rule, Step, Verdict};

/// One side of a comparison: a bench binary and the kernels it loads.
#[derive(Debug, Clone)]
pub struct Side {
    pub bench: PathBuf,
    pub kernels: PathBuf,
    /// The GPU it opens (the run's `--device`); none lets CUDA pick.
    pub device: Option<String>,
    /// `fa-bench --plant-slowdown`: 0 except for the self-test's planted side.
    pub plant: f64,
}

impl Side {
    pub fn new(bench: PathBuf, kernels: PathBuf, device: Option<String>) -> Side {
        Side { bench, kernels, device, plant: 0.0 }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Shapes `B,H,S,D[,causal]`; empty: the candidate's default set.
    pub shapes: Vec<String>,
    pub dtypes: Vec<String>,
    /// `fa-bench --variant`, where not auto.
    pub variant: String,
    /// Most seconds of quads per shape.
    pub budget_secs: f64,
    /// Seeds the quads' order.
    pub seed: u64,
    /// Explain every shape (`explain::explain`), not only regressions and improvements.
    pub explain: bool,
    /// Nsight Compute, to profile both sides of the explained shapes, or why there is none.
    pub ncu: Result<PathBuf, String>,
}

/// Calls per half: enough that a half of short calls outlasts the pipe's round trip.
const HALF_US_EVENTS: f64 = 400.0;
const HALF_US_GRAPH: f64 = 300.0;
/// Quads run and discarded after each setup (first replays, clock settling).
const WARMUP_QUADS: usize = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quad {
    /// A B B A (true) or B A A B.
    pub base_first: bool,
    /// µs per call of each half, in the order they ran on that side.
    pub base_us: [f64; 2],
    pub cand_us: [f64; 2],
    pub r: f64,
    /// SM clock read by the probe kernel after the quad's second half.
    pub sm_mhz: Option<f64>,
    /// NVML clock-event reasons after the quad.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Under a hardware slowdown: not counted.
    #[serde(default)]
    pub set_aside: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeGate {
    pub name: String,
    pub method: String,
    /// Calls per half.
    pub launches: usize,
    pub base_entry: EntryRecord,
    pub cand_entry: EntryRecord,
    /// Each side's split plan (absent from reports before it was recorded).
    #[serde(default)]
    pub base_plan: Plan,
    #[serde(default)]
    pub cand_plan: Plan,
    /// A regression's or an improvement's explanation (`explain::explain`);
    /// every shape's with `bench --explain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explanation: Vec<String>,
    /// Nsight Compute's metrics of each side's kernel launch on the shape,
    /// profiled after the timing, where the shape was explained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_profile: Option<Profiled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cand_profile: Option<Profiled>,
    /// Median µs per call over the counted quads.
    pub base_us: f64,
    pub cand_us: f64,
    pub cand_tflops: f64,
    /// exp(median r) − 1 and the confidence sequence's interval, as fractions: positive is slower.
    pub change: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub verdict: Verdict,
    pub quads: usize,
    pub set_aside: usize,
    pub seconds: f64,
    /// SM clock over the quads: 10th percentile, median, 90th percentile.
    pub sm_mhz: Option<[f64; 3]>,
    /// How many quads saw each clock-event reason.
    pub reasons: BTreeMap<String, usize>,
    pub quad_log: Vec<Quad>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRun {
    pub device: DeviceInfo,
    pub rule: Rule,
    pub seed: u64,
    /// NVML reported application or user-defined clocks (locked by an admin).
    pub clocks_locked: bool,
    /// Whether NVML could be read for the reasons.
    pub monitored: bool,
    pub shapes: Vec<ShapeGate>,
    /// Shapes of the candidate's default set that the base's lacks (a shape
    /// added with the change): timed by the bench, not gated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_gated: Vec<String>,
}

impl GateRun {
    /// Shapes the gate fails on: regressions and inconclusive ones.
    pub fn failures(&self) -> Vec<&ShapeGate> {
        self.shapes.iter().filter(|s| s.verdict.fails()).collect()
    }
}

/// A bench server: one side's `fa-bench --serve`.
struct Server {
    label: &'static str,
    session: Session,
    hello: (DeviceInfo, Vec<String>),
}

impl Server {
    fn start(side: &Side, label: &'static str, opts: &Options, dir: &Path) -> Result<Server> {
        let cmd = Cmd::new(&side.bench).arg("--serve").log(dir.join(format!("{label}-serve.log")));
        let mut cmd = drivers::aim(cmd, &side.kernels, side.device.as_deref());
        if side.plant > 0.0 {
            cmd = cmd.args(["--plant-slowdown".to_string(), side.plant.to_string()]);
        }
        if opts.variant != "auto" {
            cmd = cmd.args(["--variant", &opts.variant]);
        }
        let mut session = cmd.session()?;
        let line = session.read_line(Duration::from_secs(300)).with_context(|| format!("starting the {label}"))?;
        let hello = match serde_json::from_str::<ServeReply>(&line) {
            Ok(ServeReply::Hello { protocol: SERVE_PROTOCOL, device, default_shapes }) => (device, default_shapes),
            Ok(ServeReply::Hello { protocol, .. }) => bail!(
                "the {label}'s fa-bench speaks serve protocol {protocol}, this xtask {SERVE_PROTOCOL}: \
                 build both sides from one revision of the gate"
            ),
            _ => bail!(
                "the {label}'s fa-bench ({}) does not serve the paired gate (it answered `{line}`); \
                 a base built before the paired gate cannot be compared: pass --base-dir with a \
                 newer build, or its kernels alone (DIR/kernels) to time them with this fa-bench",
                side.bench.display()
            ),
        };
        Ok(Server { label, session, hello })
    }

    fn ask(&mut self, req: &ServeRequest, timeout: Duration) -> Result<ServeReply> {
        let line = serde_json::to_string(req)?;
        let answer = self.session.request(&line, timeout).with_context(|| format!("the {} server", self.label))?;
        match serde_json::from_str::<ServeReply>(&answer) {
            Ok(ServeReply::Error { message }) => bail!("the {} server: {message}", self.label),
            Ok(reply) => Ok(reply),
            Err(e) => bail!("the {} server answered `{answer}`: {e}", self.label),
        }
    }

    /// The case's method, µs per call, entry, plan and FLOP per call.
    fn setup(
        &mut self,
        shape: &str,
        dtype: &str,
        method: Option<&str>,
    ) -> Result<(String, f64, EntryRecord, Plan, f64)> {
        let req = ServeRequest::Setup { shape: shape.into(), dtype: dtype.into(), method: method.map(String::from) };
        match self.ask(&req, Duration::from_secs(300))? {
            ServeReply::Ready { method, estimate_us, entry, flops, num_splits, ctas, .. } => {
                Ok((method, estimate_us, entry, Plan { num_splits, ctas }, flops))
            }
            other => bail!("the {} server answered setup with {other:?}", self.label),
        }
    }

    fn time(&mut self, launches: usize, probe: bool) -> Result<(f64, Option<f64>)> {
        match self.ask(&ServeRequest::Time { launches, probe }, Duration::from_secs(120))? {
            ServeReply::Timed { us, sm_mhz } if us.is_finite() && us > 0.0 => Ok((us, sm_mhz)),
            other => bail!("the {} server answered time with {other:?}", self.label),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ =
            serde_json::to_string(&ServeRequest::Quit).map(|q| self.session.request(&q, Duration::from_millis(200)));
    }
}

/// Calls per half for a call of `estimate_us` timed by `method`.
pub fn launches_per_half(method: &str, estimate_us: f64) -> usize {
    let est = estimate_us.max(0.5);
    if method == "graph-replay" {
        ((HALF_US_GRAPH / est).ceil() as usize).clamp(10, 500)
    } else {
        ((HALF_US_EVENTS / est).ceil() as usize).clamp(1, 64)
    }
}

/// splitmix64: the quads' order, reproducible from the seed in the report.
struct Coin(u64);
impl Coin {
    fn flip(&mut self) -> bool {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) & 1 == 1
    }
}

/// Runs the gate over every case; the servers are stopped on return.
/// `timed` gets the verdicts before Nsight Compute explains them (which can
/// take minutes), so that a run stopped then loses none: bench saves them.
pub fn run(
    base: &Side,
    cand: &Side,
    opts: &Options,
    dir: &Path,
    timed: impl FnOnce(&GateRun) -> Result<()>,
) -> Result<GateRun> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut b = Server::start(base, "base", opts, dir)?;
    let mut c = Server::start(cand, "candidate", opts, dir)?;
    let device = c.hello.0.clone();
    if b.hello.0.uuid != device.uuid {
        bail!(
            "base and candidate servers opened different GPUs ({:?} and {:?}); a comparison needs one",
            b.hello.0.uuid,
            device.uuid
        );
    }
    let (shapes, not_gated) =
        if opts.shapes.is_empty() { gated_defaults(&b.hello.1, &c.hello.1) } else { (opts.shapes.clone(), Vec::new()) };
    if !not_gated.is_empty() {
        eprintln!("gate: not in the base's default set, so not gated: {}", not_gated.join(", "));
    }
    let (cases, untaken): (Vec<(&str, &str)>, Vec<_>) = opts
        .dtypes
        .iter()
        .flat_map(|d| shapes.iter().map(move |s| (s.as_str(), d.as_str())))
        .partition(|&(s, d)| takes(s, d));
    if !untaken.is_empty() {
        let names: Vec<String> = untaken.iter().map(|(s, d)| format!("{d} {s}")).collect();
        eprintln!("gate: serving shapes take 16-bit inputs, so not gated: {}", names.join(", "));
    }
    let rule = Rule::for_shapes(cases.len(), opts.budget_secs);
    let monitor = Monitor::open(device.uuid.as_deref());
    let mut coin = Coin(opts.seed);
    // Each (kernel directory, entry)'s build facts, read once for every shape that explains it.
    let mut known: BTreeMap<(PathBuf, String), Facts> = BTreeMap::new();
    let mut facts = |side: &Side, entry: &EntryRecord| {
        let key = (side.kernels.clone(), entry.kernel.clone());
        known
            .entry(key)
            .or_insert_with(|| Facts::load(&side.kernels, &device.compute_capability, &entry.kernel))
            .clone()
    };
    let mut results = Vec::new();
    let mut clocks_locked = false;
    let progress = Progress::bar("gate", cases.len() as u64);
    for (i, (shape, dtype)) in cases.iter().enumerate() {
        progress.message(&format!("{dtype} {shape}"));
        let (method, estimate, base_entry, base_plan, flops) =
            b.setup(shape, dtype, None).with_context(|| format!("setting up {dtype} {shape}"))?;
        let (_, _, cand_entry, cand_plan, _) =
            c.setup(shape, dtype, Some(&method)).with_context(|| format!("setting up {dtype} {shape}"))?;
        let launches = launches_per_half(&method, estimate);
        let mut quads = Vec::new();
        let mut sorted = Vec::new();
        let mut set_aside = 0;
        let start = Instant::now();
        let mut warm = 0;
        let verdict = loop {
            let base_first = coin.flip();
            let mut halves = [0.0; 4];
            let mut sm_mhz = None;
            for (h, half) in halves.iter_mut().enumerate() {
                // A B B A: the base runs halves 0 and 3; B A A B: halves 1 and 2.
                let base_turn = (h == 0 || h == 3) == base_first;
                let server = if base_turn { &mut b } else { &mut c };
                let (us, mhz) = server.time(launches, h == 1)?;
                *half = us;
                sm_mhz = sm_mhz.or(mhz);
            }
            if warm < WARMUP_QUADS {
                warm += 1;
                continue;
            }
            let (base_us, cand_us) = if base_first {
                ([halves[0], halves[3]], [halves[1], halves[2]])
            } else {
                ([halves[1], halves[2]], [halves[0], halves[3]])
            };
            let r = sequence::log_ratio(base_us, cand_us);
            let reasons: Vec<String> =
                monitor.as_ref().map(|m| m.reasons().into_iter().map(String::from).collect()).unwrap_or_default();
            clocks_locked |= reasons.iter().any(|r| r == "applications_clocks");
            let aside = reasons.iter().any(|r| monitor::HARDWARE.contains(&r.as_str()));
            if aside {
                set_aside += 1;
            } else {
                sequence::insert_sorted(&mut sorted, r);
            }
            quads.push(Quad { base_first, base_us, cand_us, r, sm_mhz, reasons, set_aside: aside });
            if let Step::Stop(v) = sequence::step(&rule, &sorted, set_aside, quads.len(), start.elapsed().as_secs_f64())
            {
                break v;
            }
        };
        let mut g = summarise(
            case_name(dtype, shape),
            method,
            (launches, flops),
            (base_entry, cand_entry),
            &rule,
            quads,
            verdict,
            start.elapsed().as_secs_f64(),
        );
        (g.base_plan, g.cand_plan) = (base_plan, cand_plan);
        if opts.explain || matches!(g.verdict, Verdict::Regression | Verdict::Improvement) {
            let (bf, cf) = (facts(base, &g.base_entry), facts(cand, &g.cand_entry));
            g.explanation = explain(
                Launch { entry: &g.base_entry, plan: g.base_plan, facts: &bf },
                Launch { entry: &g.cand_entry, plan: g.cand_plan, facts: &cf },
            );
        }
        progress.report(&format!(
            "gate {:>2}/{}: {:<28} {:>5} quads {:>4.1} s  {:+.2}% [{:+.2}%, {:+.2}%]  {}",
            i + 1,
            cases.len(),
            g.name,
            g.quads,
            g.seconds,
            g.change * 100.0,
            g.ci_low * 100.0,
            g.ci_high * 100.0,
            verdict_word(g.verdict)
        ));
        for line in &g.explanation {
            progress.report(&format!("    {line}"));
        }
        results.push(g);
    }
    drop(progress);
    drop((b, c));
    let mut gate = GateRun {
        device,
        rule,
        seed: opts.seed,
        clocks_locked,
        monitored: monitor.is_some(),
        shapes: results,
        not_gated,
    };
    timed(&gate)?;
    profile_explained(base, cand, opts, dir, &gate.device.compute_capability, &cases, &mut gate.shapes);
    Ok(gate)
}

/// Nsight Compute on both sides of every explained shape, after the timing (no
/// server is running then): one ncu per side and dtype over those shapes, each
/// launched once. A side that cannot be profiled says why in the explanation;
/// the verdict stands.
fn profile_explained(
    base: &Side,
    cand: &Side,
    opts: &Options,
    dir: &Path,
    cc: &str,
    cases: &[(&str, &str)],
    results: &mut [ShapeGate],
) {
    let explained: Vec<usize> = (0..results.len()).filter(|&i| !results[i].explanation.is_empty()).collect();
    if explained.is_empty() {
        return;
    }
    let ncu = if base.plant > 0.0 || cand.plant > 0.0 {
        Err("the self-test's slowdown is planted outside the kernels".to_string())
    } else {
        opts.ncu.clone()
    };
    let metrics = profile::metrics_for(cc);
    let mut why: BTreeMap<usize, String> = BTreeMap::new();
    for dtype in &opts.dtypes {
        let mine: Vec<usize> = explained.iter().copied().filter(|&i| cases[i].1 == dtype).collect();
        if mine.is_empty() {
            continue;
        }
        let ncu = match &ncu {
            Ok(p) => p,
            Err(e) => {
                why.extend(mine.iter().map(|&i| (i, e.clone())));
                continue;
            }
        };
        let shapes: Vec<String> = mine.iter().map(|&i| cases[i].0.to_string()).collect();
        eprintln!("gate: Nsight Compute on both sides of {} explained {dtype} shape(s)", shapes.len());
        let mut args = vec!["--dtype".to_string(), dtype.clone()];
        if opts.variant != "auto" {
            args.extend(["--variant".to_string(), opts.variant.clone()]);
        }
        for (side, label) in [(base, "base"), (cand, "candidate")] {
            let target =
                Target { bench: &side.bench, kernels: &side.kernels, device: side.device.as_deref(), args: &args };
            let log = dir.join(format!("ncu-{label}-{dtype}.log"));
            match profile::profile_shapes(ncu, &target, &metrics, &shapes, false, NCU_TIMEOUT, &log, None) {
                Ok(profiles) => {
                    for (&i, p) in mine.iter().zip(profiles) {
                        let launch = p.launches.into_iter().next();
                        if label == "base" {
                            results[i].base_profile = launch;
                        } else {
                            results[i].cand_profile = launch;
                        }
                    }
                }
                Err(e) => why.extend(mine.iter().map(|&i| (i, format!("the {label}: {e:#}")))),
            }
        }
    }
    for &i in &explained {
        let g = &mut results[i];
        let lines = match (&g.base_profile, &g.cand_profile, why.get(&i)) {
            (Some(b), Some(c), _) => profile_lines(b, c),
            (.., Some(w)) => vec![format!("ncu: not profiled ({w})")],
            _ => vec!["ncu: not profiled (no launch of the entry in its output)".to_string()],
        };
        for line in &lines {
            eprintln!("    {}: {line}", g.name);
        }
        g.explanation.extend(lines);
    }
}

/// Most seconds of one side's ncu run over the explained shapes.
const NCU_TIMEOUT: Duration = Duration::from_secs(600);

/// The candidate's default shapes the base also has (gated), and the others
/// (new with the candidate: a base cannot time a shape it does not know).
pub fn gated_defaults(base: &[String], cand: &[String]) -> (Vec<String>, Vec<String>) {
    cand.iter().cloned().partition(|s| base.contains(s))
}

/// Whether a shape spec takes inputs of `dtype` (`Shape::takes`); what does
/// not parse is kept, for the servers to refuse by name.
pub fn takes(spec: &str, dtype: &str) -> bool {
    match (Dtype::parse(dtype), Shape::parse(spec)) {
        (Ok(dtype), Ok(shape)) => shape.takes(dtype),
        _ => true,
    }
}

/// fa-bench's case name for a shape spec and dtype (`Shape::name`), e.g.
/// `f16-b2h16s8192d128-causal`; the spec and dtype as given where they do not parse.
pub fn case_name(dtype: &str, spec: &str) -> String {
    match (Dtype::parse(dtype), Shape::parse(spec)) {
        (Ok(dtype), Ok(shape)) => shape.name(dtype),
        _ => format!("{dtype}-{spec}"),
    }
}

pub fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Same => "same",
        Verdict::Inconclusive => "INCONCLUSIVE",
    }
}

/// One shape's record from its quads.
#[allow(clippy::too_many_arguments)]
pub fn summarise(
    name: String,
    method: String,
    (launches, flops): (usize, f64),
    (base_entry, cand_entry): (EntryRecord, EntryRecord),
    rule: &Rule,
    quad_log: Vec<Quad>,
    verdict: Verdict,
    seconds: f64,
) -> ShapeGate {
    let counted: Vec<&Quad> = quad_log.iter().filter(|q| !q.set_aside).collect();
    let sorted_of = |f: &dyn Fn(&Quad) -> f64| {
        let mut v: Vec<f64> = counted.iter().map(|q| f(q)).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let rs = sorted_of(&|q| q.r);
    let (lo, hi) = sequence::median_interval(&rs, rule.alpha);
    let mut clocks: Vec<f64> = quad_log.iter().filter_map(|q| q.sm_mhz).filter(|m| m.is_finite()).collect();
    clocks.sort_by(f64::total_cmp);
    let pct = |p: f64| clocks[((clocks.len() - 1) as f64 * p).round() as usize];
    let cand_us = sequence::sorted_median(&sorted_of(&|q| (q.cand_us[0] + q.cand_us[1]) / 2.0));
    let mut reasons = BTreeMap::new();
    for r in quad_log.iter().flat_map(|q| &q.reasons) {
        *reasons.entry(r.clone()).or_insert(0) += 1;
    }
    ShapeGate {
        name,
        method,
        launches,
        base_entry,
        cand_entry,
        base_plan: Plan::default(),
        cand_plan: Plan::default(),
        explanation: Vec::new(),
        base_profile: None,
        cand_profile: None,
        base_us: sequence::sorted_median(&sorted_of(&|q| (q.base_us[0] + q.base_us[1]) / 2.0)),
        cand_us,
        cand_tflops: flops / (cand_us * 1e-6) / 1e12,
        change: sequence::sorted_median(&rs).exp_m1(),
        ci_low: lo.exp_m1(),
        ci_high: hi.exp_m1(),
        verdict,
        quads: quad_log.len(),
        set_aside: quad_log.len() - counted.len(),
        seconds,
        sm_mhz: (!clocks.is_empty()).then(|| [pct(0.1), pct(0.5), pct(0.9)]),
        reasons,
        quad_log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_are_sized_by_method() {
        assert_eq!(launches_per_half("events-cold-l2", 1700.0), 1);
        assert_eq!(launches_per_half("events-cold-l2", 156.0), 3);
        assert_eq!(launches_per_half("events-cold-l2", 0.0), 64);
        assert_eq!(launches_per_half("graph-replay", 2.9), 104);
        assert_eq!(launches_per_half("graph-replay", 29.0), 11);
    }

    #[test]
    fn case_names_match_fa_bench() {
        assert_eq!(case_name("f16", "2,16,8192,128,causal"), "f16-b2h16s8192d128-causal");
        assert_eq!(case_name("f16", "1,1,32,64"), "f16-b1h1s32d64");
        // Serving shapes keep their kind, K/V heads and mask (once `f16-bvarlen:16h32s8d8192`).
        assert_eq!(case_name("bf16", "varlen:16,32,8,8192,128,causal"), "bf16-varlen-b16h32kv8s8192d128-causal");
        assert_eq!(case_name("f16", "paged:64,32,8,32768,128,16"), "f16-paged16-b64h32kv8s32768d128");
    }

    #[test]
    fn shapes_new_in_the_candidates_default_set_are_not_gated() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (gated, new) =
            gated_defaults(&v(&["1,1,32,64", "2,8,512,64"]), &v(&["1,1,32,64", "varlen:16,32,8,8192,128,causal"]));
        assert_eq!((gated, new), (v(&["1,1,32,64"]), v(&["varlen:16,32,8,8192,128,causal"])));
    }

    #[test]
    fn e4m3_is_gated_on_dense_shapes_only() {
        assert!(takes("2,16,8192,128,causal", "e4m3") && takes("varlen:16,32,8,8192,128,causal", "f16"));
        assert!(!takes("varlen:16,32,8,8192,128,causal", "e4m3") && !takes("paged:64,32,8,32768,128,16", "e4m3"));
        assert!(takes("not a shape", "e4m3"), "left for the servers to refuse by name");
    }

    #[test]
    fn the_coin_is_seeded_and_fair() {
        let flips: Vec<bool> = {
            let mut c = Coin(42);
            (0..2000).map(|_| c.flip()).collect()
        };
        let again: Vec<bool> = {
            let mut c = Coin(42);
            (0..2000).map(|_| c.flip()).collect()
        };
        assert_eq!(flips, again);
        let heads = flips.iter().filter(|&&f| f).count();
        assert!((900..1100).contains(&heads), "{heads}");
    }

    #[test]
    fn a_summary_counts_only_quads_not_set_aside() {
        let q = |r: f64, aside: bool| Quad {
            base_first: true,
            base_us: [100.0, 100.0],
            cand_us: [100.0 * r.exp(), 100.0 * r.exp()],
            r,
            sm_mhz: Some(1980.0),
            reasons: if aside { vec!["hw_slowdown".into()] } else { vec![] },
            set_aside: aside,
        };
        let mut log: Vec<Quad> = (0..300).map(|i| q(0.03 + (i % 7) as f64 * 1e-4, false)).collect();
        log.push(q(-0.5, true));
        let rule = Rule::for_shapes(14, 6.0);
        let g = summarise(
            "x".into(),
            "events-cold-l2".into(),
            (1, 2e9),
            Default::default(),
            &rule,
            log,
            Verdict::Regression,
            2.0,
        );
        assert_eq!((g.quads, g.set_aside), (301, 1));
        assert!(g.change > 0.03 && g.ci_low > 0.02, "{g:?}");
        assert_eq!(g.reasons["hw_slowdown"], 1);
        assert_eq!(g.sm_mhz, Some([1980.0; 3]));
    }
}

/// The whole gate through real processes: a protocol stand-in for fa-bench
/// (tests/data/fake-serve.py) whose two sides share a two-level clock.
#[cfg(test)]
mod process_tests {
    use super::*;

    fn data(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
    }

    /// A side served by the stand-in, `factor` slower; no executable is written
    /// here (a file being written while another test forks cannot be run).
    fn fake(dir: &Path, factor: f64) -> Side {
        let side = dir.join(format!("side-{factor}"));
        std::fs::create_dir_all(&side).unwrap();
        std::fs::write(side.join("factor"), factor.to_string()).unwrap();
        Side::new(data("fake-serve.py"), side, None)
    }

    fn opts() -> Options {
        Options {
            shapes: vec![],
            dtypes: vec!["f16".into()],
            variant: "auto".into(),
            budget_secs: 6.0,
            seed: 1,
            explain: false,
            ncu: Ok(data("fake-ncu.py")),
        }
    }

    #[test]
    fn three_percent_slower_is_caught_on_every_shape_and_identical_is_same() {
        let d = tempfile::tempdir().unwrap();
        let (base, slow) = (fake(d.path(), 1.0), fake(d.path(), 1.03));
        let mut timed = None;
        let g = run(&base, &slow, &opts(), &d.path().join("slow"), |t| {
            timed = Some(t.clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(g.shapes.len(), 2, "the candidate's default shapes");
        for s in &g.shapes {
            assert_eq!(
                s.verdict,
                Verdict::Regression,
                "{}: {:+.4} [{:+.4}, {:+.4}]",
                s.name,
                s.change,
                s.ci_low,
                s.ci_high
            );
            assert!(s.quad_log.len() >= 64 && s.sm_mhz.is_some());
            // Explained, with both sides profiled: the duration and the stall that moved.
            let (b, c) = (s.base_profile.as_ref().unwrap(), s.cand_profile.as_ref().unwrap());
            assert!(c.duration_us.unwrap() > b.duration_us.unwrap(), "{b:?} {c:?}");
            let text = s.explanation.join("\n");
            assert!(text.contains("ncu moved most: stall wait"), "{text}");
        }
        // The verdicts were handed over (to be saved) before Nsight Compute ran.
        let timed = timed.expect("the verdicts, before the profiles");
        assert_eq!(timed.shapes.len(), g.shapes.len());
        for (t, s) in timed.shapes.iter().zip(&g.shapes) {
            assert_eq!((t.verdict, t.quads), (s.verdict, s.quads));
            assert!(t.base_profile.is_none() && t.cand_profile.is_none(), "{}: profiled already", t.name);
        }
        let g = run(&base, &base, &opts(), &d.path().join("same"), |_| Ok(())).unwrap();
        for s in &g.shapes {
            assert_eq!(s.verdict, Verdict::Same, "{}: [{:+.4}, {:+.4}]", s.name, s.ci_low, s.ci_high);
            assert!(s.ci_low > -0.005 && s.ci_high < 0.005, "{}: wider than ±0.5%", s.name);
        }
        // The planted side of the self-test is the same binary with --plant-slowdown.
        let planted = Side { plant: 0.03, ..base.clone() };
        let g =
            run(&base, &planted, &Options { shapes: vec!["1,1,64,64".into()], ..opts() }, &d.path().join("p"), |_| {
                Ok(())
            })
            .unwrap();
        assert_eq!(g.shapes[0].verdict, Verdict::Regression);
        assert!(g.shapes[0].explanation.iter().any(|l| l.contains("not profiled (the self-test")));
        // Without ncu the explanation says so, and the verdict stands.
        let none = Options { ncu: Err("ncu not found".into()), ..opts() };
        let g =
            run(&base, &slow, &Options { shapes: vec!["1,1,64,64".into()], ..none }, &d.path().join("n"), |_| Ok(()))
                .unwrap();
        assert_eq!(g.shapes[0].verdict, Verdict::Regression);
        assert!(g.shapes[0].explanation.iter().any(|l| l == "ncu: not profiled (ncu not found)"));
    }

    #[test]
    fn a_base_without_the_serve_protocol_is_refused_clearly() {
        let d = tempfile::tempdir().unwrap();
        let old = Side::new(data("old-fa-bench.sh"), d.path().into(), None);
        let err = run(&old, &fake(d.path(), 1.0), &opts(), d.path(), |_| Ok(())).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("starting the base") && msg.contains("unexpected argument --serve"), "{msg}");
    }
}
