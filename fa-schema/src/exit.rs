//! The two ways a run ends badly, and the exit code each means, for xtask and
//! the kernel-ffi binaries alike: 0 passed, 1 a check ran and failed
//! (`CheckFailed` anywhere in the error chain), 2 it could not run.

/// A check ran and failed: a wrong result, a budget breach, a finding, a
/// regression. Exit 1.
#[derive(Debug)]
pub struct CheckFailed(pub String);

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckFailed {}

/// 1 where a `CheckFailed` is anywhere in the chain, else 2.
pub fn code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|c| c.is::<CheckFailed>()) { 1 } else { 2 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_failed_check_is_1_wherever_it_sits_in_the_chain() {
        assert_eq!(code(&CheckFailed("2 of 9 cases failed".into()).into()), 1);
        let wrapped =
            Err::<(), _>(anyhow::Error::from(CheckFailed("x".into()))).context("running fa-test").unwrap_err();
        assert_eq!(code(&wrapped), 1);
        assert_eq!(code(&anyhow::anyhow!("no NVIDIA driver here")), 2);
    }
}
