//! Correctness on the GPU: the machine's readiness (`preflight`), the test
//! matrix (`fa-test`) and compute-sanitizer.

pub mod preflight;
pub mod sanitize;
pub mod spread;
pub mod test;
