//! `cargo xtask sanitize`: compute-sanitizer's four tools over every kernel.

use std::time::Duration;

use anyhow::Result;

use super::args::{BuildArgs, PrebuiltArgs, SpreadArgs};
use crate::run::Run;
use crate::tools::gpu;
use crate::verify::sanitize::{self, Tool};

#[derive(clap::Args)]
pub struct Sanitize {
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub kernels: PrebuiltArgs,
    /// Only these tools (default: all four).
    #[arg(long, value_delimiter = ',')]
    pub tool: Vec<Tool>,
    /// Per-tool timeout in seconds (default 600, racecheck 1200).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub tool_timeout: Option<u64>,
    /// Also build each planted defect and require its tool to catch it.
    #[arg(long)]
    pub defects: bool,
    #[command(flatten)]
    pub spread: SpreadArgs,
}

impl Sanitize {
    pub fn run(self, cx: &Run) -> Result<()> {
        gpu::require("sanitize")?; // before any build
        self.kernels.prepare(cx, &self.build)?;
        let build = self.build.options();
        let opts = sanitize::Options {
            tools: if self.tool.is_empty() { Tool::ALL.to_vec() } else { self.tool },
            timeout: self.tool_timeout.map(Duration::from_secs),
            defects: self.defects,
            build_timeout: build.timeout,
            jobs: build.jobs,
            gpus: self.spread.gpus,
            shard: self.spread.shard,
        };
        sanitize::run(cx, &opts)
    }
}
