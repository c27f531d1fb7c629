//! `cargo xtask build`: compile every kernel source for every manifest arch with
//! `-Xptxas=-v`, parse the resource report, enforce budgets, write `build.json`.

pub mod budget;
mod includes;
pub mod kernel_set;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::errors::{CannotRun, CheckFailed};
use crate::parse::nvcc;
use crate::parse::ptxas::{self, KernelResources};
use crate::parse::sass::{self, OpcodeCounts};
use crate::report::{Envelope, Toolchain};
use crate::run::Run;
use crate::table;
use crate::tools::process::{Cmd, Lock, write_file};
use crate::tools::progress::Progress;
use crate::tools::toolchain::{self, Nvcc};
use budget::{Breach, LocalMemory, SassRecord};
use fa_schema::manifest::Manifest;

#[derive(Clone)]
pub struct Options {
    pub timeout: Duration,
    /// Another manifest (tests plant breaches with one); its sources are relative to it.
    pub manifest: Option<PathBuf>,
    pub jobs: usize,
    /// Build only these archs (default: every arch the manifest lists).
    pub archs: Option<Vec<String>>,
    /// Extra `-D` defines for every unit (planted defects).
    pub defines: Vec<String>,
    /// Where fatbins go (default `target/kernels`).
    pub out_dir: Option<PathBuf>,
    /// Report name under `target/xtask/` (default `build`).
    pub report: String,
    /// Where the sources are (default: the manifest's directory).
    pub src_dir: Option<PathBuf>,
    /// Whether a budget breach fails the build. Planted-defect builds only report
    /// them: the defect's own code may cost registers, and those fatbins never ship.
    pub enforce_budgets: bool,
}

impl Options {
    /// The manifest this build reads: `manifest`, else the checkout's.
    pub fn manifest_path(&self, cx: &Run) -> PathBuf {
        self.manifest.clone().unwrap_or_else(|| cx.manifest())
    }

    pub fn new(timeout: Duration, jobs: usize) -> Options {
        Options {
            timeout,
            manifest: None,
            jobs,
            archs: None,
            defines: Vec::new(),
            out_dir: None,
            report: "build".into(),
            src_dir: None,
            enforce_budgets: true,
        }
    }
}

/// Flags common to every unit; the arch's `-gencode` is added per unit.
const FLAGS: &[&str] = &["-fatbin", "-O3", "-lineinfo", "-std=c++17", "-Xptxas=-v"];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildPayload {
    pub nvcc_version: String,
    pub flags: Vec<String>,
    pub units: Vec<Unit>,
    pub kernels: Vec<KernelResources>,
    /// SASS opcode counts per entry and arch.
    #[serde(default)]
    pub sass: Vec<SassRecord>,
    pub breaches: Vec<Breach>,
    pub ptxas_warnings: Vec<String>,
}

/// One nvcc invocation: one source for one arch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unit {
    pub source: String,
    pub arch: String,
    pub output: PathBuf,
    pub hash: String,
    pub cached: bool,
    pub seconds: f64,
}

/// Stored beside each output, so an unchanged unit reuses its ptxas report.
#[derive(Serialize, Deserialize)]
struct Stamp {
    hash: String,
    ptxas: String,
    /// Absent in stamps from before the SASS check: such a unit recompiles once.
    #[serde(default)]
    sass: Option<OpcodeCounts>,
}

/// Marks a build that failed because nvcc rejected a unit: the context of that
/// [`CheckFailed`], which tells it apart from a budget breach.
#[derive(Debug)]
struct CompileFailed;

impl std::fmt::Display for CompileFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kernel compilation failed")
    }
}

