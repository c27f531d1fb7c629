//! The project's rules for `.github/workflows`, on top of actionlint and zizmor:
//! code reaches the self-hosted GPU runner only through the paths ci/README.md
//! describes, and the runner's jobs hold nothing that writes and share no state.
//! Pure functions of the workflow files' text, parsed as YAML.

use anyhow::{Context, Result, bail};
use yaml_rust2::{Yaml, YamlLoader};

/// Triggers that may start a self-hosted job: a push (only people with write access
/// push to this repository) and a manual dispatch (the same people, with the
/// workflow file taken from the ref they pick, hence [`DEFAULT_BRANCH_GUARD`]).
const RUNNER_TRIGGERS: &[&str] = &["push", "workflow_dispatch"];

/// The `if:` conjunct that makes a dispatched job run only from the default
/// branch's copy of its workflow file.
pub const DEFAULT_BRANCH_GUARD: &str = "github.ref == format('refs/heads/{0}', github.event.repository.default_branch)";

/// Per-job state every self-hosted job moves into its workspace.
const JOB_STATE_VARS: &[&str] = &["CARGO_HOME", "RUSTUP_HOME", "PIP_CACHE_DIR", "npm_config_cache"];

/// The workflow whose concurrency groups no other workflow may use.
const RELEASE_WORKFLOW: &str = "release.yml";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The workflow file, as given.
    pub file: String,
    /// The job, where the rule is about one.
    pub job: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.job {
            Some(job) => write!(f, "{}: job `{job}`: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// Every rule over a set of workflow files, given as (file name, text). An error
/// means a file could not be read as a workflow at all.
pub fn check_all(files: &[(String, String)]) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (file, text) in files {
        let doc = parse(text).with_context(|| format!("reading {file} as a workflow"))?;
        out.extend(check_workflow(file, &doc));
        groups.push((file.clone(), concurrency_groups(&doc)));
    }
    let release: Vec<&String> =
        groups.iter().filter(|(f, _)| base_name(f) == RELEASE_WORKFLOW).flat_map(|(_, g)| g).collect();
    for (file, used) in groups.iter().filter(|(f, _)| base_name(f) != RELEASE_WORKFLOW) {
        for group in used.iter().filter(|g| release.contains(g)) {
            out.push(Violation {
                file: file.clone(),
                job: None,
                message: format!(
                    "concurrency group `{group}` is also the release's: a job here could cancel or \
                     hold up a release; give it a group of its own"
                ),
            });
        }
    }
    Ok(out)
}

fn base_name(file: &str) -> &str {
    file.rsplit(['/', '\\']).next().unwrap_or(file)
}

fn parse(text: &str) -> Result<Yaml> {
    let mut docs = YamlLoader::load_from_str(text).context("invalid YAML")?;
    if docs.len() != 1 {
        bail!("expected one YAML document, found {}", docs.len());
    }
    let doc = docs.remove(0);
    if doc.as_hash().is_none() {
        bail!("the workflow is not a mapping");
    }
    if doc["jobs"].as_hash().is_none() {
        bail!("no `jobs:` mapping");
    }
    Ok(doc)
}

/// The events that start a workflow: `on:` as a string, a list or a mapping.
fn triggers(doc: &Yaml) -> Vec<String> {
    match &doc["on"] {
        Yaml::String(s) => vec![s.clone()],
        Yaml::Array(a) => a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
        Yaml::Hash(h) => h.keys().filter_map(|t| t.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// Whether a job may land on a self-hosted runner. A `runs-on` that names
/// `self-hosted`, picks a runner group, or is computed by an expression counts:
/// what cannot be shown to be GitHub-hosted is treated as the GPU runner.
fn self_hosted(job: &Yaml) -> bool {
    let label = |l: &Yaml| l.as_str().is_none_or(|s| s == "self-hosted" || s.contains("${{"));
    match &job["runs-on"] {
        Yaml::String(s) => label(&Yaml::String(s.clone())),
        Yaml::Array(a) => a.iter().any(label),
        Yaml::Hash(_) => true,
        _ => false,
    }
}

fn check_workflow(file: &str, doc: &Yaml) -> Vec<Violation> {
    let mut out = Vec::new();
    let triggers = triggers(doc);
    let Some(jobs) = doc["jobs"].as_hash() else { return out };
    for (name, job) in jobs {
        let name = name.as_str().unwrap_or("?").to_string();
        for step in job["steps"].as_vec().into_iter().flatten() {
            for command in step["run"].as_str().map(unlocked_cargo).unwrap_or_default() {
                out.push(Violation {
                    file: file.to_string(),
                    job: Some(name.clone()),
                    message: format!("`{command}` without --locked: CI builds from Cargo.lock as committed"),
                });
            }
        }
        if !self_hosted(job) {
            continue;
        }
        let mut violation =
            |message: String| out.push(Violation { file: file.to_string(), job: Some(name.clone()), message });
        for t in triggers.iter().filter(|t| !RUNNER_TRIGGERS.contains(&t.as_str())) {
            violation(format!(
                "runs on a self-hosted runner but the workflow is triggered by `{t}`; the runner takes \
                 only pushes to this repository and maintainers' dispatches from the default branch \
                 (pull requests from forks: gpu-approved.yml)"
            ));
        }
        if triggers.iter().any(|t| t == "workflow_dispatch") && !guarded(&job["if"]) {
            violation(format!(
                "a dispatched self-hosted job needs `if: {DEFAULT_BRANCH_GUARD} && …` (no top-level ||), \
                 so that only the default branch's copy of this file reaches the runner"
            ));
        }
        let permissions = if job["permissions"].is_badvalue() { &doc["permissions"] } else { &job["permissions"] };
        match permissions {
            Yaml::Hash(h) => {
                for (scope, level) in h {
                    if level.as_str() != Some("read") && level.as_str() != Some("none") {
                        violation(format!(
                            "permission `{}: {}` on a self-hosted job; the runner gets a read-only token",
                            scope.as_str().unwrap_or("?"),
                            level.as_str().unwrap_or("?")
                        ));
                    }
                }
            }
            _ => violation(
                "no `permissions:` mapping for a self-hosted job; give it `contents: read` and nothing that writes"
                    .into(),
            ),
        }
        if strings(job).any(|s| s.contains("secrets.")) {
            violation("uses secrets; nothing secret may reach the self-hosted runner".into());
        }
        for step in job["steps"].as_vec().into_iter().flatten() {
            let checkout = step["uses"].as_str().is_some_and(|u| u.starts_with("actions/checkout@"));
            if checkout && step["with"]["persist-credentials"].as_bool() != Some(false) {
                violation("checks out without `persist-credentials: false`".into());
            }
        }
        for var in JOB_STATE_VARS {
            let value = job["env"][*var].as_str().unwrap_or("");
            if !value.starts_with("${{ github.workspace }}/") {
                violation(format!(
                    "`env: {var}` must lie under `${{{{ github.workspace }}}}/` (per-job state, removed after \
                     the job), not {}",
                    if value.is_empty() { "be absent" } else { value }
                ));
            }
        }
    }
    out
}

/// The lines of a shell script that run cargo (other than `--version`) without
/// `--locked`.
pub fn unlocked_cargo(script: &str) -> Vec<String> {
    script
        .lines()
        .map(str::trim)
        .filter(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.first() == Some(&"cargo") && words.get(1) != Some(&"--version") && !words.contains(&"--locked")
        })
        .map(str::to_string)
        .collect()
}

/// Whether an `if:` is a conjunction, at its top level, of which one term is
/// [`DEFAULT_BRANCH_GUARD`]. A top-level `||` could bypass the guard.
fn guarded(cond: &Yaml) -> bool {
    let Some(text) = cond.as_str() else { return false };
    let text = text.trim();
    let text = text.strip_prefix("${{").and_then(|t| t.strip_suffix("}}")).unwrap_or(text);
    let Some(terms) = top_level_terms(text) else { return false };
    terms.iter().any(|t| t.trim() == DEFAULT_BRANCH_GUARD)
}

/// `a && (b || c) && 'x||y'` → `[a, (b || c), 'x||y']`; None where a `||` sits at
/// the top level or the parentheses or quotes do not balance.
fn top_level_terms(expr: &str) -> Option<Vec<&str>> {
    let bytes = expr.as_bytes();
    let (mut depth, mut quoted, mut start, mut i) = (0i32, false, 0, 0);
    let mut terms = Vec::new();
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted => depth -= 1,
            b'|' if !quoted && depth == 0 && bytes.get(i + 1) == Some(&b'|') => return None,
            b'&' if !quoted && depth == 0 && bytes.get(i + 1) == Some(&b'&') => {
                terms.push(&expr[start..i]);
                start = i + 2;
                i += 1;
            }
            _ => {}
        }
        if depth < 0 {
            return None;
        }
        i += 1;
    }
    if quoted || depth != 0 {
        return None;
    }
    terms.push(&expr[start..]);
    Some(terms)
}

/// Every string scalar under a node, keys included.
fn strings(node: &Yaml) -> Box<dyn Iterator<Item = &str> + '_> {
    match node {
        Yaml::String(s) => Box::new(std::iter::once(s.as_str())),
        Yaml::Array(a) => Box::new(a.iter().flat_map(strings)),
        Yaml::Hash(h) => Box::new(h.iter().flat_map(|(k, v)| strings(k).chain(strings(v)))),
        _ => Box::new(std::iter::empty()),
    }
}

