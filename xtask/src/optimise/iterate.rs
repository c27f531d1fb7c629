//! `cargo xtask iterate "hypothesis"`: one optimisation iteration over the whole
//! tree. Build, test, sanitize (every fifth iteration, or `--sanitize`), gate the
//! candidate build against the last accepted build, record the verdict in
//! `perf/ledger.jsonl`; on a rejection, save the attempt as a patch under
//! `perf/rejected/` and revert it.
//!
//! The tree is every file git lists outside `perf/` (`tree`), so a planner or
//! manifest change is measured and reverted like a kernel edit. The attempt is
//! what differs from the accepted tree; files that were already there when it was
//! accepted (untracked ones, unrelated edits) are not part of it. The tree is
//! hashed before the build and again after the build and after the gate: if it
//! moved, nothing is accepted or reverted. What is accepted is that hashed
//! content with the very binaries that were timed, copied out of the shared
//! target dir right after the build.
//!
//! The accepted state of a checkout lives under
//! `target/xtask/accepted/<checkout>/`: `current` names a snapshot folder with
//! `tree.json`, `bin/fa-bench` and `kernels/`; `objects/` holds the accepted
//! files' bytes. Gating against it needs no git and no rebuild of the base, so
//! the loop also runs from prebuilt binaries on a GPU machine.

mod attempt;
pub mod tree;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::compile;
use crate::compile::BuildPayload;
use crate::errors::{CannotRun, CheckFailed};
use crate::ledger::{self, BenchLine, KernelLine, Record, TestLine};
use crate::measure::bench;
use crate::measure::gate::sequence::Verdict;
use crate::measure::gate::{self, GateRun, Side};
use crate::measure::payload::{ProcessRun, TorchRatio};
use crate::report::{Envelope, read_json, rfc3339};
use crate::run::Run;
use crate::tools::drivers;
use crate::tools::process::{Lock, write_atomic};
use crate::verify::sanitize;
use crate::verify::test;
use attempt::Scratch;
use fa_schema::schema::TestRun;
use tree::{Change, Store, Tree};

pub struct Options {
    pub hypothesis: String,
    pub prediction: Option<String>,
    pub sanitize: bool,
    pub no_revert: bool,
    pub bench: bench::Options,
    pub build: compile::Options,
    pub test: test::Options,
    pub sanitize_opts: sanitize::Options,
}

/// The accepted state of one checkout (see the module comment).
pub struct State {
    pub dir: PathBuf,
    pub store: Store,
}

/// An accepted tree and the build that was measured from it.
pub struct Snapshot {
    pub dir: PathBuf,
    pub tree: Tree,
}

impl Snapshot {
    /// The gate's base: the accepted build's own fa-bench and kernels, on `device`.
    pub fn side(&self, device: Option<String>) -> Side {
        Side::new(self.dir.join("bin/fa-bench"), self.dir.join("kernels"), device)
    }
}

/// A candidate build copied out of the target dir; deleted unless promoted.
pub struct Staged(Scratch);

impl Staged {
    pub fn side(&self, device: Option<String>) -> Side {
        Side::new(self.0.0.join("bin/fa-bench"), self.0.0.join("kernels"), device)
    }
}

impl State {
    pub fn new(dir: PathBuf) -> State {
        let store = Store::new(dir.join("objects"));
        State { dir, store }
    }

    /// Keyed by the checkout, so clones sharing one `CARGO_TARGET_DIR` keep their own.
    pub fn for_checkout(cx: &Run) -> State {
        let root = cx.root.canonicalize().unwrap_or_else(|_| cx.root.clone());
        let name = root.file_name().map(|n| crate::run::slug(&n.to_string_lossy())).unwrap_or_default();
        let key = tree::sha256(root.as_os_str().as_encoded_bytes());
        State::new(cx.reports().join("accepted").join(format!("{name}-{}", &key[..12])))
    }

