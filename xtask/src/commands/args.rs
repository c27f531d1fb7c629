//! The flag groups several commands share, and the value parsers that turn
//! flags into types while parsing, so a bad value is refused before any work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::compile;
use crate::measure::bench;
use crate::tools::gpu::GpuSpec;
use crate::verify::spread::Shard;
use crate::verify::test;
use fa_schema::shape::Shape;
use fa_schema::tensor::Dtype;

#[derive(Args, Clone)]
pub struct BuildArgs {
    /// Per-nvcc-invocation timeout in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub build_timeout: u64,
    /// Use another kernel manifest (sources are relative to it).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Parallel nvcc invocations (default: available cores).
    #[arg(long, short, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub jobs: Option<u64>,
    /// Extra -D define for every kernel unit (experiments, planted defects); repeatable.
    #[arg(long = "define", value_parser = define)]
    pub defines: Vec<String>,
    /// Build fatbins into DIR instead of target/kernels; every stage of the run loads them from there.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

impl BuildArgs {
    pub fn options(&self) -> compile::Options {
        let jobs =
            self.jobs.map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |j| j as usize);
        compile::Options {
            manifest: self.manifest.clone(),
            defines: self.defines.clone(),
            out_dir: self.out_dir.clone(),
            enforce_budgets: !self.defines.iter().any(|d| is_planted(d)),
            ..compile::Options::new(Duration::from_secs(self.build_timeout), jobs)
        }
    }
}

/// A planted slowdown, wrong result or defect (`FA_PLANT_*`, `FA_DEFECT_*`):
/// built to prove the gate or a sanitizer, so its build reports the budget
/// breaches the plant causes (spills, for one) without failing on them.
fn is_planted(define: &str) -> bool {
    define.starts_with("FA_PLANT_") || define.starts_with("FA_DEFECT_")
}

/// `--kernels DIR`: for the commands that can load a prebuilt set instead of building.
#[derive(Args, Clone)]
pub struct PrebuiltArgs {
    /// Load this prebuilt kernel set instead of building; refused unless it was
    /// built from this checkout's kernel sources.
    #[arg(long, value_name = "DIR", conflicts_with = "out_dir")]
    pub kernels: Option<PathBuf>,
}

impl PrebuiltArgs {
    /// The set the run loads: the prebuilt one, else the one it builds into.
    pub fn dir<'a>(&'a self, build: &'a BuildArgs) -> Option<&'a Path> {
        self.kernels.as_deref().or(build.out_dir.as_deref())
    }

    /// The run's kernel set: the prebuilt one checked against the checkout, or a fresh build.
    pub fn prepare(&self, cx: &crate::run::Run, build: &BuildArgs) -> anyhow::Result<()> {
        compile::kernel_set::prepare(cx, &build.options(), self.kernels.is_some())
    }
}

#[derive(Args, Clone)]
pub struct TestArgs {
    /// Only cases whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Timeout for the whole correctness run, in seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub test_timeout: u64,
    #[command(flatten)]
    pub spread: SpreadArgs,
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

/// How test and sanitize spread their cases over GPUs and runners.
#[derive(Args, Clone)]
pub struct SpreadArgs {
    /// Deal the cases out to these GPUs, one worker each: all, a count N, or indices/UUIDs (0,2; one index: 1,).
    #[arg(long, value_name = "all|N|LIST")]
    pub gpus: Option<GpuSpec>,
    /// Run only part I of N of the cases (for a CI matrix over runners); `report merge` joins test parts.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

/// What the gate and the timings run (bench, ci --gpu, iterate).
#[derive(Args, Clone)]
pub struct GateArgs {
    /// Shapes B,H,S,D[,causal], varlen:B,H,HKV,S,D[,causal] or paged:B,H,HKV,S,D,PAGE (default: fa-bench's default set).
    #[arg(long = "shape", value_parser = Shape::parse)]
    pub shapes: Vec<Shape>,
    /// The gate's most seconds of paired quads per shape; an undecided shape is inconclusive and fails.
    #[arg(long, default_value_t = 6.0, value_parser = positive_secs)]
    pub gate_secs: f64,
    /// Seed of the gate's quad order (default: from the clock; the report records it).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Plain timing (no base; --vs-torch, --save-baseline): fa-bench processes.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub processes: u64,
    /// Plain timing: time budget per case inside each process, in ms.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub budget_ms: u64,
    /// Kernel to time: auto (Hopper where loaded), portable or hopper.
    #[arg(long, default_value = "auto", value_parser = ["auto", "portable", "hopper"])]
    pub variant: String,
    /// Explain every gated shape (entry, plan, ptxas, SASS of each side), not only regressions and improvements.
    #[arg(long)]
    pub explain: bool,
}

impl GateArgs {
    /// The bench options these flags ask for, on `dtypes`; the seed is decided
    /// here (the clock where none was given) and recorded in the report.
    pub fn options(&self, dtypes: &[Dtype]) -> bench::Options {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        bench::Options {
            shapes: self.shapes.iter().map(Shape::spec).collect(),
            dtypes: dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
            against: None,
            base_dir: None,
            processes: self.processes as usize,
            budget_ms: self.budget_ms,
            gate_secs: self.gate_secs,
            seed,
            variant: self.variant.clone(),
            explain: self.explain,
            save_baseline: None,
            baseline: None,
            vs_torch: false,
            self_test: None,
            timeout: Duration::from_secs(3600),
        }
    }
}

/// `--dtype f16,bf16`: the dtypes to time.
#[derive(Args, Clone)]
pub struct DtypeArgs {
    /// f16, bf16, e4m3 (bf16 out, unit descales), comma-separated.
    #[arg(long = "dtype", default_value = "f16", value_delimiter = ',', value_parser = Dtype::parse)]
    pub dtypes: Vec<Dtype>,
}

/// `-D` defines: `NAME` or `NAME=VALUE`, NAME a C identifier.
fn define(s: &str) -> Result<String, String> {
    let name = s.split_once('=').map_or(s, |(n, _)| n);
    let ident = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident { Ok(s.to_string()) } else { Err(format!("`{s}`: a define is NAME or NAME=VALUE, NAME a C identifier")) }
}

/// `--device`: a CUDA ordinal or a GPU UUID, by the rule the binaries open it with.
pub fn device(s: &str) -> Result<String, String> {
    s.parse::<fa_schema::gpu::Gpu>().map(|g| g.to_string())
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!("`{s}`: seconds, more than 0 and at most 3600")),
    }
}

/// `--self-test`'s planted slowdown: a fraction, 0.005 to 0.5.
pub fn planted_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.005..0.5).contains(&f) { Ok(f) } else { Err("the planted slowdown is a fraction, 0.005 to 0.5".into()) }
}

/// A baseline NAME (`bench --save-baseline`).
pub fn baseline_name(name: &str) -> Result<String, String> {
    crate::measure::compare::check_name(name).map(|()| name.to_string()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        build: BuildArgs,
    }

    #[test]
    fn planted_builds_report_budget_breaches_without_failing_on_them() {
        let opts = |args: &[&str]| Cli::parse_from(std::iter::once("x").chain(args.iter().copied())).build.options();
        assert!(opts(&[]).enforce_budgets);
        assert!(opts(&["--define", "FA_WARPS_D64=8"]).enforce_budgets, "an experiment is held to the budgets");
        assert!(!opts(&["--define", "FA_PLANT_SLOWDOWN=64"]).enforce_budgets);
        assert!(!opts(&["--define", "FA_WARPS_D64=8", "--define", "FA_DEFECT_RACE"]).enforce_budgets);
    }
}
