//! `cargo xtask build`: every kernel for every manifest arch, budgets enforced.

use anyhow::Result;

use super::args::BuildArgs;
use crate::compile;
use crate::run::Run;

#[derive(clap::Args)]
pub struct Build {
    #[command(flatten)]
    pub build: BuildArgs,
}

impl Build {
    pub fn run(self, cx: &Run) -> Result<()> {
        compile::run(cx, &self.build.options())
    }
}
