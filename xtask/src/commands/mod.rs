//! The command line: one file per command, each holding its flags and its
//! `run`, which builds the stage options right there. `main` parses `Cli`,
//! builds the `Run` context once, and dispatches. Commands are the top layer:
//! they call the stages; no stage imports them.

mod args;
pub mod bench;
pub mod build;
pub mod check;
pub mod ci;
pub mod iterate;
pub mod preflight;
pub mod profile;
pub mod report;
pub mod sanitize;
pub mod summary;
pub mod test;
pub mod tune;
pub mod wheel;

use std::path::Path;

use clap::{Parser, Subcommand};

use crate::tools::process::Verbosity;

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
    /// devices or a UUID as `nvidia-smi -L` prints it (default: FA_DEVICE, else the first visible).
    #[arg(long, global = true, value_name = "N|UUID", value_parser = args::device)]
    pub device: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Compile every kernel for every manifest arch; report resources; enforce budgets.
    Build(build::Build),
    /// The local gate: build and budgets, then the GPU stages where a GPU is present.
    Check(check::Check),
    /// compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every kernel.
    Sanitize(sanitize::Sanitize),
    /// Time the kernels; gate against a revision, a prebuilt base or the stored baseline.
    Bench(bench::Bench),
    /// What CI runs: fmt, clippy, tests, static check, workflow lint; with --gpu the GPU gate.
    Ci(ci::Ci),
    /// One optimisation iteration over the whole tree: build, test, sanitize when due,
    /// gate against the last accepted tree, ledger entry; a rejection reverts every
    /// file the attempt changed and keeps it as perf/rejected/NNN-…/attempt.patch.
    Iterate(iterate::Iterate),
    /// The iteration history: table, Markdown and an SVG chart.
    Summary(summary::Summary),
    /// Sweep tile configurations per head dim; `--apply` writes the winners to the manifest.
    Tune(tune::Tune),
    /// GPU readiness: device, arch, nvcc vs driver, clocks, other processes, ncu, compute-sanitizer.
    Preflight(preflight::Preflight),
    /// Nsight Compute with a minimal metric set on the bench driver.
    Profile(profile::Profile),
    /// Run the correctness matrix on the GPU against the references.
    Test(test::Test),
    /// Reports: join the shards of a `test --shard I/N` matrix.
    Report(report::Report),
    /// The Python package (python/) with the kernels, as a wheel in target/wheels.
    Wheel(wheel::Wheel),
}

impl Cli {
    pub fn verbosity(&self) -> Verbosity {
        match (self.quiet, self.verbose) {
            (true, _) => Verbosity::Quiet,
            (_, true) => Verbosity::Verbose,
            _ => Verbosity::Normal,
        }
    }
}

impl Command {
    /// The kernel set the command names (`--out-dir` to build into, or a
    /// prebuilt `--kernels`); `None`: the target dir's `kernels`.
    pub fn kernel_dir(&self) -> Option<&Path> {
        match self {
            Command::Build(c) => c.build.out_dir.as_deref(),
            Command::Check(c) => c.build.out_dir.as_deref(),
            Command::Ci(c) => c.build.out_dir.as_deref(),
            Command::Iterate(c) => c.build.out_dir.as_deref(),
            Command::Tune(c) => c.build.out_dir.as_deref(),
            Command::Wheel(c) => c.build.out_dir.as_deref(),
            Command::Sanitize(c) => c.kernels.dir(&c.build),
            Command::Bench(c) => c.kernels.dir(&c.build),
            Command::Test(c) => c.kernels.dir(&c.build),
            Command::Summary(_) | Command::Preflight(_) | Command::Profile(_) | Command::Report(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
