//! Safe, validated launches of the FlashAttention forward kernels compiled by
//! `cargo xtask build`, plus the pure pieces (validation, split planner, CPU
//! reference) that are tested without a GPU.

pub mod attention;
pub mod bench;
pub mod check;
pub mod cli;
pub mod device;
pub mod error;
pub mod io;
pub mod kernel_dir;
pub mod params;
pub mod planner;
pub mod probe;
pub mod reference;
pub mod rng;

pub use attention::{Attention, Family, KernelChoice, Launched, Options, Splits, Tensor, Variant};
pub use device::Gpu;
pub use error::{Error, Result};
pub use fa_schema::{manifest, schema, tensor};
pub use tensor::{Desc, Dtype, Layout, Problem};
