//! The git revision and rustc the binaries are built from, for `--version`
//! (kernel-ffi's binaries and xtask, which shares this script).

use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let rev = output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "no git".into());
    let rustc = std::env::var("RUSTC").ok().and_then(|r| output(&r, &["--version"])).unwrap_or_default();
    println!("cargo:rustc-env=FA_GIT_REV={rev}");
    println!("cargo:rustc-env=FA_RUSTC={rustc}");
    // A commit moves HEAD or the branch it names (a loose ref, else packed-refs).
    // Only files that exist: cargo reruns a script on every build for a missing one.
    if let Some(git_dir) = output("git", &["rev-parse", "--absolute-git-dir"]) {
        let common =
            output("git", &["rev-parse", "--path-format=absolute", "--git-common-dir"]).unwrap_or(git_dir.clone());
        let branch = output("git", &["symbolic-ref", "-q", "HEAD"]).map(|b| format!("{common}/{b}"));
        let watched = [Some(format!("{git_dir}/HEAD")), branch, Some(format!("{common}/packed-refs"))];
        for path in watched.into_iter().flatten().filter(|p| std::path::Path::new(p).is_file()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-env-changed=RUSTC");
}
