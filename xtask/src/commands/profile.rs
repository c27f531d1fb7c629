//! `cargo xtask profile`: Nsight Compute, minimal metric set, one launch per shape.

use std::time::Duration;

use anyhow::Result;

use crate::measure::profile;
use crate::run::Run;
use crate::tools::gpu::GpuSpec;
use fa_schema::shape::Shape;

#[derive(clap::Args)]
pub struct Profile {
    /// Shapes B,H,S,D[,causal]: by default the seed shapes and one large one.
    #[arg(long = "shape", value_parser = Shape::parse, default_values = profile::DEFAULT_SHAPES, hide_default_value = true)]
    pub shapes: Vec<Shape>,
    /// Profile at base clocks (`--clock-control base`) instead of the bench's clocks.
    #[arg(long)]
    pub base_clocks: bool,
    /// Seconds each ncu run may take before it is stopped.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub profile_timeout: u64,
    /// Deal the shapes out to these GPUs, one ncu each: all, a count N, or indices/UUIDs.
    #[arg(long, value_name = "all|N|LIST")]
    pub gpus: Option<GpuSpec>,
}

impl Profile {
    pub fn run(self, cx: &Run) -> Result<()> {
        let opts = profile::Options {
            shapes: self.shapes.iter().map(Shape::spec).collect(),
            base_clocks: self.base_clocks,
            timeout: Duration::from_secs(self.profile_timeout),
            gpus: self.gpus,
        };
        profile::run(cx, &opts)
    }
}
