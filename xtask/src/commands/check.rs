//! `cargo xtask check`: the local gate. Static stages always (build and budgets);
//! where a GPU is present, preflight, the correctness matrix, and the full
//! sanitize on the iteration schedule (every fifth iteration) or on `--sanitize`.

use anyhow::{Result, bail};

use super::args::{BuildArgs, TestArgs};
use crate::compile;
use crate::errors::CannotRun;
use crate::ledger;
use crate::run::Run;
use crate::tools::{gpu, process};
use crate::verify::{preflight, sanitize, test};

#[derive(clap::Args)]
pub struct Check {
    #[command(flatten)]
    pub build: BuildArgs,
    /// Fail (exit 2) instead of skipping the GPU stages when no GPU is present.
    #[arg(long)]
    pub require_gpu: bool,
    /// Run the full sanitize even when no fifth iteration is due.
    #[arg(long)]
    pub sanitize: bool,
    #[command(flatten)]
    pub test: TestArgs,
}

/// The stages that need a GPU, in order.
const GPU_STAGES: &[&str] = &["preflight", "test", "sanitize (every fifth iteration)"];

impl Check {
    pub fn run(self, cx: &Run) -> Result<()> {
        // A line per stage, failures in full; the tables go to target/xtask/*.txt (-v prints them).
        process::set_detail(false);
        let build = self.build.options();
        // With --require-gpu, a machine without one is refused before anything is built.
        let gpus = gpu::detect();
        if let (Err(why), true) = (&gpus, self.require_gpu) {
            bail!(CannotRun(format!("--require-gpu, but {why}")));
        }
        eprintln!("== check: build and resource budgets");
        compile::run(cx, &build)?;
        match gpus {
            Ok(gpus) => {
                eprintln!("== check: GPU stages on {}", gpus.join(", "));
                preflight::run(cx)?;
                test::run(cx, &self.test.options())?;
                let next = ledger::next_iteration(&cx.root.join("perf/ledger.jsonl"))?;
                if self.sanitize || ledger::sanitize_due(next) {
                    sanitize::run(cx, &sanitize::Options::all(build.timeout, build.jobs))?;
                } else {
                    eprintln!("check: sanitize not due (next iteration {next}; runs every fifth, or pass --sanitize)");
                }
            }
            Err(why) => eprintln!("check: skipped GPU stages ({}): {why}", GPU_STAGES.join(", ")),
        }
        eprintln!("check: passed");
        Ok(())
    }
}
