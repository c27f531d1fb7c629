//! Buffers and streams another library owns (PyTorch's allocator and current
//! stream), borrowed for one call: wrapped without a copy, never freed here.

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys};

use super::{Attention, Tensor};
use crate::tensor::{Desc, Dtype};

/// A buffer over memory another library owns; dropping it leaves the memory alone.
pub struct Borrowed<T: Leak>(ManuallyDrop<T>);

/// What lets go of its device memory without freeing it.
pub trait Leak {
    /// Lets go of the memory without freeing it.
    fn leak(self);
}

impl<T> Leak for CudaSlice<T> {
    fn leak(self) {
        CudaSlice::leak(self);
    }
}

impl Leak for Tensor {
    fn leak(self) {
        self.data.leak();
    }
}

impl<T: Leak> Drop for Borrowed<T> {
    fn drop(&mut self) {
        // SAFETY: the value is taken once, here, and never used again.
        unsafe { ManuallyDrop::take(&mut self.0) }.leak();
    }
}

impl<T: Leak> Deref for Borrowed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Leak> std::ops::DerefMut for Borrowed<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl Attention {
    /// Another library's stream of this `Attention`'s device, for `forward_on`.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of this device's primary context (PyTorch's
    /// streams are), and stays alive while the returned handle is used.
    pub unsafe fn borrow_stream(&self, stream: u64) -> Arc<CudaStream> {
        // SAFETY: the caller's contract above is wrap_borrowed_stream's.
        unsafe { self.ctx.wrap_borrowed_stream(stream as sys::CUstream) }
    }

    /// A `Tensor` over `len` elements of `dtype` at device address `ptr`. Its dims,
    /// strides and `len` are checked by `forward_on` like any tensor's.
    ///
    /// # Safety
    /// `ptr` is a device allocation of this context holding at least `len`
    /// elements, live until the work enqueued with it has run (stream order on
    /// `stream`, whose owner frees it).
    pub unsafe fn borrow_tensor(
        &self,
        stream: &Arc<CudaStream>,
        ptr: u64,
        len: usize,
        dtype: Dtype,
        desc: Desc,
    ) -> Borrowed<Tensor> {
        // SAFETY: the caller vouches for the allocation; Borrowed leaks it rather than free it.
        let data = unsafe { stream.upgrade_device_ptr::<u8>(ptr, len.saturating_mul(dtype.bytes())) };
        Borrowed(ManuallyDrop::new(Tensor { data, dtype, desc }))
    }

    /// `len` fp32 values at `ptr` (a log-sum-exp output), as `borrow_tensor`.
    ///
    /// # Safety
    /// As `borrow_tensor`, for `len` f32 values.
    pub unsafe fn borrow_f32(&self, stream: &Arc<CudaStream>, ptr: u64, len: usize) -> Borrowed<CudaSlice<f32>> {
        // SAFETY: as borrow_tensor.
        Borrowed(ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<f32>(ptr, len) }))
    }

    /// `len` int32 values at `ptr` (sequence offsets, lengths or a block
    /// table), as `borrow_tensor`.
    ///
    /// # Safety
    /// As `borrow_tensor`, for `len` i32 values.
    pub unsafe fn borrow_i32(&self, stream: &Arc<CudaStream>, ptr: u64, len: usize) -> Borrowed<CudaSlice<i32>> {
        // SAFETY: as borrow_tensor.
        Borrowed(ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<i32>(ptr, len) }))
    }
}
