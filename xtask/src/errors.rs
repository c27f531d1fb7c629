//! The two ways a task ends badly, and the exit code each means (README): a
//! check that ran and failed (1), a check that could not run (2). Imports
//! nothing else in the crate.

/// A check ran and failed: wrong result, budget breach, finding, regression. Exit 1.
#[derive(Debug)]
pub struct CheckFailed(pub String);

/// The check could not run: missing tool or GPU, bad input. Exit 2.
#[derive(Debug)]
pub struct CannotRun(pub String);

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for CheckFailed {}

impl std::fmt::Display for CannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for CannotRun {}

/// The exit code for a task's error: 1 for a failed check, else 2.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<CheckFailed>().is_some() { 1 } else { 2 }
}

/// Prints the whole error chain (a failed unit's first nvcc error and its log
/// path are in it) and gives the exit code it means.
pub fn report(err: &anyhow::Error) -> std::process::ExitCode {
    let code = exit_code(err);
    let what = if code == 1 { "FAILED" } else { "could not run" };
    eprintln!("xtask: {what}: {err:#}");
    std::process::ExitCode::from(code)
}