/// Whether a build error is a budget breach, not a unit nvcc rejected nor a
/// build that could not run.
pub fn over_budget(e: &anyhow::Error) -> bool {
    e.downcast_ref::<CheckFailed>().is_some() && e.downcast_ref::<CompileFailed>().is_none()
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    if opts.jobs == 0 {
        return Err(
            CannotRun("-j/--jobs 0: at least one nvcc job must run; leave -j out to use every core".into()).into()
        );
    }
    crate::tools::toolchain::require_host_compiler()?;
    let manifest_path = opts.manifest_path(cx);
    let mut manifest = Manifest::load(&manifest_path)?;
    if let Some(only) = &opts.archs {
        manifest.sources.iter_mut().for_each(|s| s.archs.retain(|a| only.contains(a)));
    }
    if manifest.sources.iter().all(|s| s.archs.is_empty()) {
        let why = match &opts.archs {
            Some(only) => format!("no source lists {}", only.join(" or ")),
            None if manifest.sources.is_empty() => "\"sources\" is empty".into(),
            None => "no source lists an arch".into(),
        };
        return Err(CannotRun(format!(
            "nothing to build: {why} in {}; each source needs a file, its archs and its kernels",
            manifest_path.display()
        ))
        .into());
    }
    let src_dir =
        opts.src_dir.clone().unwrap_or_else(|| manifest_path.parent().unwrap_or(Path::new(".")).to_path_buf());
    let nvcc = toolchain::nvcc(&cx.cuda_wheels)?;
    let cuobjdump = cuobjdump_beside(&nvcc)?;
    let out_dir = opts.out_dir.clone().unwrap_or_else(|| cx.kernels.clone());
    check_out_dir(&out_dir, &cx.root, &src_dir).map_err(|e| CannotRun(format!("--out-dir: {e}")))?;
    let headers = kernel_headers(&src_dir)?;

    let mut jobs = Vec::new();
    for src in &manifest.sources {
        let source_path = src_dir.join(&src.file);
        inside(&source_path, &src_dir).map_err(|e| CannotRun(format!("source {}: {e}", src.file)))?;
        let text = fa_schema::file::read(&source_path)
            .with_context(|| format!("reading kernel source {}", source_path.display()))?;
        let headers = headers_digest(&text, &headers);
        for arch in &src.archs {
            let gencode = &manifest.archs[arch].gencode;
            let mut args: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
            args.extend([format!("-gencode={gencode}"), format!("-I{}", src_dir.display())]);
            args.extend(src.defines.iter().chain(&opts.defines).map(|d| format!("-D{d}")));
            let mut h = Sha256::new();
            for part in [nvcc.version.as_bytes(), args.join(" ").as_bytes(), &text, &headers] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part);
            }
            let output = out_dir.join(src.fatbin(arch));
            jobs.push(Job {
                source: src.file.clone(),
                source_path: source_path.clone(),
                arch: arch.clone(),
                args,
                hash: hex(&h.finalize()),
                output,
            });
        }
    }

    // Builds into one folder take turns (checkouts sharing a target dir, parallel
    // runs): the second finds the first's units cached.
    let _lock = Lock::hold(&out_dir.join(".build.lock"), &format!("building {}", manifest_path.display()))?;
    kernel_set::begin(&out_dir)?;
    let total = jobs.len();
    let started = Instant::now();
    let results = run_jobs(&nvcc, &cuobjdump, jobs, opts, total)?;
    kernel_set::record(&out_dir, &manifest, &manifest_path, &src_dir, &opts.defines)?;
    let fresh = results.iter().filter(|(u, ..)| !u.cached).count();
    eprintln!(
        "xtask build: {total} units ({fresh} compiled, {} cached) in {:.1} s",
        total - fresh,
        started.elapsed().as_secs_f64()
    );

    let mut kernels = Vec::new();
    let mut warnings = Vec::new();
    let mut units = Vec::new();
    let mut sass_records = Vec::new();
    for (unit, log, counts) in results {
        sass_records.extend(counts.into_iter().map(|(kernel, opcodes)| SassRecord {
            kernel,
            arch: unit.arch.clone(),
            opcodes,
        }));
        let report = ptxas::parse(&log);
        kernels.extend(report.kernels);
        warnings.extend(report.warnings.into_iter().map(|w| format!("{} {}: {w}", unit.source, unit.arch)));
        units.push(unit);
    }
    kernels.sort_by(|a, b| (&a.name, &a.arch).cmp(&(&b.name, &b.arch)));
    sass_records.sort_by(|a, b| (&a.kernel, &a.arch).cmp(&(&b.kernel, &b.arch)));
    let mut breaches = budget::check_all(&manifest, &kernels);
    breaches.extend(budget::check_sass(&manifest, &sass_records));
    let payload = BuildPayload {
        nvcc_version: nvcc.version.clone(),
        flags: FLAGS.iter().map(|s| s.to_string()).collect(),
        units,
        kernels,
        sass: sass_records,
        breaches,
        ptxas_warnings: warnings,
    };
    let toolchain =
        Toolchain { nvcc: Some(nvcc.version.clone()), nvcc_path: Some(nvcc.path.display().to_string()), driver: None };
    let report_path = cx.report(&opts.report);
    Envelope::new("build", crate::tools::process::git_state(&cx.root), toolchain, None, &payload)
        .write(&report_path)?;

    let table_path = report_path.with_extension("txt");
    crate::tools::process::table(&table_path, &resource_table(&payload.kernels, &payload.sass, &manifest))?;
    for w in &payload.ptxas_warnings {
        println!("ptxas warning: {w}");
    }
    if !payload.breaches.is_empty() {
        println!("\nBUDGET BREACHES\n{}", breach_table(&payload.breaches));
        if opts.enforce_budgets {
            return Err(CheckFailed(format!(
                "{} resource budget breach(es); see the table above and {}",
                payload.breaches.len(),
                report_path.display()
            ))
            .into());
        }
        println!("(not enforced for this build: {})", opts.defines.join(" "));
    }
    println!("report: {} (table: {})", report_path.display(), table_path.display());
    Ok(())
}

/// `path` resolved (symlinks followed, for as much of it as exists).
fn resolve(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut missing = Vec::new();
    let mut base = abs.as_path();
    loop {
        if let Ok(real) = base.canonicalize() {
            return missing.iter().rev().fold(real, |p, part: &&std::ffi::OsStr| p.join(part));
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                base = parent;
            }
            _ => return abs,
        }
    }
}

/// A source must resolve inside the source folder: one behind a symlink out of
/// it would build without being covered by the kernel-set hash.
fn inside(source: &Path, src_dir: &Path) -> std::result::Result<(), String> {
    let (real, dir) = (resolve(source), resolve(src_dir));
    if real.starts_with(&dir) {
        Ok(())
    } else {
        Err(format!(
            "{} resolves to {}, outside {}; sources live in the kernel folder",
            source.display(),
            real.display(),
            dir.display()
        ))
    }
}

