//! Which GPU a binary opens: `--device N|UUID` (or `FA_DEVICE`), a CUDA ordinal
//! among the visible devices (after `CUDA_VISIBLE_DEVICES`) or a device UUID as
//! `nvidia-smi -L` prints it. xtask passes the UUID, so a stage, its children and
//! its monitoring all name the same GPU however CUDA orders the devices.

use cudarc::driver::result;

use crate::attention::uuid_string;
use crate::error::{CudaContext, Error, Result};
pub use fa_schema::gpu::Gpu;

/// What kernel-ffi adds to a `Gpu`: finding it among the visible devices.
pub trait Open {
    /// The CUDA ordinal of this GPU among the visible ones. Needs the driver.
    fn ordinal(&self) -> Result<usize>;
}

impl Open for Gpu {
    fn ordinal(&self) -> Result<usize> {
        result::init().cuda("initialising CUDA")?;
        let count = result::device::get_count().cuda("counting GPUs")?.max(0) as usize;
        let visible = || match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) => format!(" (CUDA_VISIBLE_DEVICES={v})"),
            Err(_) => String::new(),
        };
        match self {
            Gpu::Ordinal(n) if *n < count => Ok(*n),
            Gpu::Ordinal(n) => Err(Error::Unsupported(format!(
                "GPU {n} does not exist: CUDA sees {count}{}; `nvidia-smi -L` lists them",
                visible()
            ))),
            Gpu::Uuid(want) => {
                let mut seen = Vec::new();
                for i in 0..count {
                    let dev = result::device::get(i as i32).cuda(format!("opening GPU {i}"))?;
                    let uuid = uuid_string(&result::device::get_uuid(dev).cuda("reading a GPU's UUID")?.bytes);
                    if &uuid == want {
                        return Ok(i);
                    }
                    seen.push(uuid);
                }
                Err(Error::Unsupported(format!(
                    "no visible GPU has UUID {want}{}; CUDA sees [{}]",
                    visible(),
                    seen.join(", ")
                )))
            }
        }
    }
}
