//! The two ways a task ends badly, and the exit code each means (README): a
//! check that ran and failed (1, `fa_schema::exit::CheckFailed`, shared with
//! the kernel-ffi binaries), a check that could not run (2). Imports nothing
//! else in the crate.

pub use fa_schema::exit::CheckFailed;

/// The check could not run: missing tool or GPU, bad input. Exit 2.
#[derive(Debug)]
pub struct CannotRun(pub String);

impl std::fmt::Display for CannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for CannotRun {}

/// Prints the whole error chain (a failed unit's first nvcc error and its log
/// path are in it) and gives the exit code it means.
pub fn report(err: &anyhow::Error) -> std::process::ExitCode {
    let code = fa_schema::exit::code(err);
    let what = if code == 1 { "FAILED" } else { "could not run" };
    eprintln!("xtask: {what}: {err:#}");
    std::process::ExitCode::from(code)
}
