//! Timing on the GPU: the bench and its regression gate (its verdicts
//! explained), named baselines, Nsight Compute profiles, and the
//! tile-configuration sweep.

pub mod bench;
pub mod compare;
pub mod explain;
pub mod gate;
pub mod payload;
pub mod profile;
pub mod tune;
