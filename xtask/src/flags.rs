//! The command line: every task and flag, and how flags become each task's
//! options. `main` parses with `Cli` and dispatches on `Task`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::compile;
use crate::errors::CannotRun;
use crate::measure::bench;
use crate::measure::compare;
use crate::paths::Paths;
use crate::verify::sanitize;
use crate::verify::test;

/// `--version`: the crate version, the git revision and rustc it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("FA_GIT_REV"), ", ", env!("FA_RUSTC"), ")");

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "Build, check and measure the FlashAttention kernels", version = VERSION)]
pub struct Cli {
    /// Say less: no command lines or child output, only results and errors.
    #[arg(long, short, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Say more: every command with its environment, and every child's output.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    /// The GPU every stage and binary uses: a CUDA ordinal among the visible
    /// devices or a UUID as `nvidia-smi -L` prints it (default: the first visible).
    #[arg(long, global = true, value_name = "N|UUID")]
    pub device: Option<String>,
    #[command(subcommand)]
    pub task: Task,
}

#[derive(Subcommand)]
pub enum Task {
    /// Compile every kernel for every manifest arch; report resources; enforce budgets.
    Build(BuildArgs),
    /// The local gate: build and budgets, then the GPU stages where a GPU is present.
    Check {
        #[command(flatten)]
        build: BuildArgs,
        /// Fail (exit 2) instead of skipping the GPU stages when no GPU is present.
        #[arg(long)]
        require_gpu: bool,
        /// Run the full sanitize even when no fifth iteration is due.
        #[arg(long)]
        sanitize: bool,
        #[command(flatten)]
        test: TestArgs,
    },
    /// compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every kernel.
    Sanitize {
        #[command(flatten)]
        build: BuildArgs,
        /// Only these tools (default: all four).
        #[arg(long, value_delimiter = ',')]
        tool: Vec<sanitize::Tool>,
        /// Per-tool timeout in seconds (default 600, racecheck 1200).
        #[arg(long)]
        tool_timeout: Option<u64>,
        /// Also build each planted defect and require its tool to catch it.
        #[arg(long)]
        defects: bool,
        #[command(flatten)]
        spread: SpreadArgs,
    },
    /// Time the kernels; gate against a revision, a prebuilt base or the stored baseline.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        /// `compare A B`: two saved runs side by side.
        #[command(subcommand)]
        action: Option<BenchAction>,
        #[command(flatten)]
        build: BuildArgs,
        #[command(flatten)]
        gate: GateArgs,
        /// f16, bf16 or f16,bf16.
        #[arg(long, default_value = "f16")]
        dtype: String,
        /// Compare with this git revision, built in a worktree.
        #[arg(long, conflicts_with = "base_dir")]
        against: Option<String>,
        /// Compare with a prebuilt base: DIR/kernels (and DIR/fa-bench).
        #[arg(long)]
        base_dir: Option<PathBuf>,
        /// Save this run (plain timings in --processes processes) as baseline NAME:
        /// target/xtask/baselines/NAME.json.
        #[arg(long, value_name = "NAME", value_parser = baseline_name)]
        save_baseline: Option<String>,
        /// Compare this run with a saved baseline (a NAME or a bench.json path): plain
        /// differences, not a verdict.
        #[arg(long, value_name = "NAME|PATH", conflicts_with_all = ["against", "base_dir"])]
        baseline: Option<String>,
        /// Also time PyTorch SDPA (ci/bench_torch.py) and print the speedup table.
        #[arg(long)]
        vs_torch: bool,
        /// Check the gate on this GPU: this build against itself (A/A) and against
        /// itself slowed by FRACTION of every timed half (default 0.03).
        #[arg(long, value_name = "FRACTION", num_args = 0..=1, default_missing_value = "0.03",
              value_parser = planted_fraction, conflicts_with_all = ["against", "base_dir", "save_baseline", "baseline"])]
        self_test: Option<f64>,
    },
    /// What CI runs: fmt, clippy, tests, static check, workflow lint; with --gpu the GPU gate.
    #[command(group(clap::ArgGroup::new("base").args(["against", "base_dir"])))]
    Ci {
        /// The GPU job: preflight, build, correctness matrix, regression gate.
        #[arg(long, requires = "base")]
        gpu: bool,
        #[command(flatten)]
        build: BuildArgs,
        #[command(flatten)]
        test: TestArgs,
        /// Gate against this revision (built in a worktree; the PR's merge base in CI).
        #[arg(long, conflicts_with = "base_dir")]
        against: Option<String>,
        /// Gate against a prebuilt base (DIR/kernels, DIR/fa-bench): for machines without cargo.
        #[arg(long)]
        base_dir: Option<PathBuf>,
        #[command(flatten)]
        gate: GateArgs,
    },
    /// One optimisation iteration over the whole tree: build, test, sanitize when due,
    /// gate against the last accepted tree, ledger entry; a rejection reverts every
    /// file the attempt changed and keeps it as perf/rejected/NNN-…/attempt.patch.
    Iterate {
        /// What you changed and why it should help.
        hypothesis: String,
        /// What should move, and by how much.
        #[arg(long)]
        predict: Option<String>,
        /// Run the full sanitize even when this is not a fifth iteration.
        #[arg(long)]
        sanitize: bool,
        /// Record a rejection but leave the sources as they are.
        #[arg(long)]
        no_revert: bool,
        #[command(flatten)]
        build: BuildArgs,
        #[command(flatten)]
        test: TestArgs,
        #[command(flatten)]
        gate: GateArgs,
        /// f16, bf16 or f16,bf16.
        #[arg(long, default_value = "f16")]
        dtype: String,
    },
    /// The iteration history: table, Markdown and an SVG chart.
    Summary,
    /// Sweep tile configurations per head dim; `--apply` writes the winners to the manifest.
    Tune {
        #[command(flatten)]
        build: BuildArgs,
        /// Write the winning configuration per head dim into kernels/manifest.json.
        #[arg(long)]
        apply: bool,
        /// Seconds a variant's correctness or bench run may take before it counts as hung.
        #[arg(long, default_value_t = 180)]
        variant_timeout: u64,
        /// Timing budget per variant and shape, in ms.
        #[arg(long, default_value_t = 300)]
        budget_ms: u64,
        /// Build and test the variants on these GPUs, one worker each (all, a count N,
        /// or indices/UUIDs); every variant is timed on the first of them.
        #[arg(long, value_name = "all|N|LIST")]
        gpus: Option<String>,
    },
    /// GPU readiness: device, arch, nvcc vs driver, clocks, other processes, ncu, compute-sanitizer.
    Preflight,
    /// Nsight Compute with a minimal metric set on the bench driver.
    Profile {
        /// Shapes B,H,S,D[,causal]: by default the seed shapes and one large one.
        #[arg(long = "shape", default_values = crate::measure::profile::DEFAULT_SHAPES, hide_default_value = true)]
        shapes: Vec<String>,
        /// Profile at base clocks (`--clock-control base`) instead of the bench's clocks.
        #[arg(long)]
        base_clocks: bool,
        /// Seconds each ncu run may take before it is stopped.
        #[arg(long, default_value_t = 300)]
        profile_timeout: u64,
        /// Deal the shapes out to these GPUs, one ncu each: all, a count N, or indices/UUIDs.
        #[arg(long, value_name = "all|N|LIST")]
        gpus: Option<String>,
    },
    /// Run the correctness matrix on the GPU against the references.
    Test {
        #[command(flatten)]
        build: BuildArgs,
        #[command(flatten)]
        test: TestArgs,
    },
    /// Reports: join the shards of a `test --shard I/N` matrix.
    Report {
        #[command(subcommand)]
        action: ReportAction,
    },
}

