//! `cargo xtask preflight`: is this GPU machine ready for the GPU stages?

use anyhow::Result;

use crate::run::Run;
use crate::verify::preflight;

#[derive(clap::Args)]
pub struct Preflight {}

impl Preflight {
    pub fn run(self, cx: &Run) -> Result<()> {
        preflight::run(cx)
    }
}
