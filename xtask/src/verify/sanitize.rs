//! `cargo xtask sanitize`: compute-sanitizer's memcheck (with leak check),
//! racecheck, synccheck and initcheck over `fa-test --set sanitize`, which reaches
//! every entry point; with `--defects`, each planted defect must be caught by its tool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::compile;
use crate::errors::CheckFailed;
use crate::parse::sanitizer::{self, Finding, Summary};
use crate::report::{Device, Envelope, Toolchain};
use crate::run::Run;
use crate::table;
use crate::tools::deal::{START_CHECK, Step, busy_lines, deal};
use crate::tools::drivers;
use crate::tools::gpu::GpuSpec;
use crate::tools::gpu::ListedGpu;
use crate::tools::process::{Cmd, write_file};
use crate::tools::toolchain;
use crate::verify::spread::{self, Shard, ShardRecord};
use crate::verify::test;
use fa_schema::manifest::Manifest;
use fa_schema::schema::ListedCase;
use fa_schema::schema::TestRun;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Memcheck,
    Racecheck,
    Synccheck,
    Initcheck,
}

impl Tool {
    pub const ALL: [Tool; 4] = [Tool::Memcheck, Tool::Racecheck, Tool::Synccheck, Tool::Initcheck];

    fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Racecheck => "racecheck",
            Tool::Synccheck => "synccheck",
            Tool::Initcheck => "initcheck",
        }
    }

    fn extra_args(self) -> &'static [&'static str] {
        match self {
            Tool::Memcheck => &["--leak-check", "full"],
            _ => &[],
        }
    }

    /// Time over the sanitize set against initcheck's, for dealing the slowest
    /// first (H200, 164 cases: racecheck 35.9 s, memcheck 19.7, initcheck
    /// 16.3, synccheck 15.4).
    fn relative_cost(self) -> f64 {
        match self {
            Tool::Racecheck => 2.2,
            Tool::Memcheck => 1.2,
            Tool::Initcheck => 1.0,
            Tool::Synccheck => 0.95,
        }
    }

    /// Racecheck instruments every shared-memory access and is the slowest by far.
    fn default_timeout(self) -> Duration {
        Duration::from_secs(match self {
            Tool::Racecheck => 1200,
            _ => 600,
        })
    }
}

/// The planted defects (`-D` define) and the tool that must report each.
const DEFECTS: [(&str, Tool); 4] = [
    ("FA_DEFECT_OOB_TAIL", Tool::Memcheck),
    ("FA_DEFECT_RACE", Tool::Racecheck),
    ("FA_DEFECT_UNINIT", Tool::Initcheck),
    ("FA_DEFECT_DIVERGENT_SYNC", Tool::Synccheck),
];

pub struct Options {
    pub tools: Vec<Tool>,
    /// Overrides every tool's default timeout.
    pub timeout: Option<Duration>,
    /// Also build and check the planted defects.
    pub defects: bool,
    pub build_timeout: Duration,
    pub jobs: usize,
    /// `--gpus all|N|LIST`: the sanitize set in one part per GPU, run side by side.
    pub gpus: Option<GpuSpec>,
    /// `--shard I/N`: only this part of the sanitize set.
    pub shard: Option<Shard>,
}

impl Options {
    /// All four tools at their default timeouts, no planted defects, one GPU.
    pub fn all(build_timeout: Duration, jobs: usize) -> Options {
        Options {
            tools: Tool::ALL.to_vec(),
            timeout: None,
            defects: false,
            build_timeout,
            jobs,
            gpus: None,
            shard: None,
        }
    }
}

