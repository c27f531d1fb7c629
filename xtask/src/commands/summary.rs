//! `cargo xtask summary`: the iteration history as a table, Markdown and an SVG chart.

use anyhow::Result;

use crate::optimise::summary;
use crate::run::Run;

#[derive(clap::Args)]
pub struct Summary {}

impl Summary {
    pub fn run(self, cx: &Run) -> Result<()> {
        summary::run(cx)
    }
}
