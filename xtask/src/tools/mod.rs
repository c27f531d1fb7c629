//! The process layer and the tools it runs: spawning with timeouts and group
//! kill, the CUDA toolchain, the kernel-ffi drivers, the GPU and its readiness,
//! and work dealt out to several GPUs.

pub mod deal;
pub mod drivers;
pub mod gpu;
pub mod preflight;
pub mod process;
pub mod progress;
pub mod toolchain;
