//! `cargo xtask check`: the local gate. Static stages always (build and budgets);
//! where a GPU is present, preflight, the correctness matrix, and the full
//! sanitize on the iteration schedule (every fifth iteration) or on `--sanitize`.

use anyhow::{Result, bail};

use crate::compile;
use crate::optimise::ledger;
use crate::paths::Paths;
use crate::tools::gpu;
use crate::tools::preflight;
use crate::verify::sanitize;
use crate::verify::test;

pub struct Options {
    pub build: compile::Options,
    pub require_gpu: bool,
    pub sanitize: bool,
    pub test: test::Options,
}

/// The stages that need a GPU, in order.
const GPU_STAGES: &[&str] = &["preflight", "test", "sanitize (every fifth iteration)"];

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    // A line per stage, failures in full; the tables go to target/xtask/*.txt (-v prints them).
    crate::tools::process::set_detail(false);
    eprintln!("== check: build and resource budgets");
    compile::run(paths, &opts.build)?;

    match gpu::detect() {
        Ok(gpus) => {
            eprintln!("== check: GPU stages on {}", gpus.join(", "));
            preflight::run(paths)?;
            test::run(paths, &opts.test)?;
            let next = ledger::next_iteration(&paths.root.join("perf/ledger.jsonl"))?;
            if opts.sanitize || ledger::sanitize_due(next) {
                sanitize::run(paths, &sanitize::Options::all(opts.build.timeout, opts.build.jobs))?;
            } else {
                eprintln!("check: sanitize not due (next iteration {next}; runs every fifth, or pass --sanitize)");
            }
        }
        Err(why) if opts.require_gpu => bail!(crate::errors::CannotRun(format!("--require-gpu, but {why}"))),
        Err(why) => eprintln!("check: skipped GPU stages ({}): {why}", GPU_STAGES.join(", ")),
    }
    eprintln!("check: passed");
    Ok(())
}