    /// Held while an iterate runs in this checkout.
    pub fn lock(&self, what: &str) -> Result<Lock> {
        match Lock::try_hold(&self.dir.join("iterate.lock"), what)? {
            Ok(lock) => Ok(lock),
            Err(holder) => bail!(CannotRun(format!(
                "another iterate is running in this checkout ({holder}); wait for it to finish"
            ))),
        }
    }

    pub fn current(&self) -> Result<Option<Snapshot>> {
        let Some(name) = fa_schema::file::read_text_if_exists(&self.dir.join("current"))? else { return Ok(None) };
        let name = name.trim().to_string();
        let dir = self.dir.join(&name);
        let tree = read_json(&dir.join("tree.json")).context("the accepted snapshot is damaged: delete its folder")?;
        Ok(Some(Snapshot { dir, tree }))
    }

    /// Copies a build (fa-bench, and the fatbins and manifest of `kernels`) out of the target dir.
    pub fn stage(&self, bench: &Path, kernels: &Path) -> Result<Staged> {
        let s = Staged(Scratch::new(&self.dir, "staging")?);
        let (bin, out) = (s.0.0.join("bin"), s.0.0.join("kernels"));
        for d in [&bin, &out] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        copy(bench, &bin.join("fa-bench"))?;
        if !kernels.join("manifest.json").is_file() {
            bail!("{} holds no built kernels (no manifest.json)", kernels.display());
        }
        for e in std::fs::read_dir(kernels).with_context(|| format!("listing {}", kernels.display()))? {
            let p = e.with_context(|| format!("listing {}", kernels.display()))?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name == "manifest.json" || name.ends_with(".fatbin") {
                copy(&p, &out.join(&name))?;
            }
        }
        Ok(s)
    }

    /// Makes `staged` with `tree` the accepted snapshot, drops the previous one
    /// and every object the new tree does not use.
    pub fn promote(&self, staged: Staged, tree: &Tree) -> Result<Snapshot> {
        let old = self.current()?;
        write_atomic(&staged.0.0.join("tree.json"), serde_json::to_string(tree)?.as_bytes(), false)?;
        let name = format!("snap-{}", &tree.hash()[..16]);
        let name = staged.0.0.file_name().map_or(name.clone(), |s| format!("{name}-{}", s.to_string_lossy()));
        let dir = self.dir.join(&name);
        std::fs::rename(&staged.0.0, &dir).with_context(|| format!("renaming {}", staged.0.0.display()))?;
        write_atomic(&self.dir.join("current"), name.as_bytes(), false)?;
        if let Some(old) = old {
            std::fs::remove_dir_all(&old.dir).with_context(|| format!("removing {}", old.dir.display()))?;
        }
        self.store.retain(&[tree])?;
        Ok(Snapshot { dir, tree: tree.clone() })
    }
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The one place iterate names the kernels a build wrote.
fn kernel_set(cx: &Run) -> PathBuf {
    cx.kernels.clone()
}

/// What the tree scan leaves out besides `perf/`: the target dir, where it lies
/// in the tree and git does not ignore it.
fn excluded(cx: &Run) -> Vec<String> {
    let target = cx.target.strip_prefix(&cx.root).ok().and_then(Path::to_str).map(|t| format!("{t}/"));
    target.into_iter().filter(|t| t != "/").collect()
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Accept,
    /// A confirmed regression.
    Revert(String),
    /// Failed a check or could not be judged.
    Reject(String),
    /// The tree moved while it was measured.
    Void(String),
}

impl Decision {
    fn verdict(&self) -> &'static str {
        match self {
            Decision::Accept => "accepted",
            Decision::Revert(_) => "reverted",
            Decision::Reject(_) => "rejected",
            Decision::Void(_) => "void",
        }
    }

    fn reason(&self) -> Option<String> {
        match self {
            Decision::Accept => None,
            Decision::Revert(r) | Decision::Reject(r) | Decision::Void(r) => Some(r.clone()),
        }
    }
}

