//! The bench report's payload: what `bench` writes to target/xtask/bench.json
//! and `bench compare`, `iterate` and `summary` read back.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::measure::gate::GateRun;
use crate::measure::gate::sequence::Verdict;
use fa_schema::schema::BenchRun;

/// One fa-bench process: its results and the SM clock sampled while it ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessRun {
    pub side: String,
    pub run: BenchRun,
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

/// `--self-test`: the gate's health on this GPU, per shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelfTest {
    /// The planted slowdown, a fraction of each timed half.
    pub planted: f64,
    pub shapes: Vec<SelfTestShape>,
    /// The two gate runs behind it, quads included.
    pub aa: GateRun,
    pub planted_run: GateRun,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelfTestShape {
    pub name: String,
    pub aa_change: f64,
    pub aa_low: f64,
    pub aa_high: f64,
    pub aa_verdict: Verdict,
    /// The A/A interval excludes 0 by more than `BIAS_LIMIT`: the harness, not the code.
    pub biased: bool,
    pub planted_change: f64,
    pub planted_low: f64,
    pub planted_verdict: Verdict,
    pub caught: bool,
}

/// An A/A interval that excludes zero by more than this marks the harness biased.
pub const BIAS_LIMIT: f64 = 0.003;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchPayload {
    pub mode: String,
    pub runs: Vec<ProcessRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_test: Option<SelfTest>,
    /// `--baseline NAME`: this run against a saved one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Comparison>,
    pub torch: Vec<TorchRatio>,
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    /// Timing method per side, `a→b` where they differ.
    pub method: String,
    pub a_us: Option<f64>,
    pub b_us: Option<f64>,
    /// b / a − 1: positive is slower.
    pub change: Option<f64>,
    /// The paired gate held by B for this case: interval and verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateCell>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateCell {
    pub change: f64,
    pub low: f64,
    pub high: f64,
    pub verdict: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub rows: Vec<Row>,
    /// What makes the plain differences less than a verdict.
    pub warnings: Vec<String>,
}
