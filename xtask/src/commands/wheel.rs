//! `cargo xtask wheel`: the Python package, with the kernels, as one abi3 wheel.

use anyhow::Result;

use super::args::BuildArgs;
use crate::compile;
use crate::run::Run;
use crate::wheel;

#[derive(clap::Args)]
pub struct Wheel {
    #[command(flatten)]
    pub build: BuildArgs,
}

impl Wheel {
    pub fn run(self, cx: &Run) -> Result<()> {
        compile::run(cx, &self.build.options())?;
        wheel::run(cx).map(drop)
    }
}
