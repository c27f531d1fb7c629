//! Where the kernels `cargo xtask build` wrote are found: `FA_KERNEL_DIR` when
//! set; else the kernel set of the checkout the current directory is in (the
//! nearest ancestor holding `kernels/manifest.json`; its `target/kernels`, or
//! `$CARGO_TARGET_DIR/kernels` as xtask builds it); else `../kernels` beside the
//! executable (target/release → target/kernels). A folder qualifies when it
//! holds `manifest.json`. The search is a pure function of `Places` and a file
//! probe; `find` feeds it the process's environment.

use std::fmt;
use std::path::{Path, PathBuf};

/// The variable that names the kernel folder outright.
pub const ENV: &str = fa_schema::env::KERNEL_DIR;

/// What the search starts from.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// `FA_KERNEL_DIR` (unset or empty: `None`).
    pub env: Option<PathBuf>,
    /// `CARGO_TARGET_DIR` (unset or empty: `None`); relative to the checkout when relative.
    pub cargo_target_dir: Option<PathBuf>,
    pub cwd: Option<PathBuf>,
    pub exe: Option<PathBuf>,
}

impl Places {
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

/// No place searched holds a `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// Every folder looked in, in search order.
    pub looked: Vec<PathBuf>,
    message: String,
}

impl NotFound {
    /// Where a caller that cannot report this error loads from: the first place
    /// looked, whose missing manifest its own error then names.
    pub fn fallback(&self) -> PathBuf {
        self.looked.first().cloned().unwrap_or_else(|| PathBuf::from("target/kernels"))
    }
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NotFound {}

/// The kernel folder for this process (see the module comment).
pub fn find() -> Result<PathBuf, NotFound> {
    search(&Places::from_env(), Path::is_file)
}

/// The first folder of the search order whose `manifest.json` `is_file` accepts.
pub fn search(places: &Places, is_file: impl Fn(&Path) -> bool) -> Result<PathBuf, NotFound> {
    if let Some(dir) = &places.env {
        if is_file(&dir.join("manifest.json")) {
            return Ok(dir.clone());
        }
        return Err(NotFound {
            looked: vec![dir.clone()],
            message: format!(
                "compiled kernels not found: {ENV}={} holds no manifest.json; point {ENV} at the folder \
                 `cargo xtask build` wrote (the checkout's target/kernels) or unset it to search the checkout",
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
    match places.exe.as_deref().and_then(Path::parent).and_then(Path::parent) {
        Some(up) => {
            let dir = up.join("kernels");
            if !candidates.iter().any(|(d, _)| *d == dir) {
                candidates.push((dir, "beside the executable".to_string()));
            }
        }
        None => notes.push("the executable's folder is unknown".to_string()),
    }
    if let Some((dir, _)) = candidates.iter().find(|(d, _)| is_file(&d.join("manifest.json"))) {
        return Ok(dir.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|(d, why)| format!("{} ({why})", d.display())).collect();
    let mut message = if looked.is_empty() {
        "compiled kernels not found: nowhere to look".to_string()
    } else {
        format!("compiled kernels not found: no manifest.json in {}", looked.join(" or "))
    };
    for note in &notes {
        message.push_str("; ");
        message.push_str(note);
    }
    message.push_str(&format!(
        "; run `cargo xtask build` in the checkout and run from inside it, or set {ENV} to the folder it wrote"
    ));
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
        assert_eq!(e.fallback(), PathBuf::from("/opt/fa/kernels"));
    }
}
