//! `#[repr(C)]` mirrors of `kernels/flash_params.h`. Field order, types and
//! padding must match the C++ structs exactly; the size asserts below catch drift
//! on the Rust side.

use cudarc::driver::DeviceRepr;

/// The forward entries' parameters (`fa::FlashParams`), passed by value.
/// Addresses are device pointers as `u64`; strides are in elements, the head
/// dim contiguous.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlashParams {
    /// Q, [B, H, Sq, D] in the input dtype.
    pub q: u64,
    /// K, [B, Hkv, Sk, D].
    pub k: u64,
    /// V, [B, Hkv, Sk, D].
    pub v: u64,
    /// The output, [B, H, Sq, D] in the input dtype; written when `num_splits` is 1.
    pub o: u64,
    /// The natural-log LSE, [B, H, Sq] fp32, or 0 for none; written when `num_splits` is 1.
    pub lse: u64,
    /// fp32 outputs of each split, [num_splits, B, H, Sq, D], when `num_splits` > 1.
    pub o_partial: u64,
    /// fp32 LSEs of each split, [num_splits, B, H, Sq], when `num_splits` > 1.
    pub lse_partial: u64,
    /// Q's batch, head and row strides.
    pub q_strides: [i64; 3],
    /// K's batch, head and row strides.
    pub k_strides: [i64; 3],
    /// V's batch, head and row strides.
    pub v_strides: [i64; 3],
    /// The output's batch, head and row strides.
    pub o_strides: [i64; 3],
    /// B.
    pub batch: i32,
    /// H, query heads.
    pub heads: i32,
    /// Hkv, K/V heads (H is a multiple of it).
    pub kv_heads: i32,
    /// Sq.
    pub seqlen_q: i32,
    /// Sk.
    pub seqlen_k: i32,
    /// Key splits.
    pub num_splits: i32,
    /// Keys per split, a multiple of the entry's key tile.
    pub keys_per_split: i32,
    /// The softmax scale × log2(e): the kernels exponentiate in base 2. With a
    /// softcap c: c × log2(e) (`Scores::kernel_scales`).
    pub scale_log2: f32,
    /// The `_local` entries' window (`Band::window`), clamped so that no bound overflows.
    pub window_left: i32,
    /// See `window_left`.
    pub window_right: i32,
    /// The `_softcap` entries' scale / c.
    pub softcap_pre: f32,
}

/// The e4m3 entries' parameters (fa::Fp8Params): q, k and v strides in pairs of
/// elements, and the descales' device addresses (0: none).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Fp8Params {
    /// The forward parameters.
    pub p: FlashParams,
    /// q's factors, fp32 [B, Hkv].
    pub q_descale: u64,
    /// k's.
    pub k_descale: u64,
    /// v's.
    pub v_descale: u64,
}

/// One e4m3 tensor dequantised into a contiguous [B, S, H, D] 16-bit one
/// (fa::DequantParams).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DequantParams {
    /// The e4m3 tensor.
    pub src: u64,
    /// The output, [B, S, H, D] contiguous.
    pub dst: u64,
    /// Its factors, fp32 [B, Hkv] contiguous, or 0 for 1.
    pub descale: u64,
    /// The source's batch, head and row strides, in elements.
    pub strides: [i64; 3],
    /// B.
    pub batch: i32,
    /// H: the tensor's heads.
    pub heads: i32,
    /// S.
    pub rows: i32,
    /// D.
    pub head_dim: i32,
    /// Hkv: the descale's second dim.
    pub kv_heads: i32,
    /// Heads per K/V head (head h's factor is column h / group).
    pub group: i32,
}

/// An e4m3 V transposed for the Hopper kernel's e4m3 entries
/// (fa::TransposeParams): [B, Hkv, D, keys] contiguous, keys = Sk rounded up
/// to 16, each 16 keys in P's order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TransposeParams {
    /// V, e4m3 [B, Hkv, Sk, D].
    pub src: u64,
    /// Vᵀ.
    pub dst: u64,
    /// V's batch, head and row strides, in elements (bytes).
    pub strides: [i64; 3],
    /// Hkv.
    pub heads: i32,
    /// Sk.
    pub rows: i32,
    /// D.
    pub head_dim: i32,
    /// Vᵀ's row length: Sk rounded up to 16.
    pub keys: i32,
}

