//! `cargo xtask iterate "hypothesis"`: one optimisation iteration. Build, test,
//! sanitize (every fifth iteration, or `--sanitize`), bench against the last
//! accepted state, record the verdict in `perf/ledger.jsonl`, and revert the
//! kernel sources on a rejection, saving the attempt first.
//!
//! The accepted state is a snapshot under `target/xtask/accepted/`: `src/` (a copy
//! of `kernels/`) and `kernels/` (its fatbins). Benching against it needs no git
//! and no rebuild, so the loop also runs from prebuilt binaries on a GPU machine.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::bench;
use crate::build::BuildPayload;
use crate::gate::sequence::Verdict;
use crate::gate::{self, GateRun, Side};
use crate::ledger::{self, BenchLine, Entry, KernelLine, TestLine};
use crate::paths::Paths;
use crate::process::{Cmd, write_file};
use crate::report::{Envelope, git_state, read_json, rfc3339};
use crate::schema::TestRun;
use crate::{CheckFailed, build, sanitize, test, tools};

pub struct Options {
    pub hypothesis: String,
    pub prediction: Option<String>,
    pub sanitize: bool,
    pub no_revert: bool,
    pub bench: bench::Options,
    pub build: build::Options,
    pub test: test::Options,
    pub sanitize_opts: sanitize::Options,
}

/// How a file under `kernels/` differs from the accepted snapshot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Modified(PathBuf),
    Added(PathBuf),
    Deleted(PathBuf),
}

impl Change {
    pub fn path(&self) -> &Path {
        match self {
            Change::Modified(p) | Change::Added(p) | Change::Deleted(p) => p,
        }
    }
}

fn files(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    Ok(out)
}

/// Files of `current` that differ from `snapshot` (paths relative to both).
pub fn diff(snapshot: &Path, current: &Path) -> Result<Vec<Change>> {
    let (old, new) = (files(snapshot)?, files(current)?);
    let mut out = Vec::new();
    for p in old.union(&new) {
        match (old.contains(p), new.contains(p)) {
            (true, true) => {
                if std::fs::read(snapshot.join(p))? != std::fs::read(current.join(p))? {
                    out.push(Change::Modified(p.clone()));
                }
            }
            (false, true) => out.push(Change::Added(p.clone())),
            (true, false) => out.push(Change::Deleted(p.clone())),
            (false, false) => unreachable!(),
        }
    }
    Ok(out)
}

/// Copies `from` over `to` (creating parents).
fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(d) = to.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Replaces `dst` by a copy of `src` (a directory of files).
pub fn snapshot(src: &Path, dst: &Path) -> Result<()> {
    if dst.exists() {
        std::fs::remove_dir_all(dst).with_context(|| format!("clearing {}", dst.display()))?;
    }
    for f in files(src)? {
        copy(&src.join(&f), &dst.join(&f))?;
    }
    Ok(())
}

/// Saves the rejected attempt (a patch and full copies of every changed file)
/// under `rejected`, then restores the changed files of `current` from
/// `snapshot`. Only those files are touched: a file the attempt added is left in
/// place (it may be someone's untracked work); nothing else is read or written.
/// Returns the patch path and the files left in place.
pub fn revert(snapshot: &Path, current: &Path, changes: &[Change], rejected: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let mut patch = String::new();
    let mut kept = Vec::new();
    for c in changes {
        let p = c.path();
        let (old, new) = (snapshot.join(p), current.join(p));
        if new.exists() {
            copy(&new, &rejected.join("files").join(p))?;
        }
        // `git diff --no-index` works outside a repository; without git, the copies remain.
        let a = if old.exists() { old.display().to_string() } else { "/dev/null".into() };
        let b = if new.exists() { new.display().to_string() } else { "/dev/null".into() };
        if let Ok(out) = Cmd::new("git").args(["diff", "--no-index", "--", &a, &b]).quiet().run() {
            patch.push_str(&out.stdout);
        }
        match c {
            Change::Modified(_) | Change::Deleted(_) => copy(&old, &new)?,
            Change::Added(_) => kept.push(p.to_path_buf()),
        }
    }
    let patch_path = rejected.join("attempt.patch");
    write_file(&patch_path, patch)?;
    Ok((patch_path, kept))
}

