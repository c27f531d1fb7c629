//! Correctness on the GPU: the test matrix (`fa-test`) and compute-sanitizer.

pub mod sanitize;
pub mod spread;
pub mod test;
