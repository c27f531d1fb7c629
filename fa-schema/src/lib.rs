//! The types kernel-ffi and xtask share, in a crate of their own so that xtask
//! links no CUDA crate: the kernel manifest (`manifest`) and the JSON the
//! kernel-ffi binaries write and xtask reads (`schema`). Pure serde.

pub mod manifest;
pub mod schema;
