//! `cargo xtask iterate "HYPOTHESIS"`: one gated, revertible optimisation iteration.

use anyhow::Result;

use super::args::{BuildArgs, DtypeArgs, GateArgs, TestArgs};
use crate::optimise::iterate;
use crate::run::Run;
use crate::verify::sanitize;

#[derive(clap::Args)]
pub struct Iterate {
    /// What you changed and why it should help.
    pub hypothesis: String,
    /// What should move, and by how much.
    #[arg(long)]
    pub predict: Option<String>,
    /// Run the full sanitize even when this is not a fifth iteration.
    #[arg(long)]
    pub sanitize: bool,
    /// Record a rejection but leave the sources as they are.
    #[arg(long)]
    pub no_revert: bool,
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub test: TestArgs,
    #[command(flatten)]
    pub gate: GateArgs,
    #[command(flatten)]
    pub dtype: DtypeArgs,
}

impl Iterate {
    pub fn run(self, cx: &Run) -> Result<()> {
        let build = self.build.options();
        let opts = iterate::Options {
            hypothesis: self.hypothesis,
            prediction: self.predict,
            sanitize: self.sanitize,
            no_revert: self.no_revert,
            bench: self.gate.options(&self.dtype.dtypes),
            sanitize_opts: sanitize::Options::all(build.timeout, build.jobs),
            build,
            test: self.test.options(),
        };
        iterate::run(cx, &opts)
    }
}