/// The bytes of a `CUtensorMap` (fa::TmaDesc).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct TmaDesc(pub [u64; 16]);

/// n / div as `umulhi(n, mul) >> shr` for 0 <= n < 2^31 (fa::FastDiv): the
/// Hopper kernel's divisions by launch constants, without a hardware divide.
///
/// ```
/// use kernel_ffi::params::FastDiv;
///
/// let by7 = FastDiv::new(7);
/// assert!((0..10_000).all(|n| by7.apply(n) == n / 7));
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastDiv {
    /// The divisor (at least 1).
    pub div: u32,
    /// The multiplier, ⌈2^(32 + shr) / div⌉ (0 for a divisor of 1).
    pub mul: u32,
    /// The shift after the high half of the product.
    pub shr: u32,
}

impl FastDiv {
    /// The round-up method for 31-bit dividends: with l = ⌈log2 d⌉, mul = ⌈2^(31+l) / d⌉
    /// fits in 32 bits and (n · mul) >> (31 + l) = ⌊n / d⌋. `d` = 1 is special-cased on
    /// the device (mul would need 33 bits).
    pub fn new(d: u32) -> FastDiv {
        let d = d.max(1);
        if d == 1 {
            return FastDiv { div: 1, mul: 0, shr: 0 };
        }
        let l = 32 - (d - 1).leading_zeros();
        let p = 31 + l;
        let mul = (1u64 << p).div_ceil(u64::from(d));
        FastDiv { div: d, mul: mul as u32, shr: p - 32 }
    }

    /// What the device computes.
    pub fn apply(self, n: u32) -> u32 {
        if self.div == 1 { n } else { ((u64::from(n) * u64::from(self.mul)) >> 32) as u32 >> self.shr }
    }
}

/// The Hopper kernel's work decomposition (fa::HopperSched): its persistent
/// entries' units, grid-strided over the CTAs (`planner::Units`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HopperSched {
    /// Units in all.
    pub units: i32,
    /// Units per (split, batch, head); causal: per (batch, head).
    pub per_head: FastDiv,
    /// Batch × heads.
    pub bh: FastDiv,
    /// Heads.
    pub heads: FastDiv,
    /// Query heads per K/V head.
    pub group: FastDiv,
    /// Query blocks per (split, batch, head).
    pub blocks: FastDiv,
    /// Causal persistent launches: device address of `grid × order_stride` block
    /// indices (planner::causal_order); else 0.
    pub order: u64,
    /// Block indices per CTA in `order`.
    pub order_stride: i32,
    /// Split-tail entries: units run whole (`planner::whole_units`); the rest
    /// run as three 64-row items each. Elsewhere `units`.
    pub whole_units: i32,
}

/// The Hopper entries' parameters (fa::HopperParams): TMA maps of q, k, v and
/// the output, the portable entries' parameters and the work decomposition.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HopperParams {
    /// Q's map: boxes of one swizzle panel (64 or 32 columns) × the entry's query rows.
    pub q_map: TmaDesc,
    /// K's map: boxes of one swizzle panel (64 or 32 columns) × the entry's key tile.
    pub k_map: TmaDesc,
    /// V's map: boxes of one swizzle panel (64 or 32 columns) × the entry's key tile.
    pub v_map: TmaDesc,
    /// The output's map: boxes of one swizzle panel (64 or 32 columns) × a warpgroup's 64 rows.
    pub o_map: TmaDesc,
    /// Addresses, strides and sizes, as the portable entries take them.
    pub p: FlashParams,
    /// The persistent entries' units.
    pub sched: HopperSched,
}

/// The Hopper kernel's e4m3 entries' parameters (fa::HopperFp8Params): its
/// 16-bit entries' with `v_map` over V transposed (`TransposeParams`'s dst),
/// and the descales as in [`Fp8Params`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HopperFp8Params {
    /// Maps, addresses, sizes and units.
    pub hp: HopperParams,
    /// q's factors, fp32 [B, Hkv], or 0 for 1.
    pub q_descale: u64,
    /// k's.
    pub k_descale: u64,
    /// v's.
    pub v_descale: u64,
}

