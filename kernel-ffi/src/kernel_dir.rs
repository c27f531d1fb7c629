//! Where the kernel set `cargo xtask build` wrote is found.
//!
//! A kernel set is a folder holding `manifest.json` beside the fatbins and
//! `kernel-set.json` (the record of the build that wrote them); `cargo xtask
//! build` writes one to `target/kernels` of the flash-pipeline checkout. Two
//! rules look for one:
//!
//! - [`find_for_library`], the rule of [`Attention::new`](crate::Attention::new)
//!   and so of any program that depends on kernel-ffi:
//!   1. `FA_KERNEL_DIR`, when set and not empty. It is then the only place
//!      looked: a folder named outright and missing is an error, not a reason to
//!      guess.
//!   2. The flash-pipeline checkout the current directory is in (the nearest
//!      ancestor holding `kernels/manifest.json`): its `target/kernels`, or
//!      `$CARGO_TARGET_DIR/kernels` where that is set, as xtask builds it.
//!
//!   A program outside the checkout names its kernel set with `FA_KERNEL_DIR` or
//!   passes it to [`Attention::with_kernel_dir`](crate::Attention::with_kernel_dir).
//!   The library does not look beside the executable: for a dependent crate's
//!   program that is its own `target/kernels`, which no build writes.
//! - [`find`], the rule of kernel-ffi's own tools (`fa-run`, `fa-test`,
//!   `fa-bench`): the same two places, then `../kernels` beside the executable,
//!   so that `target/release/fa-run` finds `target/kernels` from any directory
//!   and a tool copied with its kernel set (`bin/fa-run` beside `kernels/`)
//!   finds that.
//!
//! Both are pure functions of [`Places`] and a file probe ([`search_for_library`],
//! [`search`]), so the rules are tested without touching the file system; `find*`
//! feed them the process's environment.
//!
//! ```
//! use std::path::{Path, PathBuf};
//! use kernel_ffi::kernel_dir::{Places, search, search_for_library};
//!
//! // A dependent program, run from its own crate, with nothing set.
//! let places = Places {
//!     cwd: Some("/home/me/app".into()),
//!     exe: Some("/home/me/app/target/debug/app".into()),
//!     ..Places::default()
//! };
//! let exists = |p: &Path| p == Path::new("/home/me/app/target/kernels/manifest.json");
//! let e = search_for_library(&places, exists).unwrap_err();
//! assert!(e.looked.is_empty()); // not its own target/kernels
//! assert!(e.to_string().contains("FA_KERNEL_DIR") && e.to_string().contains("with_kernel_dir"));
//! // kernel-ffi's own tools do look beside the executable.
//! assert_eq!(search(&places, exists), Ok(PathBuf::from("/home/me/app/target/kernels")));
//!
//! // FA_KERNEL_DIR, when set, is where both rules look.
//! let places = Places { env: Some("/opt/fa/kernels".into()), ..places };
//! let exists = |p: &Path| p == Path::new("/opt/fa/kernels/manifest.json");
//! assert_eq!(search_for_library(&places, exists), Ok(PathBuf::from("/opt/fa/kernels")));
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

/// The variable that names the kernel folder outright: `FA_KERNEL_DIR`.
pub const ENV: &str = fa_schema::env::KERNEL_DIR;

/// What the search starts from: the process's environment, or any other for a
/// test or a dry run.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// `FA_KERNEL_DIR` (unset or empty: `None`).
    pub env: Option<PathBuf>,
    /// `CARGO_TARGET_DIR` (unset or empty: `None`); relative to the checkout when relative.
    pub cargo_target_dir: Option<PathBuf>,
    /// The current directory, whose nearest ancestor holding
    /// `kernels/manifest.json` is the checkout searched (`None`: unknown).
    pub cwd: Option<PathBuf>,
    /// The running executable, whose folder's `../kernels` the tools' rule searches
    /// (`None`: unknown; the library's rule never reads it).
    pub exe: Option<PathBuf>,
}

impl Places {
    /// This process's: `FA_KERNEL_DIR`, `CARGO_TARGET_DIR`, the current
    /// directory and the executable's path.
    pub fn from_env() -> Places {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Places {
            env: var(ENV),
            cargo_target_dir: var("CARGO_TARGET_DIR"),
            cwd: std::env::current_dir().ok(),
            exe: std::env::current_exe().ok(),
        }
    }
}

/// No place searched holds a `manifest.json`. The message names every place
/// looked and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// Every folder looked in, in search order.
    pub looked: Vec<PathBuf>,
    /// Why, and what to do: the text after "compiled kernels not found: ".
    message: String,
}

impl NotFound {
    /// The message without the "compiled kernels not found: " that `Display` puts first.
    pub fn reason(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "compiled kernels not found: {}", self.message)
    }
}

impl std::error::Error for NotFound {}

/// The kernel folder for kernel-ffi's own tools: [`search`] over this
/// process's [`Places`].
pub fn find() -> Result<PathBuf, NotFound> {
    search(&Places::from_env(), Path::is_file)
}

