//! Harness kernels of the paired gate, JIT-loaded from PTX (`probe.ptx`): no
//! fatbin, so they run beside any build of the kernel set.
//!
//! - `spin(ns)`: one thread spins for `ns` nanoseconds of `%globaltimer`. It is
//!   the planted slowdown of `cargo xtask bench --self-test`: queued inside a
//!   timed half, it adds a known fraction to that half on any shape.
//! - `clock_mhz()`: one thread spins 2^16 cycles of `%clock64` and times them
//!   with `%globaltimer`: the SM clock at that moment (nvbench's method), read
//!   next to the timed launches rather than from NVML's 100 ms grid.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::Attention;
use crate::error::{CudaContext, Result};

const PTX: &str = include_str!("probe.ptx");
/// About 35 µs at 1.9 GHz: long against `%globaltimer`'s tick, short against a quad.
const PROBE_CYCLES: u64 = 1 << 16;

/// The two probe kernels, JIT-loaded on an [`Attention`]'s context and
/// launched on its stream.
pub struct Probes {
    spin: CudaFunction,
    clock: CudaFunction,
    out: CudaSlice<u64>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
}

const ONE_THREAD: LaunchConfig = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };

impl Probes {
    /// JIT-compiles the probes' PTX for `att`'s device and loads them.
    pub fn load(att: &Attention) -> Result<Probes> {
        let module = att.context().load_module(Ptx::from_src(PTX)).cuda("JIT-loading the probe kernels")?;
        let spin = module.load_function("fa_spin_ns").cuda("finding fa_spin_ns")?;
        let clock = module.load_function("fa_clock_probe").cuda("finding fa_clock_probe")?;
        let stream = att.stream().clone();
        let out = stream.alloc_zeros::<u64>(2).cuda("allocating the clock probe's output")?;
        Ok(Probes { spin, clock, out, stream, _module: module })
    }

    /// Queues a spin of `ns` nanoseconds on the attention stream.
    pub fn spin(&self, ns: u64) -> Result<()> {
        // SAFETY: fa_spin_ns(.param .u64 ns) takes one u64 by value and touches no memory.
        unsafe { self.stream.launch_builder(&self.spin).arg(&ns).launch(ONE_THREAD) }.cuda("launching fa_spin_ns")?;
        Ok(())
    }

    /// The SM clock in MHz, measured now (synchronises the stream).
    pub fn clock_mhz(&mut self) -> Result<f64> {
        // SAFETY: fa_clock_probe(.param .u64 out, .param .u64 cycles) stores two u64
        // at out[0..2]; `out` is a device allocation of two u64 on this stream.
        unsafe { self.stream.launch_builder(&self.clock).arg(&mut self.out).arg(&PROBE_CYCLES).launch(ONE_THREAD) }
            .cuda("launching fa_clock_probe")?;
        let v = self.stream.clone_dtoh(&self.out).cuda("reading the clock probe")?;
        Ok(clock_mhz(v[0], v[1]))
    }
}

/// Cycles over nanoseconds, in MHz; NaN where no time passed.
pub fn clock_mhz(ns: u64, cycles: u64) -> f64 {
    if ns == 0 { f64::NAN } else { cycles as f64 / ns as f64 * 1e3 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_from_cycles_and_time() {
        assert_eq!(super::clock_mhz(50_000, 99_000), 1980.0);
        assert!(super::clock_mhz(0, 5).is_nan());
    }

    #[test]
    fn the_ptx_declares_both_entries() {
        assert!(super::PTX.contains(".visible .entry fa_spin_ns(.param .u64 ns)"));
        assert!(super::PTX.contains(".visible .entry fa_clock_probe(.param .u64 out, .param .u64 cycles)"));
    }
}
