//! `cargo xtask test`: the correctness matrix on the GPU against the references.

use anyhow::Result;

use super::args::{BuildArgs, PrebuiltArgs, TestArgs};
use crate::run::Run;
use crate::tools::gpu;
use crate::verify::test;

#[derive(clap::Args)]
pub struct Test {
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub kernels: PrebuiltArgs,
    #[command(flatten)]
    pub test: TestArgs,
}

impl Test {
    pub fn run(self, cx: &Run) -> Result<()> {
        gpu::require("test")?; // before any build
        self.kernels.prepare(cx, &self.build)?;
        test::run(cx, &self.test.options())
    }
}