/// Where a build may write: not the checkout or a folder above it, not inside
/// the kernel sources, and not a folder that already holds other files than a
/// kernel set's.
fn check_out_dir(out: &Path, root: &Path, src_dir: &Path) -> std::result::Result<(), String> {
    let (real, root, src) = (resolve(out), resolve(root), resolve(src_dir));
    if root.starts_with(&real) {
        return Err(format!(
            "{} is the checkout or a folder above it; name a folder for the kernel set, e.g. target/kernels-exp",
            real.display()
        ));
    }
    if real.starts_with(&src) || src.starts_with(&real) {
        return Err(format!(
            "{} would mix build files with the kernel sources in {}; name a folder under target/",
            real.display(),
            src.display()
        ));
    }
    let kernel_set = |p: &Path| p.join(kernel_set::FILE).exists() || p.join(".build.lock").exists();
    let holds_files = std::fs::read_dir(&real).is_ok_and(|mut entries| entries.next().is_some());
    if holds_files && !kernel_set(&real) {
        return Err(format!(
            "{} already holds files and no kernel set ({} or .build.lock); name a new or empty folder",
            real.display(),
            kernel_set::FILE
        ));
    }
    Ok(())
}

struct Job {
    source: String,
    source_path: PathBuf,
    arch: String,
    args: Vec<String>,
    hash: String,
    output: PathBuf,
}

/// A unit with its ptxas text and SASS opcode counts.
type Compiled = (Unit, String, OpcodeCounts);

/// Why a unit did not compile.
enum Failure {
    /// nvcc ran and rejected the unit: the sources or defines are wrong.
    Rejected(Rejected),
    /// nvcc or cuobjdump could not start or finish, or a file could not be moved.
    Tool(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Tool(e)
    }
}

/// A unit nvcc rejected: its first error (or, with none recognised, its last
/// lines) and the log holding its whole output.
#[derive(Debug, Clone, PartialEq)]
struct Rejected {
    unit: String,
    log: PathBuf,
    first: Vec<String>,
    errors: usize,
}

impl Rejected {
    fn new(unit: String, log: PathBuf, status: &str, output: &str) -> Rejected {
        match nvcc::first_error(output) {
            Some(e) => Rejected { unit, log, first: e.lines, errors: e.errors },
            None => {
                let mut first = vec![format!("nvcc failed ({status}) without an error line; its last lines:")];
                first.extend(crate::tools::process::tail(output, 5).lines().map(|l| format!("  {l}")));
                Rejected { unit, log, first, errors: 0 }
            }
        }
    }
}

/// The first error of each rejected unit, units with the same first error
/// under it, each with its error count and log.
fn rejected_report(rejected: &[Rejected], total: usize) -> String {
    let mut out = vec![format!(
        "{} of {total} kernel unit(s) failed to compile; the first error of each, then the units and their full logs:",
        rejected.len()
    )];
    let mut shown: Vec<&[String]> = Vec::new();
    for r in rejected {
        if shown.contains(&r.first.as_slice()) {
            continue;
        }
        shown.push(&r.first);
        out.extend(r.first.iter().cloned());
        for same in rejected.iter().filter(|s| s.first == r.first) {
            let count = match same.errors {
                0 => String::new(),
                1 => " (1 error)".into(),
                n => format!(" (first of {n} errors)"),
            };
            out.push(format!("  in {}{count}: {}", same.unit, same.log.display()));
        }
    }
    out.join("\n")
}