/// The kernel folder [`Attention::new`](crate::Attention::new) loads:
/// [`search_for_library`] over this process's [`Places`].
pub fn find_for_library() -> Result<PathBuf, NotFound> {
    search_for_library(&Places::from_env(), Path::is_file)
}

/// The tools' rule: `FA_KERNEL_DIR`, else the checkout's kernels, else
/// `../kernels` beside the executable; the first folder whose `manifest.json`
/// `is_file` accepts.
pub fn search(places: &Places, is_file: impl Fn(&Path) -> bool) -> Result<PathBuf, NotFound> {
    search_by(places, &is_file, Rule::Tools)
}

/// The library's rule: `FA_KERNEL_DIR`, else the checkout's kernels; never
/// beside the executable (see the module docs). The first folder whose
/// `manifest.json` `is_file` accepts.
pub fn search_for_library(places: &Places, is_file: impl Fn(&Path) -> bool) -> Result<PathBuf, NotFound> {
    search_by(places, &is_file, Rule::Library)
}

/// Which of the two rules a search follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// kernel-ffi's tools: also beside the executable.
    Tools,
    /// `Attention::new`: `FA_KERNEL_DIR` and the checkout only.
    Library,
}

fn search_by(places: &Places, is_file: &dyn Fn(&Path) -> bool, rule: Rule) -> Result<PathBuf, NotFound> {
    if let Some(dir) = &places.env {
        if is_file(&dir.join("manifest.json")) {
            return Ok(dir.clone());
        }
        return Err(NotFound {
            looked: vec![dir.clone()],
            message: format!(
                "{ENV}={} holds no manifest.json; point {ENV} at the folder `cargo xtask build` wrote \
                 (target/kernels of the flash-pipeline checkout) or unset it to search the checkout",
                dir.display()
            ),
        });
    }
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    let mut notes = Vec::new();
    match &places.cwd {
        Some(cwd) => match cwd.ancestors().find(|d| is_file(&d.join("kernels/manifest.json"))) {
            Some(root) => {
                let target = match &places.cargo_target_dir {
                    Some(t) if t.is_absolute() => t.clone(),
                    Some(t) => root.join(t),
                    None => root.join("target"),
                };
                candidates.push((target.join("kernels"), format!("the checkout at {}", root.display())));
            }
            None => notes.push(format!("no checkout (kernels/manifest.json) in {} or its parents", cwd.display())),
        },
        None => notes.push("the current directory is unknown".to_string()),
    }
    if rule == Rule::Tools {
        match places.exe.as_deref().and_then(Path::parent).and_then(Path::parent) {
            Some(up) => {
                let dir = up.join("kernels");
                if !candidates.iter().any(|(d, _)| *d == dir) {
                    candidates.push((dir, "beside the executable".to_string()));
                }
            }
            None => notes.push("the executable's folder is unknown".to_string()),
        }
    }
    if let Some((dir, _)) = candidates.iter().find(|(d, _)| is_file(&d.join("manifest.json"))) {
        return Ok(dir.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|(d, why)| format!("{} ({why})", d.display())).collect();
    let mut message = if looked.is_empty() {
        format!("{ENV} is not set")
    } else {
        format!("no manifest.json in {}", looked.join(" or "))
    };
    for note in &notes {
        message.push_str("; ");
        message.push_str(note);
    }
    message.push_str(&match rule {
        Rule::Tools => format!(
            "; run `cargo xtask build` in the flash-pipeline checkout and run from inside it, \
             or set {ENV} to the folder it wrote"
        ),
        Rule::Library => format!(
            "; build the kernels with `cargo xtask build` in the flash-pipeline checkout, then set {ENV} \
             to the folder it wrote (its target/kernels) or pass that folder to `Attention::with_kernel_dir`"
        ),
    });
    Err(NotFound { looked: candidates.into_iter().map(|(d, _)| d).collect(), message })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> impl Fn(&Path) -> bool {
        let set: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        move |p: &Path| set.iter().any(|f| f == p)
    }

    fn places(cwd: &str, exe: &str) -> Places {
        Places { cwd: Some(cwd.into()), exe: Some(exe.into()), ..Places::default() }
    }

    #[test]
    fn a_copied_binary_finds_the_kernels_of_the_checkout_it_runs_in() {
        let fs = files(&["/repo/kernels/manifest.json", "/repo/target/kernels/manifest.json"]);
        let found = search(&places("/repo/kernel-ffi/src", "/home/me/bin/fa-run"), &fs);
        assert_eq!(found, Ok(PathBuf::from("/repo/target/kernels")));
        // The checkout comes before the folder beside the executable.
        let fs = files(&[
            "/repo/kernels/manifest.json",
            "/repo/target/kernels/manifest.json",
            "/other/target/kernels/manifest.json",
        ]);
        let found = search(&places("/repo", "/other/target/release/fa-run"), &fs);
        assert_eq!(found, Ok(PathBuf::from("/repo/target/kernels")));
    }

    #[test]
    fn cargo_target_dir_moves_the_checkout_kernels_as_it_moves_xtasks() {
        let fs = files(&["/repo/kernels/manifest.json", "/repo/out/kernels/manifest.json", "/t/kernels/manifest.json"]);
        let mut p = places("/repo", "/x/y/fa-run");
        p.cargo_target_dir = Some("out".into());
        assert_eq!(search(&p, &fs), Ok(PathBuf::from("/repo/out/kernels")));
        p.cargo_target_dir = Some("/t".into());
        assert_eq!(search(&p, &fs), Ok(PathBuf::from("/t/kernels")));
    }

    #[test]
    fn beside_the_executable_outside_a_checkout() {
        let fs = files(&["/dist/kernels/manifest.json"]);
        assert_eq!(search(&places("/tmp", "/dist/bin/fa-run"), &fs), Ok(PathBuf::from("/dist/kernels")));
    }

    #[test]
    fn fa_kernel_dir_wins_and_is_not_second_guessed() {
        let fs = files(&["/k/manifest.json", "/repo/kernels/manifest.json", "/repo/target/kernels/manifest.json"]);
        let mut p = places("/repo", "/repo/target/release/fa-run");
        p.env = Some("/k".into());
        assert_eq!(search(&p, &fs), Ok(PathBuf::from("/k")));
        p.env = Some("/nothing".into());
        let e = search(&p, &fs).unwrap_err();
        assert_eq!(e.looked, [PathBuf::from("/nothing")]);
        assert!(e.to_string().contains("FA_KERNEL_DIR=/nothing holds no manifest.json"), "{e}");
    }

    #[test]
    fn the_error_names_every_place_and_the_variable() {
        let fs = files(&["/repo/kernels/manifest.json"]);
        let e = search(&places("/repo/sub", "/repo/target/release/fa-run"), &fs).unwrap_err();
        assert_eq!(e.looked, [PathBuf::from("/repo/target/kernels")], "one folder, found twice");
        let e = search(&places("/repo/sub", "/opt/fa/bin/fa-run"), &fs).unwrap_err();
        assert_eq!(e.looked, [PathBuf::from("/repo/target/kernels"), PathBuf::from("/opt/fa/kernels")]);
        let msg = e.to_string();
        for want in ["/repo/target/kernels (the checkout at /repo)", "/opt/fa/kernels (beside the executable)"] {
            assert!(msg.contains(want), "{msg}");
        }
        assert!(msg.contains("cargo xtask build") && msg.contains("FA_KERNEL_DIR"), "{msg}");
        let e = search(&places("/tmp", "/opt/fa/bin/fa-run"), files(&[])).unwrap_err();
        assert!(e.to_string().contains("no checkout (kernels/manifest.json) in /tmp or its parents"), "{e}");
        assert_eq!(e.looked.last(), Some(&PathBuf::from("/opt/fa/kernels")));
    }

    #[test]
    fn the_library_never_looks_in_a_dependent_programs_own_target() {
        // A crate that depends on kernel-ffi, run from its own folder: its
        // target/kernels is beside the executable, and no build writes it.
        let fs = files(&["/home/me/app/target/kernels/manifest.json"]);
        let p = places("/home/me/app", "/home/me/app/target/debug/app");
        assert_eq!(search(&p, &fs), Ok(PathBuf::from("/home/me/app/target/kernels")), "the tools' rule does");
        let e = search_for_library(&p, &fs).unwrap_err();
        assert!(e.looked.is_empty(), "{:?}", e.looked);
        let msg = e.to_string();
        for want in [
            "compiled kernels not found: FA_KERNEL_DIR is not set",
            "no checkout (kernels/manifest.json) in /home/me/app or its parents",
            "`cargo xtask build` in the flash-pipeline checkout",
            "set FA_KERNEL_DIR to the folder it wrote",
            "pass that folder to `Attention::with_kernel_dir`",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }
        assert!(!msg.contains("/home/me/app/target"), "{msg}");
        assert_eq!(e.reason(), msg.strip_prefix("compiled kernels not found: ").unwrap());
    }

    #[test]
    fn the_library_takes_fa_kernel_dir_and_the_checkout_as_the_tools_do() {
        let fs = files(&["/k/manifest.json", "/repo/kernels/manifest.json", "/repo/target/kernels/manifest.json"]);
        let mut p = places("/repo/examples", "/repo/target/debug/examples/forward");
        assert_eq!(search_for_library(&p, &fs), Ok(PathBuf::from("/repo/target/kernels")));
        p.cargo_target_dir = Some("/t".into());
        let e = search_for_library(&p, &fs).unwrap_err();
        assert_eq!(e.looked, [PathBuf::from("/t/kernels")]);
        assert!(e.to_string().contains("no manifest.json in /t/kernels (the checkout at /repo)"), "{e}");
        p.env = Some("/k".into());
        assert_eq!(search_for_library(&p, &fs), Ok(PathBuf::from("/k")));
        p.env = Some("/nothing".into());
        let e = search_for_library(&p, &fs).unwrap_err();
        assert_eq!(e.looked, [PathBuf::from("/nothing")]);
        assert!(e.to_string().contains("FA_KERNEL_DIR=/nothing holds no manifest.json"), "{e}");
    }
}