/// What one sanitizer run's fa-test covers: the whole set, or a part of it.
#[derive(Debug, Clone, Default)]
struct Part {
    /// `2/4`, where the set was divided.
    label: Option<String>,
    /// The part's case names, for fa-test --cases.
    cases: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolRun {
    pub tool: Tool,
    /// `release` or the planted defect's define.
    pub kernels: String,
    pub exit_code: Option<i32>,
    pub seconds: f64,
    /// From the text output; `None` means nothing was checked.
    pub summary: Option<Summary>,
    pub findings: Vec<Finding>,
    /// Why the XML could not be read (missing, cut short, not the tool's); then
    /// `findings` is empty for want of a report, not for want of findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xml_error: Option<String>,
    /// What fa-test ran under the tool, from its JSON; `None`: it wrote none.
    #[serde(default)]
    pub tests: Option<Tally>,
    pub xml: PathBuf,
    pub log: PathBuf,
    /// The part of the sanitize set, where the set was divided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// The GPU (UUID) it ran on, where `--gpus` named several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Seconds fa-test spent setting up under the tool (opening the GPU, loading
    /// the kernels), where it wrote its results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_s: Option<f64>,
}

/// Correctness cases fa-test ran under a tool, how many failed, and enough to
/// run those again: the first few failed cases' names and the inputs' seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub cases: usize,
    pub failed: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_cases: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl Tally {
    /// Failed cases named at most.
    const NAMED: usize = 4;

    pub fn of(run: &TestRun) -> Tally {
        let failed: Vec<&str> = run.cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        Tally {
            cases: run.cases.len(),
            failed: failed.len(),
            failed_cases: failed.iter().take(Self::NAMED).map(|n| n.to_string()).collect(),
            seed: Some(run.seed),
        }
    }

    /// "N of M cases failed under TOOL", with the cases and how to run them again.
    fn failures(&self, tool: &str) -> String {
        let mut line = format!("{} of {} cases failed under {tool}", self.failed, self.cases);
        if let Some(first) = self.failed_cases.first() {
            let more = self.failed.saturating_sub(self.failed_cases.len());
            line += &format!(": {}", self.failed_cases.join(", "));
            if more > 0 {
                line += &format!(" and {more} more");
            }
            if let Some(seed) = self.seed {
                line += &format!(" (again: fa-test --set sanitize --seed {seed} --filter {first})");
            }
        }
        line
    }
}

impl ToolRun {
    /// Errors reported, by the summary (the XML stops at the print limit).
    fn errors(&self) -> u64 {
        let from_xml = self.findings.iter().filter(|f| f.is_error()).count() as u64;
        self.summary.map_or(from_xml, |s| s.errors.max(from_xml))
    }

    fn clean(&self) -> bool {
        self.problems().is_empty()
    }

