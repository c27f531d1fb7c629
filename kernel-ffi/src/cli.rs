//! Shared ending for the command-line tools: one error line, no backtrace.

use std::process::ExitCode;

/// Exit 0 on success; otherwise print the error chain on one line and exit 2
/// (the tool could not do its job: bad input, missing kernels, CUDA failure).
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `--version`: the crate version, the git revision and rustc it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("FA_GIT_REV"), ", ", env!("FA_RUSTC"), ")");
