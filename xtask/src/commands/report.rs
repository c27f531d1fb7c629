//! `cargo xtask report merge`: one report from the shards of a test matrix.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use crate::run::Run;
use crate::verify::test;

#[derive(clap::Args)]
pub struct Report {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand)]
pub enum Action {
    /// Shard reports (each shard's target/xtask/test.json) into one; fails on a missing or repeated shard or case.
    Merge {
        /// The shards' test.json files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where the joined report goes (default: target/xtask/test.json).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

impl Report {
    pub fn run(self, cx: &Run) -> Result<()> {
        match self.action {
            Action::Merge { files, out } => test::merge(cx, &files, out.as_deref()),
        }
    }
}
