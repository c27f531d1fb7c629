//! Split-KV planner: how many key splits make a small problem fill the GPU, and
//! which compiled entry runs it. Pure functions of the device and the shape, so
//! they are tested without a GPU.
//!
//! - `uniform`: `plan`, the split model where every key block costs the same.
//! - `grid`: `LaunchGrid`, a launch as the simulation and the schedule see it, and
//!   `whole_units`, the units a split-tail launch runs whole.
//! - `simulate`: `plan_simulated`, the split model that simulates the grid on the SMs.
//! - `schedule`: `causal_order`, the work lists of persistent causal CTAs.
//! - `prefer`: the measured rules for which entry runs.
//!
//! ```
//! use kernel_ffi::planner::{self, LaunchGrid, Plan};
//!
//! // One 64-row query block against 4096 keys on a 132-SM GPU: one CTA would
//! // leave 131 SMs idle, so the keys are split.
//! let plan = planner::plan(132, 2, 1, 4096, 64);
//! assert!(plan.num_splits > 1 && plan.num_splits <= planner::MAX_SPLITS);
//! assert!(plan.num_splits * plan.keys_per_split >= 4096);
//! // A grid that already fills the GPU runs unsplit.
//! assert_eq!(planner::plan(132, 2, 4 * 16 * 32, 2048, 64), Plan { num_splits: 1, keys_per_split: 2048 });
//!
//! // A causal launch of the Hopper kernel is planned by simulating its grid.
//! let cost = planner::grid_cost(true, 128, true).unwrap();
//! let grid = LaunchGrid {
//!     causal: true,
//!     heads: 1,
//!     seqlen_q: 8192,
//!     seqlen_k: 8192,
//!     block_m: 128,
//!     block_n: 128,
//!     ctas_per_sm: 1,
//!     persistent: true,
//! };
//! let plan = planner::plan_simulated(132, &grid, &cost);
//! assert!(plan.num_splits > 1, "{plan:?}");
//! ```

mod grid;
mod prefer;
mod schedule;
mod simulate;
mod uniform;

pub use grid::{LaunchGrid, Units, decodes_in_i32, whole_units};
pub use prefer::{
    prefer_hopper, prefer_hopper_varlen, prefer_key_groups, prefer_m64, prefer_m192, prefer_narrow_key_groups,
    prefer_persistent, prefer_wide_causal_d64,
};
pub use schedule::causal_order;
pub use simulate::{
    GridCost, HOPPER_D64, HOPPER_D64_CAUSAL, HOPPER_D128, HOPPER_D128_CAUSAL, PORTABLE_D64_CAUSAL,
    PORTABLE_D128_CAUSAL, grid_cost, plan_simulated,
};
pub use uniform::{RAGGED_MIN_BLOCKS, RAGGED_WAVES, plan, plan_fixed, plan_grouped, plan_ragged};

/// Most splits the planner will choose (the combine kernel loops over them).
pub const MAX_SPLITS: u32 = 128;

/// How a forward launch splits the keys: `num_splits` parts of
/// `keys_per_split` keys each (the last may hold fewer), merged by a combine
/// launch where there are several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Key splits, 1 to [`MAX_SPLITS`].
    pub num_splits: u32,
    /// Keys per split, a multiple of the kernel's key tile.
    pub keys_per_split: u32,
}

pub use fa_schema::shape::attention_flops;

/// Devices and launches the tests of several planners share.
#[cfg(test)]
mod fixtures {
    use super::LaunchGrid;

    pub const H200_SMS: u32 = 132;
    pub const L4_SMS: u32 = 58;

    /// 64-row query blocks × batch × heads.
    pub fn ctas(b: u64, h: u64, sq: u64) -> u64 {
        b * h * sq.div_ceil(64)
    }

    /// A causal launch of `heads` heads of `s` queries and keys.
    pub fn grid(heads: u64, s: u32, block_m: u32, block_n: u32, ctas_per_sm: u32, persistent: bool) -> LaunchGrid {
        LaunchGrid { causal: true, heads, seqlen_q: s, seqlen_k: s, block_m, block_n, ctas_per_sm, persistent }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_attention_counts_half_the_flops() {
        assert_eq!(attention_flops(1, 1, 2048, 2048, 128, true), attention_flops(1, 1, 2048, 2048, 128, false) / 2.0);
        assert_eq!(attention_flops(2, 8, 512, 256, 64, false), 4.0 * 16.0 * 512.0 * 256.0 * 64.0);
    }
}
