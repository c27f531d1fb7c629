//! The committed optimisation history, `perf/ledger.jsonl`: one iteration a line,
//! appended atomically (unique temp file + rename) under a lock file.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::tools::process::{Lock, write_atomic};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub iteration: u32,
    pub timestamp: String,
    pub git_rev: String,
    pub device: Option<String>,
    pub hypothesis: String,
    /// What the author expected to move, and by how much.
    pub prediction: Option<String>,
    pub changed_files: Vec<String>,
    pub verdict: String,
    /// Why it was rejected or reverted.
    pub reason: Option<String>,
    pub build: Vec<KernelLine>,
    pub test: Option<TestLine>,
    pub sanitized: Option<bool>,
    pub bench: Vec<BenchLine>,
    /// Where the rejected attempt was saved.
    pub patch: Option<String>,
    /// The commit `patch` applies to (`git apply --check` when it was saved);
    /// absent where the accepted tree it was made against was not committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_rev: Option<String>,
    /// Hash of the tree that was built and measured (`iterate::tree::Tree::hash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLine {
    pub kernel: String,
    pub arch: String,
    pub registers: u32,
    pub spill_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestLine {
    pub cases: usize,
    pub failed: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchLine {
    pub case: String,
    pub base_us: Option<f64>,
    pub cand_us: f64,
    pub tflops: f64,
    pub change: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub verdict: Option<String>,
    /// PyTorch SDPA (default backend) time / ours, from the same iterate run.
    pub speedup_vs_torch: Option<f64>,
    /// Why `speedup_vs_torch` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_torch_note: Option<String>,
    /// What differs behind a regression or improvement (the gate's explanation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explanation: Vec<String>,
}

/// The full sanitize runs on every fifth iteration.
pub fn sanitize_due(iteration: u32) -> bool {
    iteration.is_multiple_of(5)
}

/// The number the next iteration will get.
pub fn next_iteration(path: &Path) -> Result<u32> {
    following(&read(path)?).with_context(|| format!("in {}", path.display()))
}

fn following(entries: &[Record]) -> Result<u32> {
    match entries.last() {
        None => Ok(1),
        Some(e) => e.iteration.checked_add(1).with_context(|| {
            format!("the last iteration is {}, the largest number there is; the ledger is damaged", e.iteration)
        }),
    }
}

pub fn read(path: &Path) -> Result<Vec<Record>> {
    parse(path, &read_text(path)?)
}

/// The ledger's text; empty if there is no ledger yet.
fn read_text(path: &Path) -> Result<String> {
    Ok(fa_schema::file::read_text_if_exists(path)?.unwrap_or_default())
}

/// One entry per non-blank line; `path` only names the file in errors.
fn parse(path: &Path, text: &str) -> Result<Vec<Record>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1)))
        .collect()
}

/// Appends one entry under the lock; returns it with its iteration number set:
/// the one after the last line's, or the entry's own where that is higher (a
/// rejected attempt's folder number, which an earlier run that died may have
/// taken). Earlier lines are kept byte for byte (parsed only to number the new
/// one): re-serialising them would rewrite history wherever a float does not
/// survive the round trip.
pub fn append(path: &Path, mut entry: Record) -> Result<Record> {
    let _lock = Lock::hold(&path.with_extension("lock"), "appending to the ledger")?;
    let mut text = read_text(path)?;
    entry.iteration = following(&parse(path, &text)?)?.max(entry.iteration);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&serde_json::to_string(&entry)?);
    text.push('\n');
    write_atomic(path, text.as_bytes(), false)?;
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn entry(h: &str) -> Record {
        Record {
            iteration: 0,
            timestamp: "t".into(),
            git_rev: "r".into(),
            device: None,
            hypothesis: h.into(),
            prediction: None,
            changed_files: vec![],
            verdict: "accepted".into(),
            reason: None,
            build: vec![],
            test: None,
            sanitized: None,
            bench: vec![],
            patch: None,
            base_rev: None,
            tree: None,
        }
    }

    #[test]
    fn appends_number_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf/ledger.jsonl");
        assert_eq!(append(&path, entry("a")).unwrap().iteration, 1);
        assert_eq!(append(&path, entry("b")).unwrap().iteration, 2);
        let all = read(&path).unwrap();
        assert_eq!(all.iter().map(|e| e.hypothesis.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // A child that another test spawns in the moment holds a copy of every
        // descriptor until it execs, and with it the flock: allow it a second.
        let released = (0..100).any(|_| {
            let held = crate::tools::process::Lock::try_hold(&path.with_extension("lock"), "test").unwrap();
            held.is_ok() || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(released, "lock released");
    }

    #[test]
    fn a_last_iteration_of_u32_max_is_a_damaged_ledger_not_a_wrap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        append(&path, Record { iteration: u32::MAX, ..entry("a") }).unwrap();
        let err = format!("{:#}", next_iteration(&path).unwrap_err());
        assert!(err.contains("the largest number there is"), "{err}");
        assert!(append(&path, entry("b")).is_err());
    }

    #[test]
    fn a_ledger_that_is_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(err.contains("a character device, not a regular file"), "{err}");
    }

    #[test]
    fn earlier_lines_are_kept_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        append(&path, entry("a")).unwrap();
        // A line as an older xtask or another serializer wrote it: 17 significant
        // digits that serde_json's default parser does not round-trip, other spacing.
        let first = std::fs::read_to_string(&path).unwrap();
        let edited =
            first.trim_end().replace("\"timestamp\":\"t\"", "\"timestamp\": \"t\", \"x\": 0.012395446653327591");
        std::fs::write(&path, &edited).unwrap(); // and no final newline
        append(&path, entry("b")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&format!("{edited}\n")), "{text}");
        assert_eq!(read(&path).unwrap().iter().map(|e| e.iteration).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn concurrent_appends_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        std::thread::scope(|s| {
            for t in 0..4 {
                let path = &path;
                s.spawn(move || {
                    for i in 0..5 {
                        append(path, entry(&format!("{t}-{i}"))).unwrap();
                    }
                });
            }
        });
        let all = read(&path).unwrap();
        assert_eq!(all.len(), 20);
        let numbers: Vec<u32> = all.iter().map(|e| e.iteration).collect();
        assert_eq!(numbers, (1..=20).collect::<Vec<_>>());
    }

    #[test]
    fn an_entry_keeps_a_higher_number_it_brings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        append(&path, entry("a")).unwrap();
        let e = append(&path, Record { iteration: 7, ..entry("attempt 7") }).unwrap();
        assert_eq!(e.iteration, 7);
        assert_eq!(append(&path, Record { iteration: 3, ..entry("c") }).unwrap().iteration, 8);
    }

    /// Lines written before the fields added since still read.
    #[test]
    fn the_committed_ledger_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../perf/ledger.jsonl");
        let all = read(&path).unwrap();
        assert!(all.len() >= 50);
        assert!(all[..48].iter().all(|e| e.base_rev.is_none() && e.tree.is_none()), "the first lines have neither");
        let full_rev = |r: &String| r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit());
        assert!(all.iter().filter_map(|e| e.base_rev.as_ref()).all(full_rev));
    }

    #[test]
    fn a_held_lock_names_its_holder_and_dies_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.lock");
        let held = Lock::try_hold(&path, "appending to the ledger").unwrap().unwrap();
        let holder = Lock::try_hold(&path, "another").unwrap().err().unwrap();
        assert_eq!(holder, format!("pid {}: appending to the ledger", std::process::id()));
        drop(held);
        assert!(Lock::try_hold(&path, "another").unwrap().is_ok(), "released with its holder");
    }
}
