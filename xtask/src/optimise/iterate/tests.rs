//! The loop's decisions, reverts and snapshots in temporary git repositories,
//! driven by fake gate results: no GPU, no timing.

use super::*;
use crate::measure::gate::sequence::Rule;
use crate::tools::process::Cmd;

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn read(root: &Path, p: &str) -> String {
    std::fs::read_to_string(root.join(p)).unwrap()
}

fn git(root: &Path, args: &[&str]) -> String {
    Cmd::new("git").args(args.iter().copied()).cwd(root).quiet().run_checked().unwrap().stdout
}

/// A repository with kernels, a planner and notes, one commit, and work in
/// progress that predates the attempt (an unrelated edit, an untracked file).
struct Repo {
    _dir: tempfile::TempDir,
    root: PathBuf,
    state: State,
    /// Stands in for target/ (a build's fa-bench and kernels).
    build: PathBuf,
    ledger: PathBuf,
    rejected: PathBuf,
    scratch: PathBuf,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        write(&root.join("kernels/flash.cu"), "fast\n");
        write(&root.join("kernels/manifest.json"), "{}\n");
        write(&root.join("kernel-ffi/src/planner.rs"), "fn splits() -> u32 { 4 }\n");
        write(&root.join("notes.md"), "committed notes\n");
        write(&root.join(".gitignore"), "/target\n");
        git(&root, &["init", "-q"]);
        git(&root, &["add", "."]);
        git(
            &root,
            &["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-qm", "base"],
        );
        write(&root.join("notes.md"), "uncommitted edit\n");
        write(&root.join("untracked.txt"), "keep me\n");
        let build = root.join("target/built");
        write(&build.join("fa-bench"), "bench binary\n");
        write(&build.join("kernels/manifest.json"), "{}\n");
        write(&build.join("kernels/flash.sm_90a.fatbin"), "fatbin\n");
        write(&build.join("kernels/flash.sm_90a.log"), "not copied\n");
        let state = State::new(root.join("target/xtask/accepted/repo"));
        let (ledger, rejected, scratch) =
            (root.join("perf/ledger.jsonl"), root.join("perf/rejected"), root.join("target/xtask/tmp"));
        Repo { _dir: dir, root, state, build, ledger, rejected, scratch }
    }

    fn scan(&self) -> Tree {
        tree::scan(&self.root, &self.state.store, &["target/".into()]).unwrap()
    }

    fn stage(&self) -> Staged {
        self.state.stage(&self.build.join("fa-bench"), &self.build.join("kernels")).unwrap()
    }

    /// The current tree, accepted with a staged build.
    fn accept(&self) -> Snapshot {
        let t = self.scan();
        self.state.promote(self.stage(), &t).unwrap()
    }

    fn conclusion<'a>(&'a self, accepted: Option<&'a Snapshot>, measured: &'a Tree) -> Conclusion<'a> {
        Conclusion {
            root: &self.root,
            state: &self.state,
            accepted,
            measured,
            ledger: &self.ledger,
            rejected: &self.rejected,
            scratch: &self.scratch,
            no_revert: false,
            reports: vec![("gate.json".into(), "{}\n".into())],
        }
    }
}

