//! `cargo xtask ci`: what CI runs. Without `--gpu`, the CPU job (fmt, clippy,
//! tests, static check, workflow lint); with it, the GPU job against a base.

use std::path::PathBuf;

use anyhow::Result;

use super::args::{BuildArgs, GateArgs, TestArgs};
use crate::ci;
use crate::measure::bench;
use crate::run::Run;
use fa_schema::tensor::Dtype;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("base").args(["against", "base_dir"])))]
pub struct Ci {
    /// The GPU job: preflight, build, correctness matrix, regression gate.
    #[arg(long, requires = "base")]
    pub gpu: bool,
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub test: TestArgs,
    /// Gate against this revision (built in a worktree; the PR's merge base in CI).
    #[arg(long, conflicts_with = "base_dir")]
    pub against: Option<String>,
    /// Gate against a prebuilt base (DIR/kernels, DIR/fa-bench): for machines without cargo.
    #[arg(long)]
    pub base_dir: Option<PathBuf>,
    #[command(flatten)]
    pub gate: GateArgs,
}

impl Ci {
    pub fn run(self, cx: &Run) -> Result<()> {
        // The default shapes in f16 and, dense ones (Shape::takes), in e4m3 (bf16 out), each against the base.
        let gate = self.gate.options(&[Dtype::F16, Dtype::E4m3]);
        let bench = bench::Options { against: self.against, base_dir: self.base_dir, ..gate };
        ci::run(cx, &ci::Options { gpu: self.gpu, build: self.build.options(), test: self.test.options(), bench })
    }
}
