//! A call's temporaries (split partials, dequantised inputs, V transposed),
//! stream-ordered, from a memory pool of the `Attention`'s own that keeps what
//! it has grown to (until `trim`). The device's default pool gives its free memory back to
//! the driver at every synchronisation (its release threshold is 0), so the
//! first call after one mapped its scratch again, on the host, while the GPU
//! waited, by an amount that differs from process to process.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{
    CUdevice_attribute, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation, CUmemLocationType,
    CUmemPool_attribute, CUmemPoolProps, CUmemoryPool,
};
use cudarc::driver::{CudaContext as Ctx, CudaSlice, CudaStream, DeviceRepr, DriverError, result};

use crate::error::{CudaContext, Error, Result};

/// The pool, or why there is none (then cudarc's allocations: from the
/// device's default pool, or plain ones on a device without memory pools).
pub(super) struct Scratch {
    ctx: Arc<Ctx>,
    pool: std::result::Result<CUmemoryPool, String>,
}

// SAFETY: a CUmemoryPool is a driver handle, usable from any thread.
unsafe impl Send for Scratch {}
// SAFETY: as above; the driver synchronises its use.
unsafe impl Sync for Scratch {}

impl Scratch {
    /// A pool on `ctx`'s device that keeps its memory across synchronisations
    /// (until `trim`), where the device and driver allow one.
    pub(super) fn new(ctx: &Arc<Ctx>) -> Scratch {
        Scratch { ctx: ctx.clone(), pool: create(ctx) }
    }

    /// `len` uninitialised elements on `s`, given back to the pool in `s`'s
    /// order when dropped.
    ///
    /// # Safety
    /// As `CudaStream::alloc`: nothing may read an element before it is written.
    pub(super) unsafe fn alloc<T: DeviceRepr>(
        &self,
        s: &Arc<CudaStream>,
        len: usize,
    ) -> std::result::Result<CudaSlice<T>, DriverError> {
        // A stream of another context may be on a device without memory pools,
        // whose slices cudarc frees with cuMemFree.
        let pool = match self.pool {
            Ok(pool) if Arc::ptr_eq(s.context(), &self.ctx) => pool,
            // SAFETY: the caller's contract.
            _ => return unsafe { s.alloc::<T>(len) },
        };
        s.context().bind_to_thread()?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE))?
            .max(1);
        // SAFETY: pool and stream are live; the memory is the caller's to initialise.
        let ptr = unsafe { result::mem_pool::alloc_async(pool, bytes, s.cu_stream()) }?;
        // SAFETY: `ptr` holds `len` elements of T. The device has memory pools, so cudarc frees
        // a CudaSlice with cuMemFreeAsync, which gives a pool's allocation back to its pool.
        Ok(unsafe { s.upgrade_device_ptr(ptr, len) })
    }

    /// Gives what the pool keeps but no allocation uses back to the driver.
    pub(super) fn trim(&self) -> Result<()> {
        let Ok(pool) = self.pool else { return Ok(()) };
        self.ctx.bind_to_thread().cuda("making the context current")?;
        // SAFETY: the pool is live; memory in use or awaiting a queued free stays.
        unsafe { result::mem_pool::trim_to(pool, 0) }.cuda("giving the scratch pool's memory back")
    }

    /// The bytes the pool holds now, in use or kept; without a pool, why.
    pub(super) fn reserved(&self) -> Result<u64> {
        let pool = match &self.pool {
            Ok(pool) => *pool,
            Err(why) => {
                return Err(Error::Unsupported(format!(
                    "no scratch memory pool ({why}): calls allocate their temporaries anew each time"
                )));
            }
        };
        let mut bytes = 0u64;
        // SAFETY: the pool is live; this attribute is a u64.
        unsafe {
            result::mem_pool::get_attribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut bytes as *mut u64).cast::<c_void>(),
            )
        }
        .cuda("reading the scratch pool's size")?;
        Ok(bytes)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(pool) = self.pool {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the pool is live and destroyed once; allocations still out (or frees
            // still queued) keep its memory until they are done (cuMemPoolDestroy).
            let _ = unsafe { result::mem_pool::destroy(pool) };
        }
    }
}

/// The pool, with its release threshold at the most a u64 holds.
fn create(ctx: &Ctx) -> std::result::Result<CUmemoryPool, String> {
    let pools = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(|e| format!("asking whether the device has memory pools: {e}"))?;
    if pools == 0 {
        return Err("the device has no memory pools".into());
    }
    // SAFETY: all-zero is CUmemPoolProps' "nothing asked" value (its reserved bytes must be 0).
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ctx.ordinal() as i32 };
    ctx.bind_to_thread().map_err(|e| format!("making the context current: {e}"))?;
    // SAFETY: `props` is a valid CUmemPoolProps for this device.
    let pool = unsafe { result::mem_pool::create(&props) }.map_err(|e| format!("creating it: {e}"))?;
    let mut keep = u64::MAX;
    // SAFETY: the pool was just created; the release threshold is a u64.
    let kept = unsafe {
        result::mem_pool::set_attribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast::<c_void>(),
        )
    };
    if let Err(e) = kept {
        // SAFETY: the pool was just created and has no allocations.
        let _ = unsafe { result::mem_pool::destroy(pool) };
        return Err(format!("setting its release threshold: {e}"));
    }
    Ok(pool)
}
