//! Timing on the GPU: the bench and its regression gate, named baselines,
//! Nsight Compute profiles, and the tile-configuration sweep.

pub mod bench;
pub mod compare;
pub mod gate;
pub mod payload;
pub mod profile;
pub mod tune;