fn entry(hypothesis: &str) -> Record {
    Record {
        iteration: 1,
        timestamp: "t".into(),
        git_rev: "r".into(),
        device: None,
        hypothesis: hypothesis.into(),
        prediction: None,
        changed_files: vec![],
        verdict: String::new(),
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

/// What the gate would say of one shape.
fn gate_says(verdict: Verdict, change: f64) -> GateRun {
    let rule = Rule::for_shapes(1, 6.0);
    let mut shape = gate::summarise(
        "f16-b4h16s2048d64".into(),
        "events-cold-l2".into(),
        (1, 1e9),
        Default::default(),
        &rule,
        vec![],
        verdict,
        1.0,
    );
    (shape.change, shape.ci_low, shape.ci_high) = (change, change - 0.004, change + 0.004);
    GateRun {
        device: fa_schema::schema::DeviceInfo {
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: "9.0".into(),
            sm_count: 132,
            driver: None,
            uuid: None,
        },
        rule,
        seed: 1,
        clocks_locked: false,
        monitored: false,
        shapes: vec![shape],
        not_gated: Vec::new(),
    }
}

/// The verdict `evaluate` derives from a gate run.
fn verdict_of(g: &GateRun) -> Result<Verdict> {
    if g.failures().iter().any(|s| s.verdict == Verdict::Regression) {
        Ok(Verdict::Regression)
    } else {
        Ok(Verdict::Same)
    }
}

#[test]
fn a_planner_only_change_is_measured_and_reverted_when_slower() {
    let r = Repo::new();
    let accepted = r.accept();
    // The attempt: only the planner, staged in the index as well.
    write(&r.root.join("kernel-ffi/src/planner.rs"), "fn splits() -> u32 { 8 }\n");
    git(&r.root, &["add", "kernel-ffi/src/planner.rs"]);
    let measured = r.scan();
    let changes = tree::diff(&accepted.tree, &measured);
    assert_eq!(changes, [Change::Modified("kernel-ffi/src/planner.rs".into())], "the planner is part of the attempt");
    // Measured: the gate times the accepted build's own binaries against the candidate's.
    let staged = r.stage();
    let (base, cand) = (accepted.side(None), staged.side(None));
    assert!(base.bench.starts_with(&accepted.dir) && base.kernels.join("flash.sm_90a.fatbin").is_file());
    assert!(cand.bench.is_file() && cand.bench != base.bench && cand.kernels != base.kernels);
    assert!(!cand.kernels.join("flash.sm_90a.log").exists(), "only what fa-bench loads is kept");

    let g = gate_says(Verdict::Regression, 0.03);
    let decision = decide(&verdict_of(&g), &measured, &[&measured, &r.scan()]);
    assert_eq!(decision, Decision::Revert("confirmed regression over 2%".into()));
    let e = conclude(&r.conclusion(Some(&accepted), &measured), &decision, Some(staged), entry("more splits")).unwrap();

    assert_eq!(read(&r.root, "kernel-ffi/src/planner.rs"), "fn splits() -> u32 { 4 }\n", "reverted");
    assert_eq!(read(&r.root, "notes.md"), "uncommitted edit\n", "an edit from before the attempt survives");
    assert_eq!(read(&r.root, "untracked.txt"), "keep me\n", "an untracked file from before survives");
    let status = git(&r.root, &["status", "--porcelain"]);
    assert!(!status.contains("planner"), "neither changed nor staged any more: {status}");
    assert!(status.contains(" M notes.md") && status.contains("?? untracked.txt"), "{status}");

    assert_eq!((e.iteration, e.verdict.as_str()), (1, "reverted"));
    assert_eq!(e.patch.as_deref(), Some("perf/rejected/001-more-splits/attempt.patch"));
    let head = git(&r.root, &["rev-parse", "HEAD"]);
    assert_eq!(e.base_rev.as_deref(), Some(head.trim()), "the accepted planner was HEAD's");
    let dir = r.root.join("perf/rejected/001-more-splits");
    let record: Record = read_json(&dir.join("record.json")).unwrap();
    assert_eq!(record, e);
    assert_eq!(ledger::read(&r.root.join("perf/ledger.jsonl")).unwrap(), [e]);
    assert!(dir.join("reports/gate.json").is_file());
    // The patch brings the attempt back from the repository root.
    git(&r.root, &["apply", "perf/rejected/001-more-splits/attempt.patch"]);
    assert_eq!(read(&r.root, "kernel-ffi/src/planner.rs"), "fn splits() -> u32 { 8 }\n");
    // The accepted snapshot did not move.
    assert_eq!(r.state.current().unwrap().unwrap().tree, accepted.tree);
}

#[test]
fn an_edit_during_the_bench_is_not_accepted() {
    let r = Repo::new();
    let accepted = r.accept();
    write(&r.root.join("kernels/flash.cu"), "faster\n");
    let measured = r.scan();
    let staged = r.stage();
    // Someone saves a kernel while the gate runs, which then says "same".
    write(&r.root.join("kernels/flash.cu"), "faster, unmeasured\n");
    let later = r.scan();
    let decision = decide(&verdict_of(&gate_says(Verdict::Same, 0.0)), &measured, &[&measured, &later]);
    let Decision::Void(why) = &decision else { panic!("{decision:?}") };
    assert!(why.contains("kernels/flash.cu"), "{why}");
    let e = conclude(&r.conclusion(Some(&accepted), &measured), &decision, Some(staged), entry("x")).unwrap();
    assert_eq!(e.verdict, "void");
    assert_eq!(r.state.current().unwrap().unwrap().tree, accepted.tree, "nothing accepted");
    assert_eq!(read(&r.root, "kernels/flash.cu"), "faster, unmeasured\n", "nothing reverted");
    assert!(!r.root.join("perf/rejected").exists());
    let left: Vec<String> = std::fs::read_dir(&r.state.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.len() == 3 && !left.iter().any(|n| n.starts_with("staging")), "staging removed: {left:?}");
}

#[test]
fn an_accepted_iteration_keeps_exactly_the_measured_tree_and_build() {
    let r = Repo::new();
    let first = r.accept();
    write(&r.root.join("kernels/flash.cu"), "faster\n");
    let measured = r.scan();
    let staged = r.stage();
    let decision = decide(&verdict_of(&gate_says(Verdict::Improvement, -0.05)), &measured, &[&measured]);
    conclude(&r.conclusion(Some(&first), &measured), &decision, Some(staged), entry("y")).unwrap();
    let now = r.state.current().unwrap().unwrap();
    assert_eq!(now.tree, measured);
    assert!(now.side(None).bench.is_file() && !first.dir.exists(), "the old snapshot is gone");
    // The objects of the accepted tree are kept, those of the old one dropped.
    let Some(tree::Node::File { sha256, .. }) = measured.nodes.get("kernels/flash.cu") else { panic!() };
    assert!(r.state.store.get(sha256).is_ok());
    let old = tree::sha256(b"fast\n");
    assert!(r.state.store.get(&old).is_err());
}

#[test]
fn a_symlink_to_a_file_outside_the_tree_is_left_alone() {
    let r = Repo::new();
    let outside = r.root.parent().unwrap().join("outside.cuh");
    write(&outside, "outside v1\n");
    std::os::unix::fs::symlink(&outside, r.root.join("kernels/ext.cuh")).unwrap();
    let accepted = r.accept();
    // The attempt edits a kernel; meanwhile the file behind the link changes.
    write(&r.root.join("kernels/flash.cu"), "slow\n");
    write(&outside, "outside v2\n");
    let measured = r.scan();
    assert_eq!(tree::diff(&accepted.tree, &measured), [Change::Modified("kernels/flash.cu".into())]);
    let decision = decide(&verdict_of(&gate_says(Verdict::Regression, 0.05)), &measured, &[&measured]);
    conclude(&r.conclusion(Some(&accepted), &measured), &decision, Some(r.stage()), entry("a")).unwrap();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "outside v2\n", "not written through the link");
    assert_eq!(read(&r.root, "kernels/flash.cu"), "fast\n");

    // An attempt that re-points the link: the link is restored, its targets untouched.
    let other = r.root.parent().unwrap().join("other.cuh");
    write(&other, "other\n");
    std::fs::remove_file(r.root.join("kernels/ext.cuh")).unwrap();
    std::os::unix::fs::symlink(&other, r.root.join("kernels/ext.cuh")).unwrap();
    let measured = r.scan();
    conclude(&r.conclusion(Some(&accepted), &measured), &decision, Some(r.stage()), entry("b")).unwrap();
    assert_eq!(std::fs::read_link(r.root.join("kernels/ext.cuh")).unwrap(), outside);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "outside v2\n");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "other\n");
}