/// The verdict on what was measured, given the tree it was built from and the
/// tree at each later look (after the build, after the gate).
pub fn decide(result: &Result<Verdict>, measured: &Tree, later: &[&Tree]) -> Decision {
    let moved: BTreeSet<String> = later.iter().flat_map(|t| measured.moved(t)).collect();
    if !moved.is_empty() {
        let list: Vec<&str> = moved.iter().map(String::as_str).collect();
        return Decision::Void(format!(
            "the tree changed while it was built and measured ({}): nothing accepted or reverted; rerun iterate",
            list.join(", ")
        ));
    }
    match result {
        Ok(Verdict::Regression) => Decision::Revert("confirmed regression over 2%".into()),
        Ok(_) => Decision::Accept,
        Err(e) => Decision::Reject(format!("{e:#}")),
    }
}

/// Where the conclusion of one iteration reads and writes.
pub struct Conclusion<'a> {
    pub root: &'a Path,
    pub state: &'a State,
    pub accepted: Option<&'a Snapshot>,
    /// The tree that was built and measured.
    pub measured: &'a Tree,
    pub ledger: &'a Path,
    /// `perf/rejected`.
    pub rejected: &'a Path,
    /// Scratch space (`target/xtask/tmp`).
    pub scratch: &'a Path,
    pub no_revert: bool,
    /// Saved with a rejected attempt under `reports/`: file name and text.
    pub reports: Vec<(String, String)>,
}

/// Acts on the decision: promotes the measured build, or saves the attempt and
/// reverts it; appends the ledger entry either way.
pub fn conclude(c: &Conclusion, decision: &Decision, staged: Option<Staged>, mut entry: Record) -> Result<Record> {
    entry.verdict = decision.verdict().into();
    entry.reason = decision.reason();
    entry.tree = Some(c.measured.hash());
    let base = match (decision, c.accepted) {
        (Decision::Accept, _) => {
            let staged = staged.context("nothing was built to accept")?;
            c.state.promote(staged, c.measured)?;
            return ledger::append(c.ledger, entry);
        }
        (Decision::Void(_), _) | (_, None) => return ledger::append(c.ledger, entry),
        (_, Some(a)) => a,
    };
    let changes = tree::diff(&base.tree, c.measured);
    if changes.is_empty() || c.no_revert {
        return ledger::append(c.ledger, entry);
    }
    let (n, dir) = attempt::reserve(c.rejected, entry.iteration, &attempt::slug(&entry.hypothesis))?;
    entry.iteration = n;
    let patch = dir.join("attempt.patch");
    entry.patch = Some(patch.strip_prefix(c.root).unwrap_or(&patch).display().to_string());
    if let Err(e) = save_and_revert(c, &base.tree, &changes, &patch, &mut entry) {
        entry.reason = Some(format!("{} (not reverted: {e:#})", entry.reason.unwrap_or_default()));
        ledger::append(c.ledger, entry)?;
        return Err(e);
    }
    let entry = ledger::append(c.ledger, entry)?;
    write_atomic(&dir.join("record.json"), (serde_json::to_string_pretty(&entry)? + "\n").as_bytes(), false)?;
    if !c.reports.is_empty() {
        std::fs::create_dir_all(dir.join("reports")).with_context(|| format!("creating {}/reports", dir.display()))?;
    }
    for (name, text) in &c.reports {
        write_atomic(&dir.join("reports").join(name), text.as_bytes(), false)?;
    }
    eprintln!(
        "iterate: reverted {} path(s) to the accepted tree; the attempt is {} (`git apply` it to get it back)",
        changes.len(),
        patch.display()
    );
    Ok(entry)
}

