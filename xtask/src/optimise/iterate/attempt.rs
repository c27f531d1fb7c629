//! A rejected attempt under `perf/rejected/NNN-slug/`: `attempt.patch` (paths
//! relative to the repository root: `git apply perf/rejected/NNN-slug/attempt.patch`
//! replays it), `record.json` (its ledger record) and `reports/`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

use super::tree::{self, Change, Store, Tree};
use crate::tools::process::Cmd;
use crate::tools::process::Lock;

/// A short folder name for an attempt: the first six words of the hypothesis.
pub fn slug(text: &str) -> String {
    crate::run::slug(text).split('-').take(6).collect::<Vec<_>>().join("-")
}

/// The number a folder name starts with (`046-the-q…` → 46).
fn number(name: &str) -> Option<u32> {
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || !name[digits.len()..].starts_with('-') {
        return None;
    }
    digits.parse().ok()
}

/// Reserves `rejected/NNN-slug` by creating it (create-exclusive, under a lock
/// on the folder), NNN at least `floor` and above every attempt already there,
/// half-written ones included, so no attempt is ever written over.
pub fn reserve(rejected: &Path, floor: u32, slug: &str) -> Result<(u32, PathBuf)> {
    std::fs::create_dir_all(rejected).with_context(|| format!("creating {}", rejected.display()))?;
    let _lock = Lock::hold(&rejected.join(".reserve.lock"), "reserving an attempt number")?;
    let mut n = floor;
    for e in std::fs::read_dir(rejected).with_context(|| format!("listing {}", rejected.display()))? {
        let e = e.with_context(|| format!("listing {}", rejected.display()))?;
        if let Some(k) = number(&e.file_name().to_string_lossy()) {
            n = n.max(k + 1);
        }
    }
    loop {
        let dir = rejected.join(format!("{n:03}-{slug}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((n, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
}

/// A fresh, uniquely named folder under `parent`, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(parent: &Path, what: &str) -> Result<Scratch> {
        static N: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = parent.join(format!("{what}-{}-{nanos}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// git in `dir` with settings that keep a user's configuration out of its output.
fn git(dir: &Path) -> Cmd {
    Cmd::new("git")
        .args(["-c", "core.autocrlf=false", "-c", "core.filemode=true", "-c", "core.symlinks=true"])
        .cwd(dir)
        .quiet()
}

/// The attempt (`base` → `cand` at the changed paths) as one binary-safe patch
/// from git's own diff of two trees staged in a scratch repository under `scratch`.
pub fn patch(scratch: &Path, store: &Store, base: &Tree, cand: &Tree, changes: &[Change]) -> Result<String> {
    let s = Scratch::new(scratch, "patch")?;
    let dir = &s.0;
    let paths: Vec<&str> = changes.iter().map(Change::path).collect();
    let stage = |tree: &Tree| -> Result<String> {
        tree::materialize(dir, store, tree, &paths)?;
        git(dir).args(["add", "-A", "-f", "--", "."]).run_checked()?;
        Ok(git(dir).arg("write-tree").run_checked()?.stdout.trim().to_string())
    };
    git(dir).args(["init", "-q"]).run_checked().context("creating a scratch repository for the patch")?;
    let (a, b) = (stage(base)?, stage(cand)?);
    let out = git(dir)
        .args(["diff-tree", "-p", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff"])
        .args(["--src-prefix=a/", "--dst-prefix=b/", &a, &b])
        .run_checked()
        .context("diffing the attempt")?;
    if out.stdout.trim().is_empty() {
        bail!("the attempt's patch came out empty although {} path(s) changed", paths.len());
    }
    Ok(out.stdout)
}

/// `git apply --check` of `patch` against commit `rev` of the repository at
/// `root`, through a temporary index: neither the work tree nor the index change.
pub fn check_applies(root: &Path, scratch: &Path, patch: &Path, rev: &str) -> Result<()> {
    let s = Scratch::new(scratch, "apply-check")?;
    let index = s.0.join("index").display().to_string();
    let git = || git(root).env("GIT_INDEX_FILE", index.clone());
    git().args(["read-tree", rev]).run_checked().with_context(|| format!("reading {rev}'s tree"))?;
    let patch = patch.canonicalize().with_context(|| format!("finding {}", patch.display()))?;
    git()
        .args(["apply", "--check", "--cached"])
        .arg(patch.display().to_string())
        .run_checked()
        .with_context(|| format!("{} does not apply to {rev}", patch.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_short_and_safe() {
        assert_eq!(slug("Swizzle K/V smem: 8-way → none!"), "swizzle-k-v-smem-8-way");
        assert_eq!(number("046-the-q"), Some(46));
        assert_eq!((number("pdl-combine"), number("7z-x"), number(".reserve.lock")), (None, None, None));
    }

    /// Two iterates at once, or one after a run that died having reserved its
    /// folder, never share a number or write into another's folder.
    #[test]
    fn concurrent_reservations_get_distinct_numbers() {
        let d = tempfile::tempdir().unwrap();
        let rejected = d.path().join("perf/rejected");
        std::fs::create_dir_all(rejected.join("051-half-written")).unwrap();
        std::fs::create_dir_all(rejected.join("pdl-combine")).unwrap();
        let got: Vec<(u32, PathBuf)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let rejected = &rejected;
                    s.spawn(move || reserve(rejected, 51, &format!("try-{}", t % 2)).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut numbers: Vec<u32> = got.iter().map(|g| g.0).collect();
        numbers.sort();
        assert_eq!(numbers, (52..60).collect::<Vec<_>>());
        for (n, dir) in &got {
            assert!(dir.is_dir() && dir.file_name().unwrap().to_string_lossy().starts_with(&format!("{n:03}-try-")));
        }
        assert_eq!(reserve(&rejected, 3, "x").unwrap().0, 60, "above every existing attempt, not only the floor");
    }
}
