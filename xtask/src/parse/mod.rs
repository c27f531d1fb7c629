//! Pure parsers of tool output: text in, typed records out, no IO, no panics.
//! Absent or cut-short output is an error, never an empty result.

#[cfg(test)]
mod fuzz;
pub mod ncu;
pub mod nvcc;
pub mod ptxas;
pub mod sanitizer;
pub mod sass;
pub mod smi;
pub mod xml;