/// A serving call's sequences (fa::SeqParams), for the `_varlen` entries:
/// where each sequence's query rows and keys lie. Device arrays are addresses
/// (0: absent); the kernels clamp every index they read from them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SeqParams {
    /// [seqs + 1] row offsets into packed q and out, or 0: sequence s is q's batch s.
    pub cu_seqlens_q: u64,
    /// [seqs + 1] row offsets into packed k and v, or 0.
    pub cu_seqlens_k: u64,
    /// [seqs] keys each sequence uses, or 0: all it has.
    pub seqused_k: u64,
    /// [seqs, block_table_stride] page indices, or 0: not paged.
    pub block_table: u64,
    /// Sequences.
    pub seqs: i32,
    /// Query rows per sequence the grid covers.
    pub max_seqlen_q: i32,
    /// k and v's batch extent (pages when paged).
    pub kv_batch: i32,
    /// Elements between block-table rows.
    pub block_table_stride: i32,
    /// Page slots per sequence in the block table.
    pub max_pages: i32,
    /// Query heads per K/V head.
    pub group: FastDiv,
    /// Keys per page (paged; else 1).
    pub page_size: FastDiv,
}

/// The `_varlen` entries' parameters (fa::VarlenParams).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VarlenParams {
    /// The tensors, as the dense entries take them (q and out as one batch of
    /// total_q rows when packed; k and v as pages when paged).
    pub p: FlashParams,
    /// The sequences.
    pub seq: SeqParams,
}

/// The Hopper kernel's serving entries' parameters (fa::HopperVarlenParams):
/// the maps describe the tensors as `VarlenParams::p` does; `hp.sched` is unused.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HopperVarlenParams {
    /// The maps and the tensors.
    pub hp: HopperParams,
    /// The sequences.
    pub seq: SeqParams,
}

/// The combine entries' parameters (fa::CombineParams): merge each split's
/// partial output and LSE into the output.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CombineParams {
    /// fp32 outputs of each split, [num_splits, B, H, Sq, D].
    pub o_partial: u64,
    /// fp32 LSEs of each split, [num_splits, B, H, Sq].
    pub lse_partial: u64,
    /// The output, [B, H, Sq, D] in the input dtype.
    pub o: u64,
    /// The merged LSE, [B, H, Sq] fp32, or 0 for none.
    pub lse: u64,
    /// The output's batch, head and row strides, in elements.
    pub o_strides: [i64; 3],
    /// B.
    pub batch: i32,
    /// H.
    pub heads: i32,
    /// Sq.
    pub seqlen_q: i32,
    /// Splits to merge.
    pub num_splits: i32,
    /// Packed queries (the `_varlen` combine): [seqs + 1] row offsets, only the
    /// rows of which are merged; else 0.
    pub cu_seqlens_q: u64,
    /// Sequences in `cu_seqlens_q`.
    pub seqs: i32,
    /// Query rows per sequence the forward grid covered.
    pub max_seqlen_q: i32,
}

/// The fp32 GPU reference's parameters (fa::ReferenceParams).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReferenceParams {
    /// Q, [B, H, Sq, D] in the input dtype.
    pub q: u64,
    /// K, [B, Hkv, Sk, D].
    pub k: u64,
    /// V, [B, Hkv, Sk, D].
    pub v: u64,
    /// The output, [B, H, Sq, D] contiguous fp32.
    pub o: u64,
    /// The LSE, [B, H, Sq] fp32.
    pub lse: u64,
    /// Q's batch, head and row strides, in elements.
    pub q_strides: [i64; 3],
    /// K's batch, head and row strides.
    pub k_strides: [i64; 3],
    /// V's batch, head and row strides.
    pub v_strides: [i64; 3],
    /// B.
    pub batch: i32,
    /// H.
    pub heads: i32,
    /// Hkv.
    pub kv_heads: i32,
    /// Sq.
    pub seqlen_q: i32,
    /// Sk.
    pub seqlen_k: i32,
    /// D.
    pub head_dim: i32,
    /// Keys row i sees: i + Sk − Sq − window_left … i + Sk − Sq + window_right; −1: unbounded.
    pub window_left: i32,
    /// See `window_left`.
    pub window_right: i32,
    /// The softmax scale.
    pub scale: f32,
    /// Scores become softcap · tanh(score / softcap) after scaling; 0: none.
    pub softcap: f32,
}