fn save_and_revert(c: &Conclusion, base: &Tree, changes: &[Change], patch: &Path, entry: &mut Record) -> Result<()> {
    let text = attempt::patch(c.scratch, &c.state.store, base, c.measured, changes)?;
    write_atomic(patch, text.as_bytes(), false)?;
    let changed: Vec<&str> = changes.iter().map(Change::path).collect();
    let staged = tree::staged(c.root, &changed)?;
    tree::revert(c.root, &c.state.store, base, c.measured, changes)?;
    tree::unstage(c.root, &staged)?;
    let head = crate::tools::process::git(c.root, &["rev-parse", "--verify", "-q", "HEAD"]);
    if let Some(rev) = head.filter(|rev| attempt::check_applies(c.root, c.scratch, patch, rev).is_ok()) {
        entry.base_rev = Some(rev);
    }
    Ok(())
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("iterate")?;
    let state = State::for_checkout(cx);
    let _lock = state.lock(&opts.hypothesis)?;
    let ledger_path = cx.root.join("perf/ledger.jsonl");
    let n = ledger::next_iteration(&ledger_path)?;
    let accepted = state.current()?;
    let exclude = excluded(cx);
    let scan = || tree::scan(&cx.root, &state.store, &exclude);
    let measured = scan()?;
    let changes = accepted.as_ref().map(|a| tree::diff(&a.tree, &measured)).unwrap_or_default();
    eprintln!(
        "== iterate {n}: {}{}",
        opts.hypothesis,
        if accepted.is_none() {
            " (no accepted state in this checkout yet: a passing build becomes it)".to_string()
        } else {
            format!(" ({} path(s) differ from the accepted tree)", changes.len())
        }
    );
    let mut entry = Record {
        iteration: n,
        timestamp: rfc3339(std::time::SystemTime::now()),
        git_rev: crate::tools::process::git_state(&cx.root).rev,
        device: None,
        hypothesis: opts.hypothesis.clone(),
        prediction: opts.prediction.clone(),
        changed_files: changes.iter().map(|c| c.path().to_string()).collect(),
        verdict: String::new(),
        reason: None,
        build: Vec::new(),
        test: None,
        sanitized: None,
        bench: Vec::new(),
        patch: None,
        base_rev: None,
        tree: None,
    };
    let (staged, built) = match build_candidate(cx, opts, &state, &mut entry) {
        Ok(s) => (Some(s), Ok(())),
        Err(e) => (None, Err(e)),
    };
    let after_build = scan()?;
    let mut gated = None;
    let result = built.and_then(|()| match &staged {
        // A moved tree voids the run (`decide`): nothing to time.
        Some(s) if after_build == measured => evaluate(cx, opts, n, accepted.as_ref(), s, &mut entry, &mut gated),
        _ => Ok(Verdict::Inconclusive),
    });
    let after_gate = scan()?;
    let decision = decide(&result, &measured, &[&after_build, &after_gate]);
    let scratch = cx.reports().join("tmp");
    let reports = gated
        .map(|mut g| {
            // The per-quad logs stay in target/xtask/bench; the attempt keeps the verdicts.
            g.shapes.iter_mut().for_each(|s| s.quad_log.clear());
            serde_json::to_string_pretty(&g).map(|t| vec![("gate.json".to_string(), t + "\n")])
        })
        .transpose()?
        .unwrap_or_default();
    let c = Conclusion {
        root: &cx.root,
        state: &state,
        accepted: accepted.as_ref(),
        measured: &measured,
        ledger: &ledger_path,
        rejected: &cx.root.join("perf/rejected"),
        scratch: &scratch,
        no_revert: opts.no_revert,
        reports,
    };
    let entry = conclude(&c, &decision, staged, entry)?;
    println!("iteration {}: {} {}", entry.iteration, entry.verdict, entry.reason.as_deref().unwrap_or(""));
    match decision {
        Decision::Accept => Ok(()),
        Decision::Revert(_) => {
            Err(CheckFailed(format!("iteration {} reverted: confirmed regression", entry.iteration)).into())
        }
        Decision::Void(r) => Err(CannotRun(r).into()),
        Decision::Reject(_) => result.map(|_| ()),
    }
}

