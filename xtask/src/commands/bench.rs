//! `cargo xtask bench`: timings, the paired regression gate, named baselines,
//! `--self-test`, `--vs-torch`; `bench compare A B` for two saved runs.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use super::args::{BuildArgs, DtypeArgs, GateArgs, PrebuiltArgs, baseline_name, planted_fraction};
use crate::measure::{bench, compare};
use crate::run::Run;
use crate::tools::gpu;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Bench {
    /// `compare A B`: two saved runs side by side.
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub kernels: PrebuiltArgs,
    #[command(flatten)]
    pub gate: GateArgs,
    #[command(flatten)]
    pub dtype: DtypeArgs,
    /// Compare with this git revision, built in a worktree.
    #[arg(long, conflicts_with = "base_dir")]
    pub against: Option<String>,
    /// Compare with a prebuilt base: DIR/kernels (and DIR/fa-bench).
    #[arg(long)]
    pub base_dir: Option<PathBuf>,
    /// Save this run (plain timings in --processes processes) as baseline NAME:
    /// target/xtask/baselines/NAME.json.
    #[arg(long, value_name = "NAME", value_parser = baseline_name)]
    pub save_baseline: Option<String>,
    /// Compare this run with a saved baseline (a NAME or a bench.json path): plain
    /// differences, not a verdict.
    #[arg(long, value_name = "NAME|PATH", conflicts_with_all = ["against", "base_dir"])]
    pub baseline: Option<String>,
    /// Also time PyTorch SDPA (ci/bench_torch.py) and print the speedup table.
    #[arg(long)]
    pub vs_torch: bool,
    /// Check the gate on this GPU: this build against itself (A/A) and against
    /// itself slowed by FRACTION of every timed half (default 0.03).
    #[arg(long, value_name = "FRACTION", num_args = 0..=1, default_missing_value = "0.03",
          value_parser = planted_fraction, conflicts_with_all = ["against", "base_dir", "save_baseline", "baseline"])]
    pub self_test: Option<f64>,
}

#[derive(Subcommand)]
pub enum Action {
    /// Two saved runs (baseline NAMEs or bench.json paths), case by case: a table and
    /// target/xtask/bench-compare.{json,md,csv}.
    Compare {
        /// The run to compare against: a baseline NAME or a bench.json path.
        a: String,
        /// The run compared: a baseline NAME or a bench.json path.
        b: String,
    },
}

impl Bench {
    pub fn run(self, cx: &Run) -> Result<()> {
        if let Some(Action::Compare { a, b }) = &self.action {
            return compare::run(cx, a, b);
        }
        gpu::require("bench")?; // before any build
        self.kernels.prepare(cx, &self.build)?;
        let opts = bench::Options {
            against: self.against,
            base_dir: self.base_dir,
            save_baseline: self.save_baseline,
            baseline: self.baseline,
            vs_torch: self.vs_torch,
            self_test: self.self_test,
            ..self.gate.options(&self.dtype.dtypes)
        };
        bench::run(cx, &opts)
    }
}