#[test]
fn a_revert_refuses_a_file_edited_after_it_was_measured() {
    let r = Repo::new();
    let accepted = r.accept();
    write(&r.root.join("kernels/flash.cu"), "slow\n");
    write(&r.root.join("kernels/new.cuh"), "new\n");
    let measured = r.scan();
    write(&r.root.join("kernels/new.cuh"), "edited since\n");
    let changes = tree::diff(&accepted.tree, &measured);
    let err = tree::revert(&r.root, &r.state.store, &accepted.tree, &measured, &changes).unwrap_err();
    assert!(err.to_string().contains("kernels/new.cuh changed after it was measured"), "{err}");
    assert_eq!(read(&r.root, "kernels/flash.cu"), "slow\n", "nothing written");
}

#[test]
fn an_added_file_is_removed_and_kept_in_the_patch() {
    let r = Repo::new();
    let accepted = r.accept();
    write(&r.root.join("kernels/scratch.cu"), "new idea\n");
    std::fs::remove_file(r.root.join("kernels/manifest.json")).unwrap();
    let measured = r.scan();
    let decision = decide(&Err(anyhow::anyhow!("3 case(s) failed")), &measured, &[&measured]);
    let e = conclude(&r.conclusion(Some(&accepted), &measured), &decision, Some(r.stage()), entry("idea")).unwrap();
    assert_eq!(e.verdict, "rejected");
    assert!(!r.root.join("kernels/scratch.cu").exists());
    assert_eq!(read(&r.root, "kernels/manifest.json"), "{}\n", "a deleted file is back");
    git(&r.root, &["apply", e.patch.as_deref().unwrap()]);
    assert_eq!(read(&r.root, "kernels/scratch.cu"), "new idea\n");
    assert!(!r.root.join("kernels/manifest.json").exists());
}