/// Builds the kernels and fa-bench and copies both out of the target dir, so
/// what is timed and accepted is this build whatever else writes there.
fn build_candidate(cx: &Run, opts: &Options, state: &State, entry: &mut Record) -> Result<Staged> {
    let built = compile::run(cx, &opts.build);
    if let Ok(report) = read_json::<Envelope<BuildPayload>>(&cx.report("build")) {
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
    state.stage(&drivers::binary(cx, "fa-bench")?, &kernel_set(cx))
}

/// Test, sanitize when due, then time: against the accepted build (the gate),
/// or alone where there is none yet. The worst verdict on success.
fn evaluate(
    cx: &Run,
    opts: &Options,
    n: u32,
    accepted: Option<&Snapshot>,
    staged: &Staged,
    entry: &mut Record,
    gated: &mut Option<GateRun>,
) -> Result<Verdict> {
    let tested = test::run(cx, &opts.test);
    if let Ok(run) = read_json::<TestRun>(&cx.reports().join("fa-test.json")) {
        entry.device = Some(run.device.name.clone());
        entry.test = Some(TestLine { cases: run.cases.len(), failed: run.cases.iter().filter(|c| !c.passed).count() });
    }
    tested?;
    if opts.sanitize || ledger::sanitize_due(n) {
        let s = sanitize::run(cx, &opts.sanitize_opts);
        entry.sanitized = Some(s.is_ok());
        s?;
    }
    let dir = cx.reports().join("bench");
    let cand = staged.side(cx.device.clone());
    let Some(accepted) = accepted else {
        let run = bench::run_process(&cand, "candidate", 0, &dir, &opts.bench)?;
        entry.bench = plain_lines(&run);
        let torch = bench::vs_torch(cx, std::slice::from_ref(&run), &opts.bench);
        attach_torch(&mut entry.bench, torch.map_err(|e| format!("{e:#}")));
        return Ok(Verdict::Same);
    };
    let g = gate::run(&accepted.side(cx.device.clone()), &cand, &opts.bench.gate(), &dir, |_| Ok(()))?;
    entry.bench = bench_lines(&g);
    let failures: Vec<(String, Verdict)> = g.failures().iter().map(|s| (s.name.clone(), s.verdict)).collect();
    *gated = Some(g);
    if failures.iter().any(|(_, v)| *v == Verdict::Regression) {
        return Ok(Verdict::Regression);
    }
    if !failures.is_empty() {
        let names: Vec<&str> = failures.iter().map(|(n, _)| n.as_str()).collect();
        return Err(CheckFailed(format!(
            "the gate could not decide {} (inconclusive fails): rerun on a quiet GPU or with more --gate-secs",
            names.join(", ")
        ))
        .into());
    }
    let torch = bench::run_process(&cand, "candidate", 0, &dir, &opts.bench)
        .and_then(|run| bench::vs_torch(cx, &[run], &opts.bench));
    attach_torch(&mut entry.bench, torch.map_err(|e| format!("{e:#}")));
    Ok(Verdict::Same)
}

/// The ledger's lines from one plain timing process.
pub fn plain_lines(run: &ProcessRun) -> Vec<BenchLine> {
    run.run
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
            vs_torch_note: None,
            explanation: Vec::new(),
        })
        .collect()
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
            vs_torch_note: None,
            explanation: s.explanation.clone(),
        })
        .collect()
}

/// The backend the ledger's speedup is against: SDPA as a user calls it.
const TORCH_BACKEND: &str = "torch-default";

/// Each line's speedup against PyTorch SDPA, or why there is none.
pub fn attach_torch(lines: &mut [BenchLine], torch: Result<Vec<TorchRatio>, String>) {
    for l in lines {
        let ratio = torch.as_ref().map(|rs| rs.iter().find(|r| r.name == l.case));
        (l.speedup_vs_torch, l.vs_torch_note) = match ratio {
            Err(why) => (None, Some(format!("PyTorch not timed: {why}"))),
            Ok(None) => (None, Some("PyTorch did not time this case".into())),
            Ok(Some(r)) => match (r.backends.get(TORCH_BACKEND), r.other_method.get(TORCH_BACKEND)) {
                (Some((_, x)), _) => (Some(*x), None),
                (None, Some(m)) => {
                    (None, Some(format!("PyTorch timed it by {}, ours by {}", m.join("+"), r.fa_method)))
                }
                (None, None) => (None, Some(format!("no {TORCH_BACKEND} timing"))),
            },
        };
    }
}

#[cfg(test)]
mod tests;
