//! What kernel-ffi and xtask share, in a crate of their own so that xtask
//! links no CUDA crate: the kernel manifest (`manifest`), the JSON the
//! kernel-ffi binaries write and xtask reads (`schema`), the record of a
//! finished kernel build (`kernel_set`), and the one bounded reader and atomic
//! writer of files (`file`).

pub mod file;
pub mod kernel_set;
pub mod manifest;
pub mod schema;