#[derive(Subcommand)]
pub enum ReportAction {
    /// Shard reports (each shard's target/xtask/test.json) into one; fails on a missing or repeated shard or case.
    Merge {
        /// The shards' test.json files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where the joined report goes (default: target/xtask/test.json).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
pub struct BuildArgs {
    /// Per-nvcc-invocation timeout in seconds.
    #[arg(long, default_value_t = 120)]
    pub build_timeout: u64,
    /// Use another kernel manifest (sources are relative to it).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Parallel nvcc invocations (default: available cores).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Extra -D define for every kernel unit (experiments, planted defects); repeatable.
    #[arg(long = "define")]
    pub defines: Vec<String>,
    /// Build fatbins into DIR instead of target/kernels; every stage of the run loads them from there.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Load this prebuilt kernel set instead of building (test, bench, sanitize); refused
    /// unless it was built from this checkout's kernel sources.
    #[arg(long, value_name = "DIR", conflicts_with = "out_dir")]
    pub kernels: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct TestArgs {
    /// Only cases whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Timeout for the whole correctness run, in seconds.
    #[arg(long, default_value_t = 600)]
    pub test_timeout: u64,
    #[command(flatten)]
    pub spread: SpreadArgs,
}

/// How test and sanitize spread their cases over GPUs and runners.
#[derive(Args, Clone)]
pub struct SpreadArgs {
    /// Deal the cases out to these GPUs, one worker each: all, a count N, or indices/UUIDs (0,2; one index: 1,).
    #[arg(long, value_name = "all|N|LIST")]
    pub gpus: Option<String>,
    /// Run only part I of N of the cases (for a CI matrix over runners); `report merge` joins test parts.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<crate::verify::spread::Shard>,
}

/// What the gate and the timings run (bench, ci --gpu, iterate).
#[derive(Args, Clone)]
pub struct GateArgs {
    /// Shapes B,H,S,D[,causal] (default: fa-bench's default set).
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// The gate's most seconds of paired quads per shape; an undecided shape is inconclusive and fails.
    #[arg(long, default_value_t = 6.0)]
    pub gate_secs: f64,
    /// Seed of the gate's quad order (default: from the clock; the report records it).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Plain timing (no base; --vs-torch, --save-baseline): fa-bench processes.
    #[arg(long, default_value_t = 5)]
    pub processes: usize,
    /// Plain timing: time budget per case inside each process, in ms.
    #[arg(long, default_value_t = 1000)]
    pub budget_ms: u64,
    /// Kernel to time: auto (Hopper where loaded), portable or hopper.
    #[arg(long, default_value = "auto", value_parser = ["auto", "portable", "hopper"])]
    pub variant: String,
}

impl GateArgs {
    pub fn options(&self, dtypes: &str) -> bench::Options {
        bench::Options {
            shapes: self.shapes.clone(),
            dtypes: dtypes.to_string(),
            against: None,
            base_dir: None,
            processes: self.processes,
            budget_ms: self.budget_ms,
            gate_secs: self.gate_secs,
            seed: self.seed,
            variant: self.variant.clone(),
            save_baseline: None,
            baseline: None,
            vs_torch: false,
            self_test: None,
            timeout: Duration::from_secs(3600),
        }
    }
}

impl BuildArgs {
    pub fn options(&self) -> compile::Options {
        let jobs = self.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        compile::Options {
            manifest: self.manifest.clone(),
            defines: self.defines.clone(),
            out_dir: self.out_dir.clone(),
            ..compile::Options::new(Duration::from_secs(self.build_timeout), jobs)
        }
    }
}

impl TestArgs {
    pub fn options(&self) -> test::Options {
        test::Options {
            filter: self.filter.clone(),
            timeout: Duration::from_secs(self.test_timeout),
            gpus: self.spread.gpus.clone(),
            shard: self.spread.shard,
        }
    }
}

#[derive(Subcommand)]
pub enum BenchAction {
    /// Two saved runs (baseline NAMEs or bench.json paths), case by case: a table and
    /// target/xtask/bench-compare.{json,md,csv}.
    Compare {
        /// The run to compare against: a baseline NAME or a bench.json path.
        a: String,
        /// The run compared: a baseline NAME or a bench.json path.
        b: String,
    },
}

pub fn baseline_name(name: &str) -> Result<String, String> {
    compare::check_name(name).map(|()| name.to_string()).map_err(|e| e.to_string())
}

/// The build flags of a task that builds kernels.
fn build_args(task: &Task) -> Option<&BuildArgs> {
    match task {
        Task::Build(b) => Some(b),
        Task::Check { build, .. }
        | Task::Sanitize { build, .. }
        | Task::Bench { build, .. }
        | Task::Ci { build, .. }
        | Task::Iterate { build, .. }
        | Task::Tune { build, .. }
        | Task::Test { build, .. } => Some(build),
        Task::Summary | Task::Preflight | Task::Profile { .. } | Task::Report { .. } => None,
    }
}

/// `--self-test`'s planted slowdown: a fraction, 0.005 to 0.5.
fn planted_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.005..0.5).contains(&f) { Ok(f) } else { Err("the planted slowdown is a fraction, 0.005 to 0.5".into()) }
}

impl Cli {
    pub fn verbosity(&self) -> crate::tools::process::Verbosity {
        use crate::tools::process::Verbosity;
        match (self.quiet, self.verbose) {
            (true, _) => Verbosity::Quiet,
            (_, true) => Verbosity::Verbose,
            _ => Verbosity::Normal,
        }
    }
}

impl Task {
    /// Paths for the task: its kernels are built into and loaded from `--out-dir`,
    /// or loaded from `--kernels`, where given.
    pub fn paths(&self) -> anyhow::Result<Paths> {
        let task = self;
        let mut paths = Paths::discover()?;
        let b = build_args(task);
        if let Some(dir) = b.and_then(|b| b.kernels.as_ref().or(b.out_dir.as_ref())) {
            paths.kernels = std::path::absolute(dir)?;
        }
        if b.is_some_and(|b| b.kernels.is_some())
            && !matches!(task, Task::Test { .. } | Task::Bench { .. } | Task::Sanitize { .. })
        {
            return Err(CannotRun(
                "--kernels (a prebuilt set) is for test, bench and sanitize; this task builds its kernels: \
                 use --out-dir DIR to build into DIR"
                    .into(),
            )
            .into());
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_and_task_is_described_and_usage_says_cargo_xtask() {
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments().filter(|a| !["help", "version"].contains(&a.get_id().as_str())) {
                if a.get_help().is_none() {
                    missing.push(format!("{path} --{}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {}", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "cargo xtask", &mut missing);
        assert!(missing.is_empty(), "undescribed: {missing:?}");
        assert!(Cli::command().render_usage().to_string().contains("cargo xtask"));
    }

    #[test]
    fn out_dir_is_the_kernel_set_of_every_stage_that_builds() {
        for task in ["test", "check", "sanitize", "bench", "tune", "build"] {
            let cli = Cli::try_parse_from(["xtask", task, "--out-dir", "/tmp/ks", "--device", "1"]).unwrap();
            assert_eq!(cli.task.paths().unwrap().kernels, PathBuf::from("/tmp/ks"), "{task}");
            assert_eq!(cli.device.as_deref(), Some("1"));
        }
        // The default is the `kernels` folder of the target dir, whatever sets it.
        let cli = Cli::try_parse_from(["xtask", "test"]).unwrap();
        let paths = cli.task.paths().unwrap();
        assert_eq!(paths.kernels, paths.target.join("kernels"));
        for task in ["test", "bench", "sanitize"] {
            let cli = Cli::try_parse_from(["xtask", task, "--kernels", "/tmp/pre"]).unwrap();
            assert_eq!(cli.task.paths().unwrap().kernels, PathBuf::from("/tmp/pre"), "{task}");
        }
        for task in ["check", "build", "iterate x", "tune"] {
            let mut args = vec!["xtask"];
            args.extend(task.split(' '));
            args.extend(["--kernels", "/tmp/pre"]);
            let err = Cli::try_parse_from(args).unwrap().task.paths().unwrap_err().to_string();
            assert!(err.contains("--out-dir"), "{task}: {err}");
        }
        assert!(Cli::try_parse_from(["xtask", "test", "--kernels", "a", "--out-dir", "b"]).is_err());
    }

    #[test]
    fn flags_that_cannot_work_are_refused_while_parsing() {
        let err = |args: &[&str]| Cli::try_parse_from(args).err().map(|e| e.to_string()).unwrap_or_default();
        let ci = err(&["xtask", "ci", "--gpu"]);
        assert!(ci.contains("--against") && ci.contains("Usage: cargo xtask ci"), "{ci}");
        assert!(err(&["xtask", "ci", "--gpu", "--against", "main"]).is_empty());
        assert!(err(&["xtask", "bench", "--self-test", "2"]).contains("0.005 to 0.5"));
        assert!(err(&["xtask", "bench", "--self-test", "nan"]).contains("0.005 to 0.5"));
        assert!(err(&["xtask", "bench", "--self-test"]).is_empty());
    }
}
