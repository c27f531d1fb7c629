//! The process layer and the tools it runs: spawning with timeouts and group
//! kill, the CUDA toolchain, the kernel-ffi drivers and their environment, the
//! GPUs and the choice among them, and work dealt out to several GPUs.

pub mod deal;
pub mod drivers;
pub mod gpu;
pub mod process;
pub mod progress;
pub mod toolchain;
