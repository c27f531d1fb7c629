//! `#[repr(C)]` mirrors of `kernels/flash_params.h`. Field order, types and
//! padding must match the C++ structs exactly; the size asserts below catch drift
//! on the Rust side.

use cudarc::driver::DeviceRepr;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlashParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub o_partial: u64,
    pub lse_partial: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub o_strides: [i64; 3],
    pub batch: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub num_splits: i32,
    pub keys_per_split: i32,
    pub scale_log2: f32,
}

/// The bytes of a `CUtensorMap` (fa::TmaDesc).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct TmaDesc(pub [u64; 16]);

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HopperParams {
    pub q_map: TmaDesc,
    pub k_map: TmaDesc,
    pub v_map: TmaDesc,
    pub p: FlashParams,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CombineParams {
    pub o_partial: u64,
    pub lse_partial: u64,
    pub o: u64,
    pub lse: u64,
    pub o_strides: [i64; 3],
    pub batch: i32,
    pub heads: i32,
    pub seqlen_q: i32,
    pub num_splits: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReferenceParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub batch: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub causal: i32,
    pub scale: f32,
}

// SAFETY: plain-old-data with the C layout of the structs in flash_params.h
// (pointers as u64 device addresses, int64_t strides, int32_t/float scalars).
unsafe impl DeviceRepr for FlashParams {}
// SAFETY: as above, mirrors fa::HopperParams (three 64-byte-aligned 128-byte tensor maps, then FlashParams).
unsafe impl DeviceRepr for HopperParams {}
// SAFETY: as above, mirrors fa::CombineParams.
unsafe impl DeviceRepr for CombineParams {}
// SAFETY: as above, mirrors fa::ReferenceParams.
unsafe impl DeviceRepr for ReferenceParams {}

// 7 pointers + 12 strides + 8 four-byte fields.
const _: () = assert!(std::mem::size_of::<FlashParams>() == 7 * 8 + 12 * 8 + 8 * 4);
// Three tensor maps, FlashParams at offset 384, padded to the 64-byte alignment.
const _: () =
    assert!(std::mem::size_of::<HopperParams>() == (3 * 128 + std::mem::size_of::<FlashParams>()).next_multiple_of(64));
const _: () = assert!(std::mem::offset_of!(HopperParams, p) == 384);
const _: () = assert!(std::mem::size_of::<CombineParams>() == 4 * 8 + 3 * 8 + 4 * 4);
const _: () = assert!(std::mem::size_of::<ReferenceParams>() == 5 * 8 + 9 * 8 + 8 * 4);
