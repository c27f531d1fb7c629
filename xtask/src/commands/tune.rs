//! `cargo xtask tune`: sweep tile configurations per head dim.

use std::time::Duration;

use anyhow::Result;

use super::args::BuildArgs;
use crate::compile;
use crate::measure::tune;
use crate::run::Run;
use crate::tools::gpu::{self, GpuSpec};

#[derive(clap::Args)]
pub struct Tune {
    #[command(flatten)]
    pub build: BuildArgs,
    /// Write the winning configuration per head dim into kernels/manifest.json.
    #[arg(long)]
    pub apply: bool,
    /// Seconds a configuration's correctness or bench run may take before it counts as hung.
    #[arg(long, alias = "variant-timeout", default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..))]
    pub config_timeout: u64,
    /// Timing budget per configuration and shape, in ms.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub budget_ms: u64,
    /// Build and test the configurations on these GPUs, one worker each (all, a count N,
    /// or indices/UUIDs); every configuration is timed on the first of them.
    #[arg(long, value_name = "all|N|LIST")]
    pub gpus: Option<GpuSpec>,
}

impl Tune {
    pub fn run(self, cx: &Run) -> Result<()> {
        gpu::require("tune")?; // before any build
        let build = self.build.options();
        compile::run(cx, &build)?; // the committed configuration: fa-test --info loads it
        let opts = tune::Options {
            apply: self.apply,
            build_timeout: build.timeout,
            jobs: build.jobs,
            config_timeout: Duration::from_secs(self.config_timeout),
            budget_ms: self.budget_ms,
            gpus: self.gpus,
        };
        tune::run(cx, &opts)
    }
}