/// Runs units on `opts.jobs` workers; returns them compiled, in input order.
fn run_jobs(nvcc: &Nvcc, cuobjdump: &Path, jobs: Vec<Job>, opts: &Options, total: usize) -> Result<Vec<Compiled>> {
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let done = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());
    let finished = Mutex::new(0usize);
    let progress = Progress::bar("build", total as u64);
    std::thread::scope(|s| {
        for _ in 0..opts.jobs {
            s.spawn(|| {
                loop {
                    let Some((idx, job)) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let result = compile(nvcc, cuobjdump, &job, opts.timeout);
                    let mut n = finished.lock().unwrap();
                    *n += 1;
                    match result {
                        Ok((unit, log, sass)) => {
                            let how = if unit.cached { "cached".to_string() } else { format!("{:.1} s", unit.seconds) };
                            progress.item(&format!("[{}/{total}] {} {}: {how}", *n, job.source, job.arch));
                            done.lock().unwrap().push((idx, unit, log, sass));
                        }
                        Err(e) => {
                            progress.report(&format!("[{}/{total}] {} {}: FAILED", *n, job.source, job.arch));
                            failures.lock().unwrap().push((idx, job.source.clone(), job.arch.clone(), e));
                        }
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    if !failures.is_empty() {
        failures.sort_by_key(|(idx, ..)| *idx);
        let mut rejected = Vec::new();
        let mut cannot_run = Vec::new();
        for (_, source, arch, failure) in failures {
            match failure {
                Failure::Rejected(r) => rejected.push(r),
                Failure::Tool(e) => cannot_run.push(format!("{source} for {arch}: {e:#}")),
            }
        }
        if cannot_run.is_empty() {
            return Err(anyhow::Error::new(CheckFailed(rejected_report(&rejected, total))).context(CompileFailed));
        }
        if !rejected.is_empty() {
            cannot_run.push(rejected_report(&rejected, total));
        }
        bail!("kernel compilation could not run:\n{}", cannot_run.join("\n\n"));
    }
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|(idx, ..)| *idx);
    Ok(done.into_iter().map(|(_, u, l, s)| (u, l, s)).collect())
}

fn compile(nvcc: &Nvcc, cuobjdump: &Path, job: &Job, timeout: Duration) -> Result<Compiled, Failure> {
    let stamp_path = job.output.with_extension("stamp.json");
    let unit = |cached, seconds| Unit {
        source: job.source.clone(),
        arch: job.arch.clone(),
        output: job.output.clone(),
        hash: job.hash.clone(),
        cached,
        seconds,
    };
    let stamp =
        fa_schema::file::read_bounded(&stamp_path, 1 << 20).ok().and_then(|b| serde_json::from_slice::<Stamp>(&b).ok());
    if let Some(stamp) = stamp
        && stamp.hash == job.hash
        && job.output.is_file()
        && let Some(sass) = stamp.sass
    {
        return Ok((unit(true, 0.0), stamp.ptxas, sass));
    }
    let tmp = job.output.with_extension("fatbin.tmp");
    let log = job.output.with_extension("log");
    let out = Cmd::new(&nvcc.path)
        .args(job.args.iter().cloned())
        .arg("-o")
        .arg(tmp.display().to_string())
        .arg(job.source_path.display().to_string())
        .timeout(timeout)
        .log(&log)
        .quiet()
        .run()?;
    let ptxas = format!("{}{}", out.stdout, out.stderr);
    if !out.success() {
        let name = format!("{} {}", job.source, job.arch);
        return Err(Failure::Rejected(Rejected::new(name, log, &out.status.to_string(), &ptxas)));
    }
    std::fs::rename(&tmp, &job.output).with_context(|| format!("moving {} into place", tmp.display()))?;
    let dump = Cmd::new(cuobjdump)
        .arg("-sass")
        .arg(job.output.display().to_string())
        .timeout(timeout)
        .log(job.output.with_extension("sass"))
        .quiet()
        .run_checked()?;
    let sass = sass::opcode_counts(&dump.stdout)
        .with_context(|| format!("in {}", job.output.with_extension("sass").display()))?;
    let stamp = Stamp { hash: job.hash.clone(), ptxas: ptxas.clone(), sass: Some(sass.clone()) };
    write_file(&stamp_path, serde_json::to_vec(&stamp).context("serialising a unit stamp")?)?;
    Ok((unit(false, out.elapsed.as_secs_f64()), ptxas, sass))
}

/// cuobjdump from the toolkit nvcc came from (the wheels ship it too).
fn cuobjdump_beside(nvcc: &Nvcc) -> Result<PathBuf> {
    let beside = nvcc.path.with_file_name(format!("cuobjdump{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() { Ok(beside) } else { toolchain::cuda_tool("cuobjdump") }
}

/// The `.cuh` and `.h` files under `dir` (sub-folders too, as the kernel-set
/// hash): path relative to it (`/` separated) and contents.
fn kernel_headers(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = Vec::new();
    kernel_set::source_files(dir, &mut files)?;
    files.retain(|p| p.extension().is_some_and(|x| x == "cuh" || x == "h"));
    files
        .into_iter()
        .map(|f| {
            let name = f.strip_prefix(dir).unwrap_or(&f).components().map(|c| c.as_os_str().to_string_lossy());
            let text = fa_schema::file::read(&f).with_context(|| format!("reading kernel header {}", f.display()))?;
            Ok((name.collect::<Vec<_>>().join("/"), text))
        })
        .collect()
}

/// What a unit's cache key takes of the headers: those its `#include`
/// closure reaches (`includes::closure`), or all of them where that closure
/// is unknown. A header outside it can change without rebuilding the unit.
fn headers_digest(unit: &[u8], headers: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let names: Vec<&String> = match includes::closure(unit, headers) {
        Some(reached) => headers.keys().filter(|n| reached.contains(*n)).collect(),
        None => headers.keys().collect(),
    };
    let mut h = Sha256::new();
    for name in names {
        for part in [name.as_bytes(), &headers[name]] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.finalize().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One row per entry and arch; the last column says whether its local memory
/// (spills, stack, LDL/STL) is allowed by the manifest or over budget.
fn resource_table(kernels: &[KernelResources], sass: &[SassRecord], manifest: &Manifest) -> String {
    let mut allowed_rows = 0;
    let rows = kernels
        .iter()
        .map(|k| {
            let budget = manifest.kernel(&k.name);
            let ops = sass.iter().find(|s| s.kernel == k.name && s.arch == k.arch).map(|s| &s.opcodes);
            let count = |op: &str| ops.and_then(|o| o.get(op)).copied().unwrap_or(0);
            let local_instructions = count("LDL") + count("STL");
            let local = match budget.map(|b| budget::local_memory(k, b, local_instructions)) {
                Some(LocalMemory::Allowed(switch)) => {
                    allowed_rows += 1;
                    format!("allowed ({switch})")
                }
                Some(LocalMemory::OverBudget) => "OVER BUDGET".into(),
                Some(LocalMemory::Unused) | None => String::new(),
            };
            vec![
                k.name.clone(),
                k.arch.clone(),
                match budget {
                    Some(b) => format!("{}/{}", k.registers, b.max_registers),
                    None => k.registers.to_string(),
                },
                k.smem_static.to_string(),
                budget.map_or(0, |b| b.dynamic_smem).to_string(),
                k.stack_frame.to_string(),
                k.spill_stores.to_string(),
                k.spill_loads.to_string(),
                k.barriers.to_string(),
                format!("{}/{}", count("HMMA"), count("HGMMA")),
                local_instructions.to_string(),
                local,
            ]
        })
        .collect::<Vec<_>>();
    let mut out = table::render(
        &[
            "kernel",
            "arch",
            "regs",
            "smem",
            "dyn smem",
            "stack",
            "spill st",
            "spill ld",
            "bars",
            "HMMA/HGMMA",
            "LDL+STL",
            "local memory",
        ],
        &rows,
    );
    if allowed_rows > 0 {
        out.push_str(&format!(
            "\n{allowed_rows} row(s) use local memory that the manifest allows for that entry on that arch \
             (README: Resource budgets says why)"
        ));
    }
    out
}

fn breach_table(breaches: &[Breach]) -> String {
    let rows = breaches
        .iter()
        .map(|b| {
            vec![
                b.kernel.clone(),
                b.arch.clone(),
                b.what.clone(),
                b.value.to_string(),
                b.budget.to_string(),
                b.hint.clone(),
            ]
        })
        .collect::<Vec<_>>();
    table::render(&["kernel", "arch", "breach", "value", "budget", "fix"], &rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn out_dirs_that_would_overwrite_the_checkout_or_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (root, src) = (dir.path().join("repo"), dir.path().join("repo/kernels"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(root.join("README.md"), "x").unwrap();
        for (out, why) in [
            (dir.path().to_path_buf(), "above it"),
            (root.clone(), "above it"),
            (src.clone(), "kernel sources"),
            (src.join("out"), "kernel sources"),
        ] {
            let err = check_out_dir(&out, &root, &src).unwrap_err();
            assert!(err.contains(why), "{}: {err}", out.display());
        }
        let docs = root.join("docs");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(docs.join("a.md"), "x").unwrap();
        assert!(check_out_dir(&docs, &root, &src).unwrap_err().contains("no kernel set"));
        let set = root.join("target/kernels");
        assert_eq!(check_out_dir(&set, &root, &src), Ok(()), "a new folder");
        std::fs::create_dir_all(&set).unwrap();
        std::fs::write(set.join(".build.lock"), "").unwrap();
        std::fs::write(set.join("k.sm_89.fatbin"), "").unwrap();
        assert_eq!(check_out_dir(&set, &root, &src), Ok(()), "a kernel set built before");
    }

    #[test]
    fn a_header_in_a_sub_folder_invalidates_the_unit_cache() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/h.cuh"), "a").unwrap();
        let digest = |unit: &[u8]| headers_digest(unit, &kernel_headers(dir.path()).unwrap());
        let units: [&[u8]; 2] = [b"#include \"sub/h.cuh\"\n", b"#include HEADER\n"];
        let before = units.map(digest);
        std::fs::write(dir.path().join("sub/h.cuh"), "b").unwrap();
        for (unit, before) in units.into_iter().zip(before) {
            assert_ne!(digest(unit), before, "{}", String::from_utf8_lossy(unit));
        }
    }

    #[test]
    fn a_header_outside_a_units_includes_leaves_its_cache_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hopper.cuh"), "#include \"common.cuh\"\n").unwrap();
        std::fs::write(dir.path().join("common.cuh"), "a").unwrap();
        std::fs::write(dir.path().join("portable.cuh"), "a").unwrap();
        let digest = |unit: &[u8]| headers_digest(unit, &kernel_headers(dir.path()).unwrap());
        let (hopper, portable, unknown) =
            (b"#include \"hopper.cuh\"\n", b"#include \"portable.cuh\"\n", b"#include X\n");
        let before = [digest(hopper), digest(portable), digest(unknown)];
        std::fs::write(dir.path().join("common.cuh"), "b").unwrap();
        assert_ne!(digest(hopper), before[0], "through hopper.cuh");
        assert_eq!(digest(portable), before[1], "portable.cuh does not include it");
        assert_ne!(digest(unknown), before[2], "an unknown closure takes every header");
    }

    #[test]
    fn a_source_behind_a_symlink_out_of_the_kernel_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("kernels");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(dir.path().join("outside.cu"), "x").unwrap();
        std::fs::write(src.join("in.cu"), "x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.cu"), src.join("link.cu")).unwrap();
        assert!(inside(&src.join("in.cu"), &src).is_ok());
        assert!(inside(&src.join("link.cu"), &src).unwrap_err().contains("outside"));
    }

    use super::*;

    /// Compiles planted breaches with the real nvcc (installing the wheels into the
    /// workspace's target/cuda if no toolkit is found) and expects the budget table.
    /// Run under `dir`, with the workspace's CUDA wheels.
    fn paths_in(dir: &Path) -> Run {
        let target = dir.join("target");
        Run { root: dir.to_path_buf(), kernels: target.join("kernels"), target, ..Run::discover().unwrap() }
    }

    /// A kernel folder under `dir` with these sources and a manifest building
    /// them; returns the manifest's path.
    fn planted(dir: &Path, sources: &[(&str, &str)], manifest_sources: &str) -> PathBuf {
        let kernels = dir.join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        for (name, text) in sources {
            std::fs::write(kernels.join(name), text).unwrap();
        }
        let manifest = kernels.join("manifest.json");
        std::fs::write(
            &manifest,
            format!(
                r#"{{"static_smem_limit": 49152,
                    "archs": {{"sm_89": {{"gencode": "arch=compute_89,code=sm_89", "smem_optin_limit": 101376}},
                              "sm_90": {{"gencode": "arch=compute_90,code=sm_90", "smem_optin_limit": 232448}}}},
                    "sources": {manifest_sources}}}"#
            ),
        )
        .unwrap();
        manifest
    }

    const GOOD: &str = r#"extern "C" __global__ void good(float* y) { y[threadIdx.x] = 1.f; }"#;
    const GOOD_SOURCES: &str =
        r#"[{"file": "good.cu", "archs": ["sm_89"], "kernels": [{"entry": "good", "max_registers": 255}]}]"#;

    /// What `--define 'STEPS=('` does to a kernel that uses STEPS: every unit of
    /// the source fails, each with several errors; the message shows the first
    /// error once, each unit with its log, and the build is a failed check (exit 1).
    #[test]
    fn rejected_units_show_their_first_error_and_log_and_fail_the_check() {
        const BAD: &str = r#"
extern "C" __global__ void bad(float* y) {
  float acc = 0.f;
  for (int i = 0; i < STEPS; ++i) acc += y[i];
  y[threadIdx.x] = acc * STEPS;
}
"#;
        let dir = tempfile::tempdir().unwrap();
        let manifest = planted(
            dir.path(),
            &[("good.cu", GOOD), ("bad.cu", BAD)],
            r#"[{"file": "good.cu", "archs": ["sm_89"], "kernels": [{"entry": "good", "max_registers": 255}]},
                {"file": "bad.cu", "archs": ["sm_89", "sm_90"], "kernels": [{"entry": "bad", "max_registers": 255}]}]"#,
        );
        let cx = paths_in(dir.path());
        let opts = Options {
            manifest: Some(manifest),
            defines: vec!["STEPS=(".into()],
            ..Options::new(Duration::from_secs(300), 2)
        };
        let err = run(&cx, &opts).unwrap_err();
        let failed = err.downcast_ref::<CheckFailed>().unwrap_or_else(|| panic!("not a failed check: {err:#}"));
        assert!(!over_budget(&err));
        let msg = &failed.0;
        assert!(msg.starts_with("2 of 3 kernel unit(s) failed to compile"), "{msg}");
        let first = format!("{}(4): error: expected an expression", dir.path().join("kernels/bad.cu").display());
        assert_eq!(msg.lines().filter(|l| *l == first).count(), 1, "{msg}");
        for arch in ["sm_89", "sm_90"] {
            let log = cx.kernels.clone().join(format!("bad.{arch}.log"));
            assert!(msg.contains(&format!("  in bad.cu {arch} (first of ")), "{msg}");
            assert!(msg.contains(&log.display().to_string()), "{msg}");
            assert!(std::fs::read_to_string(&log).unwrap().contains(&first));
        }
        assert!(!cx.report("build").exists());
    }

    /// The portable kernel's tile rule: a split launch stages kBlockM rows of fp32 O
    /// in the group's K and V tiles, so 8 warps (128 rows) on 32-key tiles, which
    /// tune sweeps and which once overran shared memory on the GPU, do not compile.
    #[test]
    fn tiles_too_small_for_the_split_epilogue_do_not_compile() {
        let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/portable_layout.cuh");
        let source = format!(
            "#include \"{}\"\nextern \"C\" __global__ void cfg(int* y) {{ y[0] = fa::FwdConfig<64, 1>::kSmemBytes; }}\n",
            header.display()
        );
        let sources =
            r#"[{"file": "cfg.cu", "archs": ["sm_89"], "kernels": [{"entry": "cfg", "max_registers": 255}]}]"#;
        let build = |warps: u32, keys: u32| {
            let dir = tempfile::tempdir().unwrap();
            let manifest = planted(dir.path(), &[("cfg.cu", &source)], sources);
            let opts = Options {
                manifest: Some(manifest),
                defines: vec![format!("FA_WARPS_D64={warps}"), format!("FA_BLOCK_N_D64={keys}")],
                ..Options::new(Duration::from_secs(300), 2)
            };
            run(&paths_in(dir.path()), &opts).map_err(|e| format!("{e:#}"))
        };
        build(4, 64).expect("the shipped tiles compile");
        let err = build(8, 32).unwrap_err();
        assert!(err.contains("the split epilogue's fp32 O fits the group's tiles"), "{err}");
    }

    #[test]
    fn grouped_report_and_a_failure_without_an_error_line() {
        let log = |n: &str| PathBuf::from(format!("/k/{n}.log"));
        let bad = "k.cu(4): error: expected an expression\n    x = (;\n        ^\n\nk.cu(9): error: y\n";
        let rejected = [
            Rejected::new("k.cu sm_89".into(), log("k.sm_89"), "exit status: 1", bad),
            Rejected::new("k.cu sm_90".into(), log("k.sm_90"), "exit status: 1", bad),
            Rejected::new("j.cu sm_89".into(), log("j.sm_89"), "signal: 9 (SIGKILL)", "compiling j.cu\n\n\n"),
        ];
        assert_eq!(
            rejected_report(&rejected, 5),
            "3 of 5 kernel unit(s) failed to compile; the first error of each, then the units and their full logs:
k.cu(4): error: expected an expression
    x = (;
        ^
  in k.cu sm_89 (first of 2 errors): /k/k.sm_89.log
  in k.cu sm_90 (first of 2 errors): /k/k.sm_90.log
nvcc failed (signal: 9 (SIGKILL)) without an error line; its last lines:
  compiling j.cu
  in j.cu sm_89: /k/j.sm_89.log"
        );
    }

    /// A gencode that embeds PTX beside the SASS (`code=[sm_80,compute_80]`, which
    /// newer GPUs JIT-compile): ptxas reports the SASS once under the arch's key,
    /// cuobjdump -sass reads only the SASS, the budgets hold, and the PTX ships.
    #[test]
    fn a_gencode_that_embeds_ptx_is_budgeted_by_its_sass() {
        let dir = tempfile::tempdir().unwrap();
        let kernels = dir.path().join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        std::fs::write(kernels.join("good.cu"), GOOD).unwrap();
        let manifest = kernels.join("manifest.json");
        std::fs::write(
            &manifest,
            r#"{"static_smem_limit": 49152,
                "archs": {"sm_80": {"gencode": "arch=compute_80,code=[sm_80,compute_80]", "smem_optin_limit": 166912}},
                "sources": [{"file": "good.cu", "archs": ["sm_80"], "kernels": [{"entry": "good", "max_registers": 255}]}]}"#,
        )
        .unwrap();
        let cx = paths_in(dir.path());
        run(&cx, &Options { manifest: Some(manifest), ..Options::new(Duration::from_secs(300), 1) }).unwrap();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cx.report("build")).unwrap()).unwrap();
        let payload = &report["payload"];
        let rows = |key: &str, name: &str| -> Vec<(String, String)> {
            let row = |r: &serde_json::Value| (r[name].as_str().unwrap().into(), r["arch"].as_str().unwrap().into());
            payload[key].as_array().unwrap().iter().map(row).collect()
        };
        assert_eq!(rows("kernels", "name"), [("good".to_string(), "sm_80".to_string())]);
        assert_eq!(rows("sass", "kernel"), [("good".to_string(), "sm_80".to_string())]);
        assert_eq!(payload["breaches"], serde_json::json!([]));
        let fatbin = cx.kernels.join("good.sm_80.fatbin");
        let cuobjdump = cuobjdump_beside(&toolchain::nvcc(&cx.cuda_wheels).unwrap()).unwrap();
        let listed = Cmd::new(&cuobjdump).arg("-lptx").arg(fatbin.display().to_string()).quiet().run_checked().unwrap();
        assert!(listed.stdout.contains("good.sm_80.ptx"), "{}", listed.stdout);
    }

    #[test]
    fn zero_jobs_is_refused_before_anything_is_built() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = planted(dir.path(), &[("good.cu", GOOD)], GOOD_SOURCES);
        let cx = paths_in(dir.path());
        let opts = Options { manifest: Some(manifest), ..Options::new(Duration::from_secs(300), 0) };
        let err = run(&cx, &opts).unwrap_err();
        assert!(err.downcast_ref::<CannotRun>().is_some_and(|e| e.0.contains("-j/--jobs 0")), "{err:#}");
        assert!(!cx.kernels.clone().exists() && !cx.report("build").exists());
    }

    #[test]
    fn nothing_to_build_is_refused_and_keeps_the_last_report() {
        let dir = tempfile::tempdir().unwrap();
        let cx = paths_in(dir.path());
        write_file(&cx.report("build"), "the last build").unwrap();
        let empty = planted(dir.path(), &[], "[]");
        let err =
            run(&cx, &Options { manifest: Some(empty), ..Options::new(Duration::from_secs(300), 1) }).unwrap_err();
        assert!(err.downcast_ref::<CannotRun>().is_some_and(|e| e.0.contains("\"sources\" is empty")), "{err:#}");
        let manifest = planted(dir.path(), &[("good.cu", GOOD)], GOOD_SOURCES);
        let opts = Options {
            manifest: Some(manifest),
            archs: Some(vec!["sm_90".into()]),
            ..Options::new(Duration::from_secs(300), 1)
        };
        let err = run(&cx, &opts).unwrap_err();
        assert!(err.downcast_ref::<CannotRun>().is_some_and(|e| e.0.contains("no source lists sm_90")), "{err:#}");
        assert_eq!(std::fs::read_to_string(cx.report("build")).unwrap(), "the last build");
        assert!(!cx.kernels.clone().exists());
    }

    /// A committed script stands in for nvcc: a diagnostic, 30 blank lines, then a hang.
    #[test]
    fn a_hung_nvcc_reports_its_last_non_empty_lines() {
        let dir = tempfile::tempdir().unwrap();
        let nvcc = Nvcc {
            path: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/build/hung-nvcc.sh"),
            origin: toolchain::Origin::NvccEnv,
            version: "hung".into(),
        };
        let job = Job {
            source: "kernel.cu".into(),
            source_path: dir.path().join("kernel.cu"),
            arch: "sm_89".into(),
            args: Vec::new(),
            hash: "h".into(),
            output: dir.path().join("kernel.sm_89.fatbin"),
        };
        let Err(Failure::Tool(err)) = compile(&nvcc, Path::new("cuobjdump"), &job, Duration::from_secs(1)) else {
            panic!("a hung nvcc is a tool failure");
        };
        let msg = format!("{err:#}");
        let (_, last) = msg.split_once("last output:\n").unwrap_or_else(|| panic!("{msg}"));
        assert_eq!(
            last,
            "kernel.cu(3): warning #177-D: variable \"unused\" was declared but never referenced\n\
             still compiling kernel.cu"
        );
    }

    #[test]
    fn resource_table_marks_local_memory_the_manifest_allows() {
        let manifest = Manifest::parse(
            r#"{"static_smem_limit": 49152,
            "archs": {"sm_89": {"gencode": "arch=compute_89,code=sm_89", "smem_optin_limit": 101376},
                      "sm_90": {"gencode": "arch=compute_90,code=sm_90", "smem_optin_limit": 232448},
                      "sm_90a": {"gencode": "arch=compute_90a,code=sm_90a", "smem_optin_limit": 232448}},
            "sources": [{"file": "f.cu", "archs": ["sm_89", "sm_90", "sm_90a"], "kernels": [
                {"entry": "tiles", "max_registers": 32, "dynamic_smem": 1024},
                {"entry": "spilly", "max_registers": 64, "local_memory_on": ["sm_90", "sm_90a"]}]}]}"#,
        )
        .unwrap();
        let kernels = ptxas::parse(include_str!("../../tests/data/ptxas-verbose-sm89-sm90-sm90a.txt")).kernels;
        let table = resource_table(&kernels, &[], &manifest);
        let last_cell = |name: &str, arch: &str| {
            let row = table.lines().find(|l| l.split_whitespace().take(2).eq([name, arch])).unwrap();
            row.rsplit("  ").find(|c| !c.is_empty()).unwrap().trim().to_string()
        };
        assert_eq!(last_cell("spilly", "sm_89"), "OVER BUDGET", "{table}");
        assert_eq!(last_cell("spilly", "sm_90"), "allowed (local_memory_on)", "{table}");
        assert_eq!(last_cell("spilly", "sm_90a"), "allowed (local_memory_on)", "{table}");
        // No local memory, nothing marked: the last cell is the LDL+STL count.
        assert_eq!(last_cell("tiles", "sm_89"), "0", "{table}");
        assert!(table.ends_with("\n2 row(s) use local memory that the manifest allows for that entry on that arch (README: Resource budgets says why)"), "{table}");
    }

    #[test]
    fn forty_concurrent_builds_into_one_target_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let cx = paths_in(dir.path());
        let manifest = planted(dir.path(), &[("good.cu", GOOD)], GOOD_SOURCES);
        let opts = Options { manifest: Some(manifest), ..Options::new(Duration::from_secs(300), 1) };
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..40).map(|_| s.spawn(|| run(&cx, &opts))).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let failed: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|e| format!("{e:#}")).collect();
        assert!(failed.is_empty(), "{} of 40 failed: {:?}", failed.len(), failed.first());
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cx.report("build")).unwrap()).unwrap();
        assert_eq!(report["payload"]["units"][0]["source"], "good.cu");
        let leftovers: Vec<_> = std::fs::read_dir(cx.reports())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn planted_spill_and_smem_breaches_fail_the_build() {
        let dir = tempfile::tempdir().unwrap();
        let cx = paths_in(dir.path());
        let manifest = planted(
            dir.path(),
            &[("planted.cu", PLANTED)],
            r#"[{"file": "planted.cu", "archs": ["sm_89"], "kernels": [
                {"entry": "spills", "max_registers": 255},
                {"entry": "big_smem", "max_registers": 255, "dynamic_smem": 65536}]}]"#,
        );
        let opts = Options { manifest: Some(manifest), ..Options::new(Duration::from_secs(300), 1) };
        let err = run(&cx, &opts).unwrap_err();
        assert!(over_budget(&err), "{err:#}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cx.report("build")).unwrap()).unwrap();
        let breaches: Vec<(String, String)> = report["payload"]["breaches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["kernel"].as_str().unwrap().to_string(), b["what"].as_str().unwrap().to_string()))
            .collect();
        assert!(breaches.contains(&("spills".into(), "spill bytes".into())), "{breaches:?}");
        assert!(breaches.contains(&("big_smem".into(), "static+dynamic smem bytes".into())), "{breaches:?}");
        // A second run hits the cache and still fails the same way.
        assert!(run(&cx, &opts).unwrap_err().downcast_ref::<CheckFailed>().is_some());
    }

    const PLANTED: &str = r#"
// 64 live accumulators under a 32-register cap (1024 threads, 2 blocks/SM): ptxas spills.
extern "C" __global__ void __launch_bounds__(1024, 2) spills(const float* x, float* y, int n) {
  float acc[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = x[threadIdx.x * 64 + i];
  for (int it = 0; it < n; ++it) {
    #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + 1) % 64] + x[it];
  }
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i];
  y[threadIdx.x] = s;
}
// 48 KB static plus the manifest's 64 KB dynamic exceeds sm_89's 99 KB opt-in limit.
extern "C" __global__ void big_smem(float* y) {
  __shared__ float tile[12288];
  extern __shared__ float dyn[];
  tile[threadIdx.x] = threadIdx.x;
  dyn[threadIdx.x] = 1.f;
  __syncthreads();
  y[threadIdx.x] = tile[(threadIdx.x * 7) % 12288] + dyn[threadIdx.x];
}
"#;
}
