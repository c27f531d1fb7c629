//! Loads a prebuilt kernel set from a folder named on the command line and
//! reports what loaded: the device, whether the Hopper kernel is there, and the
//! entry and split plan the planner picks for a few problems.
//!
//! ```text
//! cargo run -p kernel-ffi --example prebuilt -- /path/to/flash-pipeline/target/kernels [DEVICE]
//! ```
//!
//! The folder is what `cargo xtask build` wrote (or a copy of it); it is loaded
//! with `Attention::with_kernel_dir`, so `FA_KERNEL_DIR` and the current
//! directory play no part. Exit status 2, with the reason on stderr, where it
//! cannot run (no such folder, an unfinished build, no GPU).

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use kernel_ffi::tensor::{self, Arg};
use kernel_ffi::{Attention, Desc, Dtype, Gpu, Layout, Options};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        return Err("usage: prebuilt KERNEL_DIR [DEVICE]; KERNEL_DIR is the folder `cargo xtask build` \
                    wrote (target/kernels of the flash-pipeline checkout)"
            .into());
    };
    let gpu: Gpu = match args.next() {
        Some(arg) => arg.parse()?,
        None => Gpu::default(),
    };
    let att = Attention::with_kernel_dir(&gpu, &dir)?;
    let device = att.device();
    println!(
        "{} (compute capability {}, {} SMs, driver {}) from {}",
        device.name,
        device.compute_capability,
        device.sm_count,
        device.driver.as_deref().unwrap_or("unknown"),
        dir.display()
    );
    println!("Hopper kernel loaded: {}", att.has_hopper());
    for (batch, heads, seqlen, head_dim, causal) in [(1, 1, 4096, 64, false), (4, 16, 2048, 128, true)] {
        let desc = Desc::new([batch, heads, seqlen, head_dim], Layout::Bhsd);
        let arg = |name| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
        let problem = tensor::validate(arg("q"), arg("k"), arg("v"), arg("out"), None)?;
        let opts = Options { causal, ..Options::default() };
        let family = att.resolve(&problem, opts.choice.variant)?;
        let plan = att.plan(&problem, Dtype::F16, &opts)?;
        println!(
            "f16 B{batch} H{heads} S{seqlen} D{head_dim}{}: {} kernel, {} split(s) of {} keys; \
             entries (rows, key groups, persistent): {:?}",
            if causal { " causal" } else { "" },
            family.name(),
            plan.num_splits,
            plan.keys_per_split,
            att.geometries(family, Dtype::F16, head_dim, opts.scores(seqlen, seqlen)?)
        );
    }
    Ok(())
}