/// The concurrency groups a workflow names, at the workflow and the job level.
fn concurrency_groups(doc: &Yaml) -> Vec<String> {
    let group = |c: &Yaml| match c {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Hash(_) => c["group"].as_str().map(str::to_string),
        _ => None,
    };
    let jobs = doc["jobs"].as_hash().into_iter().flat_map(|h| h.values());
    std::iter::once(&doc["concurrency"]).chain(jobs.map(|j| &j["concurrency"])).filter_map(group).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflows() -> Vec<(String, String)> {
        [
            ("ci.yml", include_str!("../../../.github/workflows/ci.yml")),
            ("gpu.yml", include_str!("../../../.github/workflows/gpu.yml")),
            ("gpu-approved.yml", include_str!("../../../.github/workflows/gpu-approved.yml")),
            ("release.yml", include_str!("../../../.github/workflows/release.yml")),
        ]
        .into_iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
    }

    #[test]
    fn the_committed_workflows_pass() {
        let v = check_all(&workflows()).unwrap();
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn every_committed_workflow_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.github/workflows");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = workflows().into_iter().map(|(f, _)| f).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "add the new workflow to workflows() above");
    }

    /// gpu.yml and release.yml as they were when issue 24 was filed: pull requests
    /// reached the runner through a pull_request workflow (its file from the pull
    /// request itself), with state shared between jobs and a group shared with the release.
    #[test]
    fn the_workflows_of_issue_24_fail() {
        let old = vec![
            ("gpu.yml".to_string(), include_str!("../../tests/data/ci/gpu-before-issue-24.yml").to_string()),
            ("release.yml".to_string(), include_str!("../../tests/data/ci/release-before-issue-24.yml").to_string()),
        ];
        let v = check_all(&old).unwrap();
        let gpu: Vec<&str> = v.iter().filter(|v| v.file == "gpu.yml").map(|v| v.message.as_str()).collect();
        assert!(gpu.iter().any(|m| m.contains("triggered by `pull_request`")), "{v:#?}");
        assert!(gpu.iter().any(|m| m.contains("env: CARGO_HOME")), "{v:#?}");
        assert!(gpu.iter().any(|m| m.contains("`gpu-l4-runner` is also the release's")), "{v:#?}");
        // release.yml ran on tag pushes with a condition that is always true; a push
        // trigger is allowed, so what fails there is the shared state.
        assert!(v.iter().any(|v| v.file == "release.yml" && v.message.contains("RUSTUP_HOME")), "{v:#?}");
    }

    fn one(text: &str) -> Vec<String> {
        check_all(&[("w.yml".into(), text.into())]).unwrap().into_iter().map(|v| v.message).collect()
    }

    const ENV: &str = "    permissions: {contents: read}\n    env:\n      CARGO_HOME: ${{ github.workspace }}/t/c\n      \
        RUSTUP_HOME: ${{ github.workspace }}/t/r\n      PIP_CACHE_DIR: ${{ github.workspace }}/t/p\n      \
        npm_config_cache: ${{ github.workspace }}/t/n\n    steps: []\n";

    #[test]
    fn dispatch_needs_the_default_branch_guard_without_a_top_level_or() {
        let job = |cond: &str| {
            format!("on: workflow_dispatch\njobs:\n  g:\n    runs-on: [self-hosted, gpu]\n    if: {cond}\n{ENV}")
        };
        assert!(one(&job(DEFAULT_BRANCH_GUARD)).is_empty());
        assert!(one(&job(&format!("${{{{ {DEFAULT_BRANCH_GUARD} && !github.event.repository.fork }}}}"))).is_empty());
        assert!(one(&job(&format!("(a || b) && {DEFAULT_BRANCH_GUARD}"))).is_empty());
        for bad in [format!("{DEFAULT_BRANCH_GUARD} || github.actor == 'x'"), "true".into(), "'a && b'".into()] {
            let v = one(&job(&bad));
            assert_eq!(v.len(), 1, "{bad}: {v:?}");
            assert!(v[0].contains("default branch's copy"), "{v:?}");
        }
    }

    #[test]
    fn pull_request_triggers_and_write_tokens_never_reach_a_self_hosted_job() {
        let v = one(&format!(
            "on: {{pull_request: {{types: [labeled]}}, pull_request_target: null}}\njobs:\n  g:\n    \
             runs-on: self-hosted\n{}",
            ENV.replace("{contents: read}", "{contents: write}")
        ));
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].contains("`pull_request`") && v[1].contains("`pull_request_target`"), "{v:?}");
        assert!(v[2].contains("`contents: write`"), "{v:?}");
        // The same workflow on a GitHub-hosted runner is none of these rules' business.
        let hosted =
            "on: pull_request\npermissions: write-all\njobs:\n  g:\n    runs-on: ubuntu-latest\n    steps: []\n";
        assert!(one(hosted).is_empty());
    }

    #[test]
    fn runner_groups_and_computed_labels_count_as_self_hosted() {
        for runs_on in ["{group: gpus}", "${{ inputs.runner }}", "[linux, '${{ matrix.r }}']"] {
            let v = one(&format!("on: pull_request\njobs:\n  g:\n    runs-on: {runs_on}\n{ENV}"));
            assert_eq!(v.len(), 1, "{runs_on}: {v:?}");
        }
    }

    #[test]
    fn secrets_and_persisted_credentials_are_violations() {
        let text = format!("on: push\njobs:\n  g:\n    runs-on: [self-hosted]\n{ENV}")
            .replace("steps: []", "steps:\n      - uses: actions/checkout@abc\n      - run: echo ${{ secrets.T }}");
        let v = one(&text);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|m| m.contains("uses secrets")) && v.iter().any(|m| m.contains("persist-credentials")));
    }

    #[test]
    fn cargo_runs_locked_in_workflows_and_in_ci_run() {
        assert!(unlocked_cargo(include_str!("../../../.ci/run")).is_empty());
        assert_eq!(
            unlocked_cargo("set -e\ncargo --version\n  cargo xtask ci --gpu\ncargo --locked test\necho cargo\n"),
            ["cargo xtask ci --gpu"]
        );
        let v = one("on: push\njobs:\n  g:\n    runs-on: ubuntu-latest\n    steps:\n      - run: cargo xtask ci\n");
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("without --locked"), "{v:?}");
    }

    #[test]
    fn not_a_workflow_is_an_error() {
        for text in ["", "a: [", "- 1\n- 2\n", "on: push\n", "on: push\n---\njobs: {}\n"] {
            assert!(check_all(&[("w.yml".into(), text.into())]).is_err(), "{text:?}");
        }
    }

    #[test]
    fn yaml_1_2_keeps_on_a_string_key() {
        assert_eq!(
            triggers(&parse("on: [push, workflow_dispatch]\njobs: {}\n").unwrap()),
            ["push", "workflow_dispatch"]
        );
    }
}