    /// Why a release run does not count as clean: the tool's own findings, and a
    /// driver that failed or checked nothing (a sanitizer summary alone does not
    /// prove any kernel ran).
    fn problems(&self) -> Vec<String> {
        let tool = self.tool.name();
        let mut v = Vec::new();
        if let Some(e) = &self.xml_error {
            v.push(format!("{tool}: {e}"));
        }
        match self.summary {
            None => v.push(format!("{tool} printed no summary: nothing was checked (see {})", self.log.display())),
            Some(s) if s.leaked_bytes > 0 => v.push(format!("memcheck found {} leaked bytes", s.leaked_bytes)),
            Some(_) => {}
        }
        if self.errors() > 0 {
            v.push(format!("{tool} reported {} error(s)", self.errors()));
        }
        match &self.tests {
            None => v.push(format!("fa-test wrote no results under {tool} (see {})", self.log.display())),
            Some(t) if t.cases == 0 => v.push(format!("fa-test ran no case under {tool}")),
            Some(t) if t.failed > 0 => v.push(t.failures(tool)),
            Some(_) => {}
        }
        if self.exit_code != Some(0) && v.is_empty() {
            v.push(format!("fa-test exited with {:?} under {tool} (see {})", self.exit_code, self.log.display()));
        }
        v
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DefectRun {
    pub define: String,
    pub expected_tool: Tool,
    pub caught: bool,
    pub run: ToolRun,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SanitizePayload {
    pub runs: Vec<ToolRun>,
    pub defects: Vec<DefectRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardRecord>,
    /// Each worker's start check and sanitizer runs in time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<Step>,
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("sanitize")?;
    let sanitizer = toolchain::cuda_tool("compute-sanitizer")?;
    let driver = drivers::binary(cx, "fa-test")?;
    let dir = cx.reports().join("sanitize");
    let device = drivers::device_info(&driver, &cx.kernels, cx.device.as_deref(), None)?;

    let (parts, gpus, shard) = if opts.gpus.is_none() && opts.shard.is_none() {
        (vec![Part::default()], vec![None], None)
    } else {
        divide(&driver, &dir, cx.device.as_deref(), opts)?
    };
    let (runs, timeline) =
        run_parts(&sanitizer, &driver, &dir, &cx.kernels, cx.device.as_deref(), opts, &parts, &gpus)?;

    let mut defects = Vec::new();
    if opts.defects {
        let manifest = Manifest::load(&cx.manifest())?;
        let arch = manifest
            .arch_for(&device.compute_capability)
            .with_context(|| format!("no manifest arch runs on compute capability {}", device.compute_capability))?;
        for (define, tool) in DEFECTS {
            let kernels = dir.join(format!("kernels-{define}"));
            eprintln!("== sanitize: planting {define} (built for {arch} into {})", kernels.display());
            compile::run(
                cx,
                &compile::Options {
                    archs: Some(vec![arch.clone()]),
                    defines: vec![define.to_string()],
                    out_dir: Some(kernels.clone()),
                    report: format!("sanitize/build-{define}"),
                    enforce_budgets: false,
                    ..compile::Options::new(opts.build_timeout, opts.jobs)
                },
            )?;
            let run = run_tool(
                &sanitizer,
                &driver,
                tool,
                &kernels,
                cx.device.as_deref(),
                define,
                &dir,
                opts,
                &Part::default(),
                None,
            )?;
            defects.push(DefectRun { define: define.into(), expected_tool: tool, caught: run.errors() > 0, run });
        }
    }

    println!("{}", run_table(&runs, &defects));
    let findings = findings_table(runs.iter().chain(defects.iter().map(|d| &d.run)));
    if !findings.is_empty() {
        println!("\nFINDINGS (by kernel and source line)\n{findings}");
    }
    if gpus.len() > 1 {
        for line in busy_lines(&timeline) {
            println!("  {line}");
        }
    }
    let payload = SanitizePayload { runs, defects, shard, timeline };
    let report = cx.report("sanitize");
    let dev = Device::from(&device);
    let toolchain = Toolchain { driver: device.driver.clone(), ..Toolchain::default() };
    Envelope::new("sanitize", crate::tools::process::git_state(&cx.root), toolchain, Some(dev), &payload)
        .kernels(crate::compile::kernel_set::reported(&cx.kernels))
        .write(&report)?;
    println!("report: {}", report.display());

    let mut problems: Vec<String> = payload.runs.iter().flat_map(ToolRun::problems).collect();
    for d in &payload.defects {
        if !d.caught {
            problems.push(format!("planted {} was not caught by {}", d.define, d.expected_tool.name()));
        }
        if let Some(e) = &d.run.xml_error {
            problems.push(format!("{} with {} planted: {e}", d.expected_tool.name(), d.define));
        }
    }
    if !problems.is_empty() {
        return Err(CheckFailed(problems.join("; ")).into());
    }
    Ok(())
}

/// Every tool over every part of the release kernels, dealt to the workers of
/// `gpus` (tool by tool, part by part); the runs in tool order, and the timeline.
#[allow(clippy::too_many_arguments)]
fn run_parts(
    sanitizer: &Path,
    driver: &Path,
    dir: &Path,
    kernels: &Path,
    device: Option<&str>,
    opts: &Options,
    parts: &[Part],
    gpus: &[Option<ListedGpu>],
) -> Result<(Vec<ToolRun>, Vec<Step>)> {
    let mut tools = opts.tools.clone();
    tools.sort_by(|a, b| b.relative_cost().total_cmp(&a.relative_cost()));
    let items: Vec<(Tool, &Part)> = tools.iter().flat_map(|&t| parts.iter().map(move |p| (t, p))).collect();
    let names: Vec<String> = items
        .iter()
        .map(|(t, p)| p.label.as_ref().map_or(t.name().to_string(), |l| format!("{} {l}", t.name())))
        .collect();
    let dealt = deal(
        "sanitizer run",
        gpus,
        items,
        |g| drivers::start_check(driver, kernels, g),
        |_, _, &(tool, part), gpu| {
            run_tool(sanitizer, driver, tool, kernels, device, "release", dir, opts, part, gpu)
                .map_err(|e| format!("{e:#}"))
        },
        |what| eprintln!("sanitize: {what}"),
    );
    if !dealt.lost.is_empty() {
        let why: Vec<String> = dealt
            .lost
            .iter()
            .map(|l| {
                format!(
                    "{}{}: {}",
                    names[l.index],
                    l.gpu.as_ref().map(|g| format!(" on {g}")).unwrap_or_default(),
                    l.why
                )
            })
            .collect();
        return Err(anyhow::anyhow!("sanitizer runs did not finish: {}", why.join("; ")));
    }
    let setup: std::collections::HashMap<usize, f64> =
        dealt.done.iter().filter_map(|(i, r)| r.setup_s.map(|s| (*i, s))).collect();
    let timeline = dealt
        .spans
        .iter()
        .map(|s| match s.item {
            None => s.step(START_CHECK, None),
            Some(i) => s.step(names[i].clone(), setup.get(&i).copied()),
        })
        .collect();
    let mut runs: Vec<ToolRun> = dealt.done.into_iter().map(|(_, r)| r).collect();
    runs.sort_by_key(|r| opts.tools.iter().position(|&t| t == r.tool));
    Ok((runs, timeline))
}

/// The sanitize set (or this shard of it) in one part per worker, each written
/// as a case list for fa-test --cases; and the workers. The parts of every tool
/// are dealt slowest tool first. More parts balance no better: each sanitizer
/// process costs about 2 s of its own (tool start, instrumenting the kernels at
/// load, teardown), more than a part's imbalance.
#[allow(clippy::type_complexity)]
fn divide(
    driver: &Path,
    dir: &Path,
    device: Option<&str>,
    opts: &Options,
) -> Result<(Vec<Part>, Vec<Option<ListedGpu>>, Option<ShardRecord>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let listed = test::list_cases(driver, dir, &["--set", "sanitize"], None)?;
    let (mine, shard) = test::take_shard(&listed, opts.shard);
    let gpus = crate::tools::gpu::workers(opts.gpus.as_ref(), device, "sanitize")?;
    Ok((parts_of(&mine, gpus.len(), dir)?, gpus, shard))
}

/// `cases` in `n` parts of near-equal work, each part's names in `dir/part-I.txt`.
fn parts_of(cases: &[ListedCase], n: usize, dir: &Path) -> Result<Vec<Part>> {
    let mut parts = Vec::new();
    for (i, names) in spread::partition(cases, n as u32).into_iter().enumerate() {
        let cases = dir.join(format!("part-{}.txt", i + 1));
        write_file(&cases, names.join("\n") + "\n")?;
        parts.push(Part { label: Some(format!("{}/{n}", i + 1)), cases: Some(cases) });
    }
    Ok(parts)
}

#[allow(clippy::too_many_arguments)]
fn run_tool(
    sanitizer: &Path,
    driver: &Path,
    tool: Tool,
    kernels: &Path,
    device: Option<&str>,
    label: &str,
    dir: &Path,
    opts: &Options,
    part: &Part,
    gpu: Option<&ListedGpu>,
) -> Result<ToolRun> {
    let mut stem = if label == "release" { tool.name().to_string() } else { format!("{}-{label}", tool.name()) };
    if let Some(cases) = &part.cases {
        stem = format!("{stem}-{}", cases.file_stem().and_then(|s| s.to_str()).unwrap_or("part"));
    }
    let xml = dir.join(format!("{stem}.xml"));
    let log = dir.join(format!("{stem}.log"));
    let results = dir.join(format!("{stem}.fa-test.json"));
    let _ = std::fs::remove_file(&xml);
    let _ = std::fs::remove_file(&results);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let what = part.label.as_ref().map_or(label.to_string(), |p| format!("{label}, part {p}"));
    let (_progress, feed) = crate::verify::test::case_progress(&format!("sanitize {} ({what})", tool.name()), None);
    let cmd = Cmd::new(sanitizer)
        .on_line(feed)
        .args(["--tool", tool.name()])
        .args(tool.extra_args().iter().copied())
        .args(["--xml", "--save"])
        .arg(xml.display().to_string())
        .args(["--print-limit", "1000"])
        .arg(driver.display().to_string())
        .args(["--set", "sanitize", "--json"])
        .arg(results.display().to_string())
        .timeout(opts.timeout.unwrap_or(tool.default_timeout()))
        .log(&log);
    let mut cmd = drivers::aim(cmd, kernels, device);
    if let Some(cases) = &part.cases {
        cmd = cmd.arg("--cases").arg(cases.display().to_string());
    }
    let out = drivers::on_gpu(cmd, gpu).run()?;
    let text = format!("{}{}", out.stdout, out.stderr);
    let results = fa_schema::file::read_text(&results).ok().and_then(|t| serde_json::from_str::<TestRun>(&t).ok());
    let tests = results.as_ref().map(Tally::of);
    let (findings, xml_error) = match read_findings(&xml) {
        Ok(f) => (f, None),
        Err(e) => (Vec::new(), Some(format!("{e:#}; see {}", log.display()))),
    };
    Ok(ToolRun {
        tool,
        kernels: label.to_string(),
        exit_code: out.status.code(),
        seconds: out.elapsed.as_secs_f64(),
        summary: sanitizer::parse_summary(&text),
        findings,
        xml_error,
        tests,
        xml,
        log,
        part: part.label.clone(),
        gpu: gpu.map(|g| g.uuid.clone()),
        setup_s: results.map(|r| r.setup_s),
    })
}

/// The findings in the XML a sanitizer run saved. A run that saved none (it died,
/// timed out, or never started the driver) or saved it cut short is an error,
/// never a run without findings.
fn read_findings(xml: &Path) -> Result<Vec<Finding>> {
    let text = fa_schema::file::read_text(xml)
        .with_context(|| format!("compute-sanitizer saved no readable XML at {}", xml.display()))?;
    sanitizer::parse_xml(&text).with_context(|| format!("in {}", xml.display()))
}

fn run_table(runs: &[ToolRun], defects: &[DefectRun]) -> String {
    let mut rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.tool.name().into(),
                r.part.as_ref().map_or(r.kernels.clone(), |p| format!("{} {p}", r.kernels)),
                r.summary.map_or("none".into(), |s| format!("{} err, {} warn", s.errors, s.warnings)),
                r.findings.len().to_string(),
                format!("{:.1}", r.seconds),
                if r.clean() { "clean".into() } else { "FAIL".into() },
            ]
        })
        .collect();
    rows.extend(defects.iter().map(|d| {
        vec![
            d.expected_tool.name().into(),
            d.define.clone(),
            d.run.summary.map_or("none".into(), |s| format!("{} err, {} warn", s.errors, s.warnings)),
            d.run.findings.len().to_string(),
            format!("{:.1}", d.run.seconds),
            match (d.caught, &d.run.xml_error) {
                (_, Some(_)) => "FAIL".into(),
                (true, None) => "caught".into(),
                (false, None) => "MISSED".into(),
            },
        ]
    }));
    table::render(&["tool", "kernels", "summary", "records", "s", "verdict"], &rows)
}

/// Findings grouped by (tool, kernels, kernel, file:line, what), most frequent first.
fn findings_table<'a>(runs: impl Iterator<Item = &'a ToolRun>) -> String {
    let mut groups: Vec<(Vec<String>, u64)> = Vec::new();
    for r in runs {
        for f in &r.findings {
            let key = vec![
                r.tool.name().to_string(),
                r.kernels.clone(),
                f.location.kernel.clone(),
                f.location.source(),
                f.what.clone(),
            ];
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += f.count,
                None => groups.push((key, f.count)),
            }
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.1));
    let rows: Vec<Vec<String>> = groups
        .into_iter()
        .map(|(mut k, n)| {
            k.push(n.to_string());
            k
        })
        .collect();
    table::render(&["tool", "kernels", "kernel", "line", "what", "count"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(summary: Option<Summary>, tests: Option<Tally>, exit_code: i32) -> ToolRun {
        ToolRun {
            tool: Tool::Racecheck,
            kernels: "release".into(),
            exit_code: Some(exit_code),
            seconds: 1.0,
            summary,
            findings: vec![],
            xml_error: None,
            tests,
            xml: "r.xml".into(),
            log: "r.log".into(),
            part: None,
            gpu: None,
            setup_s: None,
        }
    }

    #[test]
    fn parts_run_side_by_side_and_cover_the_set_once() {
        let dir = tempfile::tempdir().unwrap();
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let cases: Vec<ListedCase> =
            (0..10).map(|i| ListedCase { name: format!("c{i}"), work: 1.0 + i as f64 }).collect();
        let gpus = ["a", "b", "c"].map(|u| Some(ListedGpu { name: "Fake GPU".into(), uuid: u.into() })).to_vec();
        let parts = parts_of(&cases, gpus.len(), dir.path()).unwrap();
        let opts = Options { tools: vec![Tool::Memcheck, Tool::Racecheck], ..Options::all(Duration::from_secs(60), 1) };
        let sanitizer = data.join("fake-compute-sanitizer.py");
        let fa_test = data.join("fake-fa-test.py");
        let (runs, timeline) =
            run_parts(&sanitizer, &fa_test, dir.path(), dir.path(), None, &opts, &parts, &gpus).unwrap();
        assert_eq!(runs.len(), 6);
        assert_eq!(runs.iter().map(|r| r.tool).collect::<Vec<_>>()[..3], [Tool::Memcheck; 3]);
        assert!(runs.iter().all(|r| r.clean()), "{runs:?}");
        for tool in [Tool::Memcheck, Tool::Racecheck] {
            let ran: usize = runs.iter().filter(|r| r.tool == tool).map(|r| r.tests.as_ref().unwrap().cases).sum();
            assert_eq!(ran, 10, "{tool:?}: every case once");
        }
        assert!(runs.iter().any(|r| r.part.as_deref() == Some("2/3")));
        assert!(runs.iter().all(|r| r.gpu.as_deref().is_some_and(|g| ["a", "b", "c"].contains(&g))));
        // Three start checks and six runs, each named, on the timeline.
        assert_eq!(timeline.iter().filter(|s| s.what == START_CHECK).count(), 3);
        assert!(timeline.iter().any(|s| s.what == "racecheck 3/3"));
        assert_eq!(timeline.len(), 9);
    }

    #[test]
    fn failed_cases_are_named_with_the_seed_that_repeats_them() {
        let case = |name: &str, passed| fa_schema::schema::TestCase { name: name.into(), passed, ..Default::default() };
        let names = ["a-hopper", "b", "c", "d", "e"];
        let mut cases: Vec<_> = names.iter().map(|n| case(n, false)).collect();
        cases.push(case("fine", true));
        let device = fa_schema::schema::DeviceInfo {
            name: "H200".into(),
            compute_capability: "9.0".into(),
            sm_count: 132,
            driver: None,
            uuid: None,
        };
        let t = Tally::of(&TestRun { device, seed: 381, setup_s: 0.0, cases, skipped: vec![] });
        assert_eq!((t.cases, t.failed, t.failed_cases.len()), (6, 5, Tally::NAMED));
        let quiet = Some(Summary { errors: 0, warnings: 0, leaked_bytes: 0 });
        assert_eq!(
            run(quiet, Some(t), 1).problems(),
            [
                "5 of 6 cases failed under racecheck: a-hopper, b, c, d and 1 more (again: fa-test --set sanitize --seed 381 --filter a-hopper)"
            ]
        );
    }

    #[test]
    fn clean_needs_cases_that_ran_and_passed() {
        let quiet = Some(Summary { errors: 0, warnings: 0, leaked_bytes: 0 });
        let tally = |cases, failed| Some(Tally { cases, failed, failed_cases: vec![], seed: None });
        let ran = tally(40, 0);
        assert!(run(quiet, ran.clone(), 0).clean());
        // The sanitizer's summary alone proves nothing about the kernels.
        assert!(run(quiet, None, 0).problems()[0].contains("no results"));
        assert!(run(quiet, tally(0, 0), 0).problems()[0].contains("no case"));
        assert!(run(quiet, tally(40, 2), 1).problems()[0].contains("2 of 40"));
        assert!(run(quiet, ran.clone(), 3).problems()[0].contains("exited with Some(3)"));
        assert!(run(None, ran.clone(), 0).problems()[0].contains("no summary"));
        let found = Some(Summary { errors: 5, warnings: 0, leaked_bytes: 0 });
        assert_eq!(run(found, ran, 0).problems(), ["racecheck reported 5 error(s)"]);
    }

    fn data(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
    }

    #[test]
    fn missing_or_cut_short_xml_is_not_a_clean_run() {
        assert_eq!(read_findings(&data("project/racecheck-FA_DEFECT_RACE.xml")).unwrap().len(), 32);
        assert!(read_findings(&data("h200/compute-sanitizer-racecheck-clean.xml")).unwrap().is_empty());
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("racecheck.xml");
        let err = format!("{:#}", read_findings(&missing).unwrap_err());
        assert!(err.contains("saved no readable XML") && err.contains("racecheck.xml"), "{err}");
        let full = std::fs::read_to_string(data("project/racecheck-FA_DEFECT_RACE.xml")).unwrap();
        let cut = dir.path().join("cut.xml");
        std::fs::write(&cut, &full[..full.rfind("</record>").unwrap() + "</record>\n".len()]).unwrap();
        assert!(read_findings(&cut).is_err(), "a copy cut after a whole record");

        // With the XML unread, a quiet summary and passing cases still fail.
        let quiet = Some(Summary { errors: 0, warnings: 0, leaked_bytes: 0 });
        let unread = ToolRun {
            xml_error: Some(err),
            ..run(quiet, Some(Tally { cases: 40, failed: 0, failed_cases: vec![], seed: None }), 0)
        };
        assert!(!unread.clean());
        assert!(unread.problems()[0].starts_with("racecheck: compute-sanitizer saved no readable XML"));
    }
}
