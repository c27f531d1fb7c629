//! What kernel-ffi and xtask share, in a crate of their own so that xtask
//! links no CUDA crate: the kernel manifest (`manifest`), the JSON the
//! kernel-ffi binaries write and xtask reads (`schema`), the record of a
//! finished kernel build (`kernel_set`), the one bounded reader and atomic
//! writer of files (`file`), the launch API's shape rules (`tensor`, `shape`),
//! and the environment the binaries read (`env`).

pub mod exit;
pub mod file;
pub mod gpu;
pub mod kernel_set;
pub mod manifest;
pub mod schema;
pub mod shape;
pub mod tensor;

/// The environment variables the kernel-ffi binaries read and xtask sets.
pub mod env {
    /// The GPU a binary opens: a CUDA ordinal or a UUID.
    pub const DEVICE: &str = "FA_DEVICE";
    /// The kernel set a binary loads.
    pub const KERNEL_DIR: &str = "FA_KERNEL_DIR";
}