/// A short directory name for an attempt: the first six words of the hypothesis.
fn slug(text: &str) -> String {
    crate::paths::slug(text).split('-').take(6).collect::<Vec<_>>().join("-")
}

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    crate::gpu::require("iterate")?;
    let ledger_path = paths.root.join("perf/ledger.jsonl");
    let n = ledger::next_iteration(&ledger_path)?;
    let accepted = paths.reports().join("accepted");
    let (snap_src, snap_kernels) = (accepted.join("src"), accepted.join("kernels"));
    let kernels_dir = paths.root.join("kernels");
    let baseline = !snap_kernels.join("manifest.json").is_file();
    let changes = if baseline { Vec::new() } else { diff(&snap_src, &kernels_dir)? };
    eprintln!(
        "== iterate {n}: {}{}",
        opts.hypothesis,
        if baseline {
            " (first iteration: becomes the accepted baseline)".to_string()
        } else {
            format!(" ({} file(s) changed)", changes.len())
        }
    );
    let mut entry = Entry {
        iteration: n,
        timestamp: rfc3339(std::time::SystemTime::now()),
        git_rev: git_state().0,
        device: None,
        hypothesis: opts.hypothesis.clone(),
        prediction: opts.prediction.clone(),
        changed_files: changes.iter().map(|c| format!("kernels/{}", c.path().display())).collect(),
        verdict: String::new(),
        reason: None,
        build: Vec::new(),
        test: None,
        sanitized: None,
        bench: Vec::new(),
        patch: None,
    };

    let outcome = evaluate(paths, opts, n, &snap_kernels, baseline, &mut entry);
    let (verdict, reason) = match &outcome {
        Ok(Verdict::Regression) => ("reverted", Some("confirmed regression over 2%".to_string())),
        Ok(_) => ("accepted", None),
        Err(e) => ("rejected", Some(format!("{e:#}"))),
    };
    entry.verdict = verdict.into();
    entry.reason = reason.clone();
    if verdict == "accepted" {
        snapshot(&kernels_dir, &snap_src)?;
        snapshot(&paths.kernels_out(), &snap_kernels)?;
    } else if !baseline && !opts.no_revert && !changes.is_empty() {
        let rejected = paths.root.join("perf/rejected").join(format!("{n:03}-{}", slug(&opts.hypothesis)));
        let (patch, kept) = revert(&snap_src, &kernels_dir, &changes, &rejected)?;
        entry.patch = Some(patch.strip_prefix(&paths.root).unwrap_or(&patch).display().to_string());
        eprintln!(
            "iterate: reverted {} file(s) to the accepted state; the attempt is saved in {}",
            changes.len() - kept.len(),
            rejected.display()
        );
        for k in kept {
            eprintln!("iterate: left kernels/{} in place (added by the attempt; not deleted)", k.display());
        }
    }
    let entry = ledger::append(&ledger_path, entry)?;
    println!("iteration {}: {} {}", entry.iteration, entry.verdict, entry.reason.as_deref().unwrap_or(""));
    match outcome {
        Ok(Verdict::Regression) => Err(CheckFailed(format!("iteration {n} reverted: confirmed regression")).into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Build, test, sanitize when due, bench; the worst bench verdict on success.
fn evaluate(
    paths: &Paths,
    opts: &Options,
    n: u32,
    base_kernels: &Path,
    baseline: bool,
    entry: &mut Entry,
) -> Result<Verdict> {
    let built = build::run(paths, &opts.build);
    if let Ok(report) = read_json::<Envelope<BuildPayload>>(&paths.report("build")) {
        entry.build = report
            .payload
            .kernels
            .iter()
            .map(|k| KernelLine {
                kernel: k.name.clone(),
                arch: k.arch.clone(),
                registers: k.registers,
                spill_bytes: k.spill_bytes(),
            })
            .collect();
    }
    built?;
    let tested = test::run(paths, &opts.test);
    if let Ok(run) = read_json::<TestRun>(&paths.reports().join("fa-test.json")) {
        entry.device = Some(run.device.name.clone());
        entry.test = Some(TestLine { cases: run.cases.len(), failed: run.cases.iter().filter(|c| !c.passed).count() });
    }
    tested?;
    if opts.sanitize || ledger::sanitize_due(n) {
        let s = sanitize::run(paths, &opts.sanitize_opts);
        entry.sanitized = Some(s.is_ok());
        s?;
    }
    let dir = paths.reports().join("bench");
    let cand = Side::new(tools::binary(paths, "fa-bench")?, paths.kernels_out());
    if baseline {
        // Nothing to compare with yet: one plain timing for the record.
        let run = bench::run_process(&cand, "candidate", 0, &dir, &opts.bench)?.run;
        entry.bench = run
            .cases
            .iter()
            .map(|c| BenchLine {
                case: c.name.clone(),
                base_us: None,
                cand_us: c.median_us,
                tflops: c.tflops,
                change: None,
                ci_low: None,
                ci_high: None,
                verdict: None,
                speedup_vs_torch: None,
            })
            .collect();
        return Ok(Verdict::Same);
    }
    let base = Side::new(cand.bench.clone(), base_kernels.to_path_buf());
    let gated = gate::run(&base, &cand, &opts.bench.gate(), &dir)?;
    entry.bench = bench_lines(&gated);
    let failures = gated.failures();
    if failures.iter().any(|s| s.verdict == Verdict::Regression) {
        return Ok(Verdict::Regression);
    }
    if !failures.is_empty() {
        let names: Vec<&str> = failures.iter().map(|s| s.name.as_str()).collect();
        return Err(CheckFailed(format!(
            "the gate could not decide {} (inconclusive fails): rerun on a quiet GPU or with more --gate-secs",
            names.join(", ")
        ))
        .into());
    }
    Ok(Verdict::Same)
}

/// The ledger's lines from a gate run.
pub fn bench_lines(g: &GateRun) -> Vec<BenchLine> {
    g.shapes
        .iter()
        .map(|s| BenchLine {
            case: s.name.clone(),
            base_us: Some(s.base_us),
            cand_us: s.cand_us,
            tflops: s.cand_tflops,
            change: Some(s.change),
            ci_low: Some(s.ci_low),
            ci_high: Some(s.ci_high),
            verdict: Some(gate::verdict_word(s.verdict).to_lowercase()),
            speedup_vs_torch: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn diff_finds_modified_added_deleted() {
        let d = tempfile::tempdir().unwrap();
        let (snap, cur) = (d.path().join("snap"), d.path().join("cur"));
        write(&snap.join("a.cu"), "a");
        write(&snap.join("same.cuh"), "s");
        write(&snap.join("gone.cu"), "g");
        write(&cur.join("a.cu"), "a2");
        write(&cur.join("same.cuh"), "s");
        write(&cur.join("sub/new.cu"), "n");
        let mut c = diff(&snap, &cur).unwrap();
        c.sort();
        assert_eq!(
            c,
            vec![
                Change::Modified("a.cu".into()),
                Change::Added("sub/new.cu".into()),
                Change::Deleted("gone.cu".into())
            ]
        );
    }

    /// The revert in a real git repository: only the attempt's files change, the
    /// attempt is saved, and unrelated uncommitted and untracked work survives.
    #[test]
    fn revert_loses_nothing() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let git = |args: &[&str]| Cmd::new("git").args(args.iter().copied()).cwd(root).quiet().run_checked().unwrap();
        git(&["init", "-q"]);
        write(&root.join("kernels/flash.cu"), "fast\n");
        write(&root.join("kernels/common.cuh"), "helpers\n");
        write(&root.join("notes.md"), "committed notes\n");
        git(&["add", "."]);
        git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]);
        let snap = root.join("target/xtask/accepted/src");
        snapshot(&root.join("kernels"), &snap).unwrap();

        // The attempt, plus unrelated work in progress.
        write(&root.join("kernels/flash.cu"), "slow\n");
        write(&root.join("kernels/scratch.cu"), "new idea\n");
        write(&root.join("notes.md"), "uncommitted edit\n");
        write(&root.join("untracked.txt"), "keep me\n");

        let changes = diff(&snap, &root.join("kernels")).unwrap();
        let rejected = root.join("perf/rejected/001-try");
        let (patch, kept) = revert(&snap, &root.join("kernels"), &changes, &rejected).unwrap();

        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("kernels/flash.cu"), "fast\n", "reverted");
        assert_eq!(read("kernels/common.cuh"), "helpers\n");
        assert_eq!(read("kernels/scratch.cu"), "new idea\n", "added file left in place");
        assert_eq!(kept, vec![PathBuf::from("scratch.cu")]);
        assert_eq!(read("notes.md"), "uncommitted edit\n", "unrelated uncommitted edit kept");
        assert_eq!(read("untracked.txt"), "keep me\n", "untracked file kept");
        let p = std::fs::read_to_string(patch).unwrap();
        assert!(p.contains("-fast") && p.contains("+slow"), "{p}");
        assert_eq!(read("perf/rejected/001-try/files/flash.cu"), "slow\n");
        let status = git(&["status", "--porcelain"]).stdout;
        assert!(status.contains(" M notes.md") && status.contains("?? untracked.txt"), "{status}");
        assert!(!status.contains("kernels/flash.cu"), "{status}");
    }

    #[test]
    fn slugs_are_short_and_safe() {
        assert_eq!(slug("Swizzle K/V smem: 8-way → none!"), "swizzle-k-v-smem-8-way");
    }
}