// SAFETY: plain-old-data with the C layout of the structs in flash_params.h
// (pointers as u64 device addresses, int64_t strides, int32_t/float scalars).
unsafe impl DeviceRepr for FlashParams {}
// SAFETY: #[repr(C)] plain data mirroring fa::Fp8Params (kernels/flash_params.h).
unsafe impl DeviceRepr for Fp8Params {}
// SAFETY: #[repr(C)] plain data mirroring fa::DequantParams (kernels/flash_params.h).
unsafe impl DeviceRepr for DequantParams {}
// SAFETY: #[repr(C)] plain data mirroring fa::TransposeParams (kernels/flash_params.h).
unsafe impl DeviceRepr for TransposeParams {}
// SAFETY: as above, mirrors fa::HopperFp8Params (HopperParams, a multiple of 64 bytes, then three
// pointers as u64).
unsafe impl DeviceRepr for HopperFp8Params {}
// SAFETY: as above, mirrors fa::HopperParams (four 64-byte-aligned 128-byte tensor maps, FlashParams,
// then HopperSched: an int32_t, five FastDiv of three uint32_t, a pointer as u64 and two
// int32_t).
unsafe impl DeviceRepr for HopperParams {}
// SAFETY: as above, mirrors fa::VarlenParams (FlashParams, then SeqParams: four pointers as u64,
// five int32_t, two FastDiv).
unsafe impl DeviceRepr for VarlenParams {}
// SAFETY: as above, mirrors fa::HopperVarlenParams (HopperParams, whose size is a multiple of its
// 64-byte alignment, then SeqParams).
unsafe impl DeviceRepr for HopperVarlenParams {}
// SAFETY: as above, mirrors fa::CombineParams.
unsafe impl DeviceRepr for CombineParams {}
// SAFETY: as above, mirrors fa::ReferenceParams.
unsafe impl DeviceRepr for ReferenceParams {}

// 7 pointers + 12 strides + 11 four-byte fields, padded to 8 bytes.
const _: () = assert!(std::mem::size_of::<FlashParams>() == 7 * 8 + 12 * 8 + 12 * 4);
// Four tensor maps, FlashParams at offset 512, HopperSched right after it, padded
// to the 64-byte alignment.
const _: () = assert!(std::mem::size_of::<Fp8Params>() == std::mem::size_of::<FlashParams>() + 3 * 8);
const _: () = assert!(std::mem::size_of::<DequantParams>() == 6 * 8 + 6 * 4);
const _: () = assert!(std::mem::size_of::<TransposeParams>() == 5 * 8 + 4 * 4);
const _: () = assert!(std::mem::offset_of!(HopperFp8Params, q_descale) == std::mem::size_of::<HopperParams>());
const _: () = assert!(std::mem::size_of::<HopperSched>() == 4 + 5 * 12 + 8 + 2 * 4);
const _: () = assert!(std::mem::offset_of!(HopperSched, order) == 4 + 5 * 12);
const _: () = assert!(std::mem::offset_of!(HopperParams, p) == 512);
const _: () = assert!(std::mem::offset_of!(HopperParams, sched) == 512 + std::mem::size_of::<FlashParams>());
const _: () = assert!(
    std::mem::size_of::<HopperParams>()
        == (512 + std::mem::size_of::<FlashParams>() + std::mem::size_of::<HopperSched>()).next_multiple_of(64)
);
const _: () = assert!(std::mem::size_of::<CombineParams>() == 4 * 8 + 3 * 8 + 4 * 4 + 8 + 2 * 4);
const _: () = assert!(std::mem::size_of::<SeqParams>() == 4 * 8 + 5 * 4 + 2 * 12 + 4);
const _: () = assert!(std::mem::offset_of!(VarlenParams, seq) == std::mem::size_of::<FlashParams>());
const _: () = assert!(std::mem::offset_of!(HopperVarlenParams, seq) == std::mem::size_of::<HopperParams>());
const _: () = assert!(std::mem::size_of::<ReferenceParams>() == 5 * 8 + 9 * 8 + 10 * 4);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_div_matches_division() {
        let ns = |d: u32| {
            let edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, (1 << 31) - 1, (1 << 31) - d];
            edges.into_iter().chain((0..2000u32).map(move |i| i.wrapping_mul(2_654_435_761) >> 1))
        };
        for d in (1..5000).chain([65_535, 65_536, 1 << 20, (1 << 30) + 7, (1 << 31) - 1]) {
            let f = FastDiv::new(d);
            for n in ns(d).filter(|&n| n < 1 << 31) {
                assert_eq!(f.apply(n), n / d, "{n} / {d} with {f:?}");
            }
        }
    }
}