#[test]
fn a_second_iterate_in_one_checkout_is_refused_naming_the_first() {
    let r = Repo::new();
    let _held = r.state.lock("first hypothesis").unwrap();
    let err = r.state.lock("second").err().unwrap();
    assert!(err.to_string().contains("first hypothesis"), "{err}");
}

/// The ledger's speedup against PyTorch from one H100 run of fa-bench and
/// ci/bench_torch.py over three shapes (the files `bench --vs-torch` writes).
#[test]
fn a_fixture_run_records_speedup_vs_torch_in_the_ledger() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/iterate");
    let run = crate::measure::payload::ProcessRun {
        side: "candidate".into(),
        run: read_json(&data.join("fa-bench-candidate-0.json")).unwrap(),
        sm_clock_mhz: None,
    };
    let torch: Vec<fa_schema::schema::BenchRun> = read_json(&data.join("torch-0.json")).unwrap();
    let runs = std::slice::from_ref(&run);
    let ratios = bench::torch_ratios(
        &crate::measure::payload::side_medians(runs, "candidate"),
        &crate::measure::payload::side_methods(runs, "candidate"),
        &torch,
    );
    let mut lines = plain_lines(&run);
    lines.push(BenchLine { case: "f16-b9h9s9d64".into(), ..lines[0].clone() });
    attach_torch(&mut lines, Ok(ratios));
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("ledger.jsonl");
    ledger::append(&path, Record { bench: lines, ..entry("fixture") }).unwrap();
    let back = &ledger::read(&path).unwrap()[0].bench;
    for l in &back[..3] {
        let x = l.speedup_vs_torch.unwrap_or_else(|| panic!("{}: {:?}", l.case, l.vs_torch_note));
        assert!(x > 0.5 && x < 5.0, "{}: {x}", l.case);
    }
    assert_eq!(
        (back[3].speedup_vs_torch, back[3].vs_torch_note.as_deref()),
        (None, Some("PyTorch did not time this case"))
    );

    // Where PyTorch could not run, every line says why.
    let mut lines = plain_lines(&run);
    attach_torch(&mut lines, Err("ci/bench_torch.py failed (is PyTorch installed?)".into()));
    assert!(lines.iter().all(|l| l.speedup_vs_torch.is_none()
        && l.vs_torch_note.as_deref().is_some_and(|n| n.contains("is PyTorch installed"))));
}

/// Every saved attempt is a patch that applies, from the repository root, to
/// the commit its record names (the check needs the history: in a shallow
/// clone the commits it lacks are skipped, and each patch is still parsed).
#[test]
fn the_committed_attempts_apply_to_their_revisions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let rejected = root.join("perf/rejected");
    let scratch = tempfile::tempdir().unwrap();
    let shallow = git(root, &["rev-parse", "--is-shallow-repository"]).trim() == "true";
    let mut checked = 0;
    for e in std::fs::read_dir(&rejected).unwrap() {
        let dir = e.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let names: BTreeSet<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(names.contains("attempt.patch") && !names.contains("files"), "{}: {names:?}", dir.display());
        let patch = dir.join("attempt.patch");
        git(root, &["apply", "--stat", patch.to_str().unwrap()]);
        let rev = match read_json::<Record>(&dir.join("record.json")) {
            Ok(r) => r.base_rev.unwrap_or_else(|| panic!("{}: no base_rev", dir.display())),
            // Attempts measured outside the ledger name their base commit in BASE.
            Err(_) => std::fs::read_to_string(dir.join("BASE")).unwrap().trim().to_string(),
        };
        let present = Cmd::new("git").args(["cat-file", "-e", &format!("{rev}^{{commit}}")]).cwd(root).quiet().run();
        if !present.unwrap().success() {
            assert!(shallow, "{}: {rev} is not in this repository", dir.display());
            continue;
        }
        attempt::check_applies(root, scratch.path(), &patch, &rev).unwrap();
        checked += 1;
    }
    assert!(shallow || checked >= 18, "{checked}");
}

#[test]
fn a_ledger_line_keeps_the_gates_explanation() {
    let mut g = gate_says(Verdict::Regression, 0.05);
    g.shapes[0].explanation = vec!["what changed: the entry's code".into()];
    let lines = bench_lines(&g);
    assert_eq!(lines[0].explanation, ["what changed: the entry's code"]);
    let text = serde_json::to_string(&lines[0]).unwrap();
    assert!(text.contains("\"explanation\""), "{text}");
    let same = bench_lines(&gate_says(Verdict::Same, 0.0));
    assert!(!serde_json::to_string(&same[0]).unwrap().contains("explanation"));
}
