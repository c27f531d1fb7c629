//! `cargo xtask check`: the local gate. Static stages always; GPU stages where a
//! GPU is present (required with `--require-gpu`).

use anyhow::{Result, bail};

use crate::paths::Paths;
use crate::{build, gpu, test};

pub struct Options {
    pub build: build::Options,
    pub require_gpu: bool,
    pub test: test::Options,
}

/// The stages that need a GPU, in order.
const GPU_STAGES: &[&str] = &["test"];

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    eprintln!("== check: build and resource budgets");
    build::run(paths, &opts.build)?;

    match gpu::detect() {
        Ok(gpus) => {
            eprintln!("== check: GPU stages on {}", gpus.join(", "));
            test::run(paths, &opts.test)?;
        }
        Err(why) if opts.require_gpu => {
            bail!(crate::CannotRun(format!("--require-gpu, but {why}")))
        }
        Err(why) => {
            eprintln!("check: skipped GPU stages ({}): {why}", GPU_STAGES.join(", "));
        }
    }
    eprintln!("check: passed");
    Ok(())
}
