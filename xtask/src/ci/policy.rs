//! The project's rules for `.github/workflows`, on top of actionlint and zizmor:
//! code reaches the self-hosted GPU runners only through the paths ci/README.md
//! describes, each job on a fresh ephemeral runner of its pool, holding nothing
//! that writes and keeping its state in its workspace; a release tags only the
//! commit its own verify job checked. Pure functions of the workflow files' text,
//! parsed as YAML.

use anyhow::{Context, Result, bail};
use yaml_rust2::{Yaml, YamlLoader};

/// Triggers that may start a self-hosted job: a push (only people with write access
/// push to this repository) and a manual dispatch (the same people, with the
/// workflow file taken from the ref they pick, hence [`DEFAULT_BRANCH_GUARD`]).
const RUNNER_TRIGGERS: &[&str] = &["push", "workflow_dispatch"];

/// The `if:` conjunct that makes a dispatched job run only from the default
/// branch's copy of its workflow file.
pub const DEFAULT_BRANCH_GUARD: &str = "github.ref == format('refs/heads/{0}', github.event.repository.default_branch)";

/// Per-job state every self-hosted job moves into [`JOB_STATE_DIR`].
const JOB_STATE_VARS: &[&str] = &["CARGO_HOME", "RUSTUP_HOME", "PIP_CACHE_DIR", "npm_config_cache"];

/// Where that state lives: under `target/`, which [`CLEANUP_RUN`] removes.
const JOB_STATE_DIR: &str = "${{ github.workspace }}/target/job/";

/// The last step of every self-hosted job, under `if: always()`.
const CLEANUP_RUN: &str = "rm -rf target";

/// The workflow that verifies a commit and tags it.
const RELEASE_WORKFLOW: &str = "release.yml";

/// Runner labels (compared in lower case, as GitHub does). Every self-hosted job
/// asks for a runner registered for one job; the release's from the release pool,
/// every other from the gate pool, and no runner is in both.
const EPHEMERAL_LABEL: &str = "ephemeral";
const RELEASE_POOL: &str = "release";
const GATE_POOL: &str = "gate";

/// Prefixes of GitHub-hosted image labels; any other `runs-on` may be self-hosted.
const HOSTED_IMAGES: &[&str] = &["ubuntu-", "windows-", "macos-"];

/// Branches that bots push (Dependabot's and Renovate's updates, the merge
/// queue's, Copilot's agent, pre-commit.ci, release-please, changesets, Mergify).
const BOT_BRANCHES: &[&str] = &[
    "dependabot/**",
    "gh-readonly-queue/**",
    "renovate/**",
    "copilot/**",
    "pre-commit-ci-update-config",
    "release-please--**",
    "changeset-release/**",
    "mergify/**",
];

/// Actions that keep a cache across runs and branches.
const CACHE_ACTIONS: &[&str] = &["actions/cache", "swatinem/rust-cache"];

/// The test the release's tag job applies to the version before tagging.
const VERSION_PATTERN: &str = r"^v[0-9]+\.[0-9]+\.[0-9]+$";

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
/// Files named `action.yml` (or `.yaml`) are local actions, which the workflows'
/// steps call as `./<their folder>`.
pub fn check_all(files: &[(String, String)]) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    let mut actions = Actions::new();
    for (file, text) in files {
        if let Some(key) = action_key(file) {
            let doc = YamlLoader::load_from_str(text)
                .ok()
                .and_then(|mut d| (d.len() == 1).then(|| d.remove(0)))
                .filter(|d| d.as_hash().is_some())
                .with_context(|| format!("reading {file} as an action: not one YAML mapping"))?;
            actions.insert(key, doc);
        }
    }
    let mut docs = Vec::new();
    for (file, text) in files.iter().filter(|(f, _)| action_key(f).is_none()) {
        let doc = parse(text).with_context(|| format!("reading {file} as a workflow"))?;
        out.extend(check_workflow(file, &doc, &actions));
        docs.push((file.as_str(), doc));
    }
    out.extend(check_concurrency(&docs));
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

/// A string or a list of strings (`needs:`, `branches-ignore:`, labels).
fn string_list(node: &Yaml) -> Vec<&str> {
    match node {
        Yaml::String(s) => vec![s.as_str()],
        Yaml::Array(a) => a.iter().filter_map(Yaml::as_str).collect(),
        _ => Vec::new(),
    }
}

fn hosted_image(label: &str) -> bool {
    let label = label.trim().to_lowercase();
    !label.contains("${{") && HOSTED_IMAGES.iter().any(|p| label.starts_with(p))
}

/// Whether a job may land on a self-hosted runner: a job that calls a reusable
/// workflow (whose jobs run anywhere), and any `runs-on` other than GitHub-hosted
/// image labels (labels are case-insensitive; a runner group or an expression
/// counts). What cannot be shown to be GitHub-hosted is treated as a GPU runner.
fn self_hosted(job: &Yaml) -> bool {
    if !job["uses"].is_badvalue() {
        return true;
    }
    match &job["runs-on"] {
        Yaml::String(s) => !hosted_image(s),
        Yaml::Array(a) => a.is_empty() || !a.iter().all(|l| l.as_str().is_some_and(hosted_image)),
        _ => true,
    }
}

/// The labels a self-hosted job asks for, in lower case; None where `runs-on` is
/// not a literal list (an expression, or no labels at all).
fn runner_labels(job: &Yaml) -> Option<Vec<String>> {
    let node = &job["runs-on"];
    let node = if node.as_hash().is_some() { &node["labels"] } else { node };
    let labels = string_list(node);
    let literal = match node {
        Yaml::String(_) => true,
        Yaml::Array(a) => a.len() == labels.len(),
        _ => false,
    };
    (literal && !labels.is_empty() && labels.iter().all(|l| !l.contains("${{")))
        .then(|| labels.iter().map(|l| l.trim().to_lowercase()).collect())
}

/// The jobs a job waits for.
fn needs(job: &Yaml) -> Vec<&str> {
    string_list(&job["needs"])
}

/// Whether a job's `if:` calls a status function other than success(), so that it
/// runs even when a job it needs failed or was skipped.
fn runs_after_failure(job: &Yaml) -> bool {
    let cond: String = job["if"].as_str().unwrap_or("").chars().filter(|c| !c.is_whitespace()).collect();
    let cond = cond.to_lowercase();
    ["always(", "failure(", "cancelled("].iter().any(|f| cond.contains(f))
}

/// The `if:` of a step or job without `${{ }}` around it, trimmed.
fn bare_condition(cond: &Yaml) -> Option<&str> {
    let text = cond.as_str()?.trim();
    Some(text.strip_prefix("${{").and_then(|t| t.strip_suffix("}}")).unwrap_or(text).trim())
}

fn checkouts(job: &Yaml) -> impl Iterator<Item = &Yaml> {
    steps(job).filter(|s| is_checkout(s))
}

fn is_checkout(step: &Yaml) -> bool {
    step["uses"].as_str().is_some_and(|u| u.trim().to_lowercase().starts_with("actions/checkout@"))
}

fn steps(job: &Yaml) -> impl Iterator<Item = &Yaml> {
    job["steps"].as_vec().into_iter().flatten()
}

/// Local actions, by the `uses:` that calls them (`./.github/actions/setup`).
type Actions = std::collections::HashMap<String, Yaml>;

/// `.github/actions/setup/action.yml` → `./.github/actions/setup`.
fn action_key(file: &str) -> Option<String> {
    let dir = file.strip_suffix("/action.yml").or_else(|| file.strip_suffix("/action.yaml"))?;
    Some(format!("./{}", dir.trim_start_matches("./")))
}

/// GitHub's own actions, whose effects are known (no cache, no environment
/// writes): the only remote actions a self-hosted job may call.
const KNOWN_ACTIONS: &[&str] = &["actions/checkout@", "actions/upload-artifact@", "actions/download-artifact@"];

/// A job's steps as the runner executes them: each local composite action's
/// steps follow the step that calls it, so every rule over steps sees them.
/// Returns the steps, and what the rules cannot see (a remote action other than
/// [`KNOWN_ACTIONS`], a JavaScript or container action) with whether a local
/// action named is missing.
fn run_steps<'a>(job: &'a Yaml, actions: &'a Actions) -> (Vec<&'a Yaml>, Vec<String>) {
    fn walk<'a>(
        steps: &'a [Yaml],
        actions: &'a Actions,
        depth: usize,
        out: &mut Vec<&'a Yaml>,
        unseen: &mut Vec<String>,
    ) {
        for step in steps {
            out.push(step);
            let Some(uses) = step["uses"].as_str().map(str::trim) else { continue };
            if !uses.starts_with("./") {
                if !KNOWN_ACTIONS.iter().any(|a| uses.to_lowercase().starts_with(a)) {
                    unseen.push(format!(
                        "calls `{uses}`, whose steps these rules cannot see; a self-hosted job calls only {} \
                         and local composite actions",
                        KNOWN_ACTIONS.iter().map(|a| a.trim_end_matches('@')).collect::<Vec<_>>().join(", ")
                    ));
                }
                continue;
            }
            let action = actions.get(uses.trim_end_matches('/'));
            match action.map(|a| (a["runs"]["using"].as_str(), a["runs"]["steps"].as_vec())) {
                None => unseen.push(format!("calls `{uses}`, but no {uses}/action.yml is in the repository")),
                Some((Some("composite"), Some(inner))) if depth < 8 => walk(inner, actions, depth + 1, out, unseen),
                Some((Some("composite"), _)) if depth >= 8 => {
                    unseen.push(format!("`{uses}` nests composite actions deeper than 8"))
                }
                Some(_) => unseen.push(format!(
                    "calls `{uses}`, a local action that is not a composite of steps (JavaScript or a \
                     container), whose effects these rules cannot see"
                )),
            }
        }
    }
    let (mut out, mut unseen) = (Vec::new(), Vec::new());
    walk(job["steps"].as_vec().map_or(&[], Vec::as_slice), actions, 0, &mut out, &mut unseen);
    (out, unseen)
}

/// Whether a job holds something that can write: a write permission on its token
/// (no `permissions:` at all means the repository's default), or a secret.
fn can_write(job: &Yaml, doc: &Yaml) -> bool {
    let permissions = if job["permissions"].is_badvalue() { &doc["permissions"] } else { &job["permissions"] };
    let token = match permissions {
        Yaml::String(s) => s.trim() != "read-all",
        Yaml::Hash(h) => h.values().any(|level| level.as_str() != Some("read") && level.as_str() != Some("none")),
        _ => true,
    };
    token || names_secrets(job)
}

/// Whether a job reads secrets: `secrets` as an identifier in any of its
/// expressions (`secrets.X`, `secrets['X']`, `toJSON(secrets)`), or a `secrets:`
/// passed to a reusable workflow.
fn names_secrets(job: &Yaml) -> bool {
    !job["secrets"].is_badvalue() || expressions(job).iter().any(|e| names_identifier(e, "secrets"))
}

fn check_workflow(file: &str, doc: &Yaml, actions: &Actions) -> Vec<Violation> {
    let mut out = Vec::new();
    let release = base_name(file) == RELEASE_WORKFLOW;
    let triggers = triggers(doc);
    let Some(jobs) = doc["jobs"].as_hash() else { return out };
    let mut any_self_hosted = false;
    for (name, job) in jobs {
        let name = name.as_str().unwrap_or("?");
        let mut violation = |message: String| out.push(finding(file, Some(name), message));
        let (run, unseen) = run_steps(job, actions);
        for missing in unseen.iter().filter(|u| u.contains("action.yml is in")) {
            violation(missing.clone());
        }
        for step in run {
            for command in step["run"].as_str().map(unlocked_cargo).unwrap_or_default() {
                violation(format!("`{command}` without --locked: CI builds from Cargo.lock as committed"));
            }
            let action = step["uses"].as_str().unwrap_or("").trim().to_lowercase();
            if CACHE_ACTIONS.iter().any(|c| action.starts_with(c)) || !step["with"]["cache"].is_badvalue() {
                violation(
                    "keeps a cache across runs: a cache one branch or pull request writes can be restored \
                     into a run on main or a release; build from pinned, hashed sources instead"
                        .into(),
                );
            }
        }
        if self_hosted(job) {
            any_self_hosted = true;
            out.extend(check_self_hosted(file, name, job, doc, &triggers, release, actions));
            if !release && triggers.iter().any(|t| t == "workflow_dispatch") {
                out.extend(check_approved(file, name, job, jobs));
            }
        }
    }
    if any_self_hosted && triggers.iter().any(|t| t == "push") && !skips_bot_branches(&doc["on"]["push"]) {
        out.push(finding(
            file,
            None,
            format!(
                "pushes to branches that bots push ({}) reach the self-hosted runner: list them in \
                 `on: push: branches-ignore:`",
                BOT_BRANCHES.join(", ")
            ),
        ));
    }
    if release {
        out.extend(check_release(file, doc));
    }
    out
}

fn finding(file: &str, job: Option<&str>, message: String) -> Violation {
    Violation { file: file.to_string(), job: job.map(str::to_string), message }
}

/// The rules for one job that may run on a self-hosted runner.
fn check_self_hosted(
    file: &str,
    name: &str,
    job: &Yaml,
    doc: &Yaml,
    triggers: &[String],
    release: bool,
    actions: &Actions,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut violation = |message: String| out.push(finding(file, Some(name), message));
    let (run, unseen) = run_steps(job, actions);
    for u in unseen.into_iter().filter(|u| !u.contains("action.yml is in")) {
        violation(u);
    }
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
            "no `permissions:` mapping for a self-hosted job; give it `contents: read` and nothing that writes".into(),
        ),
    }
    if names_secrets(job) || expressions(&doc["env"]).iter().any(|e| names_identifier(e, "secrets")) {
        violation("uses secrets; nothing secret may reach the self-hosted runner".into());
    }
    if !job["environment"].is_badvalue() {
        violation(
            "names an `environment:`; environments hold secrets and approvals for GitHub-hosted jobs, \
             and a self-hosted job takes none"
                .into(),
        );
    }
    if !job["uses"].is_badvalue() {
        violation(
            "calls a reusable workflow, whose jobs' runners, tokens and steps these rules cannot see; \
             write the job out in this file"
                .into(),
        );
        return out;
    }
    let (pool, other) = if release { (RELEASE_POOL, GATE_POOL) } else { (GATE_POOL, RELEASE_POOL) };
    match runner_labels(job) {
        None => violation(
            "`runs-on` must be a literal list of labels, so that the runner pool this job reaches \
             is visible here"
                .into(),
        ),
        Some(labels) => {
            if !labels.iter().any(|l| l == EPHEMERAL_LABEL) {
                violation(format!(
                    "`runs-on` lacks `{EPHEMERAL_LABEL}`: a self-hosted job runs only on a runner registered \
                     for that one job (ci/README.md), never where an earlier job could have left git hooks, \
                     Cargo config, tools on PATH or processes"
                ));
            }
            if !labels.iter().any(|l| l == pool) || labels.iter().any(|l| l == other) {
                violation(format!(
                    "`runs-on` must name the `{pool}` pool and not `{other}`: release runners take only the \
                     release's verify job, gate runners every other self-hosted job"
                ));
            }
        }
    }
    for checkout in run.iter().filter(|s| is_checkout(s)) {
        if checkout["with"]["persist-credentials"].as_bool() != Some(false) {
            violation("checks out without `persist-credentials: false`".into());
        }
    }
    for var in JOB_STATE_VARS {
        let value = job["env"][*var].as_str().unwrap_or("");
        if !job_state_path(value) {
            violation(format!(
                "`env: {var}` must be `{JOB_STATE_DIR}<name>` (per-job state, removed by the last step), not {}",
                if value.is_empty() { "absent" } else { value }
            ));
        }
    }
    for (i, step) in run.iter().enumerate() {
        let step_name = step["name"].as_str().map_or_else(|| format!("#{}", i + 1), |n| format!("`{n}`"));
        for key in step["env"].as_hash().into_iter().flat_map(|h| h.keys()).filter_map(Yaml::as_str) {
            if JOB_STATE_VARS.iter().any(|v| v.eq_ignore_ascii_case(key)) {
                violation(format!(
                    "step {step_name} sets `{key}`, overriding the job's per-job state; set it only in \
                     the job's `env:`"
                ));
            }
        }
        let run = step["run"].as_str().unwrap_or("");
        for command_file in ["GITHUB_ENV", "GITHUB_PATH"].into_iter().filter(|f| run.contains(f)) {
            violation(format!(
                "step {step_name} writes ${command_file}, which changes the environment of later steps (CARGO_HOME, \
                 PATH) behind the job's `env:`"
            ));
        }
    }
    let last = steps(job).last();
    if !last.is_some_and(|s| {
        bare_condition(&s["if"]) == Some("always()") && s["run"].as_str().map(str::trim) == Some(CLEANUP_RUN)
    }) {
        violation(format!(
            "the last step must be `if: always()` with `run: {CLEANUP_RUN}`, so that the job's toolchain, \
             registry and caches go even when it fails"
        ));
    }
    out
}

/// Whether `value` is [`JOB_STATE_DIR`] followed by a plain relative path that
/// stays inside it.
fn job_state_path(value: &str) -> bool {
    let Some(rest) = value.strip_prefix(JOB_STATE_DIR) else { return false };
    !rest.is_empty()
        && rest.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && rest.split('/').all(|segment| segment != ".." && segment != ".")
}

/// A dispatched self-hosted job outside the release (a fork's pull request, on
/// a maintainer's word): it tests exactly the reviewed commit, and only after a
/// GitHub-hosted job found that commit still the pull request's head.
fn check_approved(file: &str, name: &str, job: &Yaml, jobs: &yaml_rust2::yaml::Hash) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut violation = |message: String| out.push(finding(file, Some(name), message));
    for checkout in checkouts(job) {
        if checkout["with"]["ref"].as_str().map(str::trim) != Some("${{ inputs.sha }}") {
            violation(
                "a dispatched gate checks out exactly the reviewed commit, `ref: ${{ inputs.sha }}`; a \
                 branch or refs/pull/N/head can move after the review"
                    .into(),
            );
        }
    }
    let approved = needs(job).into_iter().any(|n| {
        jobs.get(&Yaml::String(n.to_string()))
            .is_some_and(|needed| needed.as_hash().is_some() && !self_hosted(needed) && compares_with_head(needed))
    });
    if !approved {
        violation(
            "needs no GitHub-hosted job that compares `inputs.sha` with the pull request's head \
             (`.head.sha`); without one, a push after the review would run unreviewed"
                .into(),
        );
    }
    if runs_after_failure(job) {
        violation(
            "`if:` calls always(), failure() or cancelled(), so it runs even when the approval check failed".into(),
        );
    }
    out
}

/// Whether a job has a step that gets `${{ inputs.sha }}` and reads the pull
/// request's head commit.
fn compares_with_head(job: &Yaml) -> bool {
    steps(job).any(|s| {
        let gets_sha = s["env"]
            .as_hash()
            .is_some_and(|h| h.values().any(|v| v.as_str().map(str::trim) == Some("${{ inputs.sha }}")));
        gets_sha && s["run"].as_str().is_some_and(|r| r.contains(".head.sha"))
    })
}

/// release.yml: the GPU runner verifies the commit the run was started on, and
/// the one job that can write (the tag job) runs after it, on a GitHub-hosted
/// runner, re-checks the version and tags that same commit.
fn check_release(file: &str, doc: &Yaml) -> Vec<Violation> {
    let mut out = Vec::new();
    let Some(jobs) = doc["jobs"].as_hash() else { return out };
    let verify: Vec<&str> = jobs.iter().filter(|(_, j)| self_hosted(j)).filter_map(|(n, _)| n.as_str()).collect();
    if verify.is_empty() {
        out.push(finding(
            file,
            None,
            "no self-hosted job: nothing verifies the commit on the GPU before the tag".into(),
        ));
    }
    for (name, job) in jobs.iter().filter(|(_, j)| self_hosted(j)) {
        for checkout in checkouts(job) {
            let reference = checkout["with"]["ref"].as_str().map(str::trim);
            if reference.is_some_and(|r| r != "${{ github.sha }}") {
                out.push(finding(
                    file,
                    name.as_str(),
                    "the release verifies the commit it tags: check out `github.sha` (no `ref:`)".into(),
                ));
            }
        }
    }
    let writers: Vec<(&str, &Yaml)> =
        jobs.iter().filter(|(_, j)| can_write(j, doc)).map(|(n, j)| (n.as_str().unwrap_or("?"), j)).collect();
    if writers.len() != 1 {
        let names: Vec<&str> = writers.iter().map(|(n, _)| *n).collect();
        out.push(finding(
            file,
            None,
            format!(
                "exactly one job may hold something that writes (the tag job: a secret or a write \
                 permission), found {}: {names:?}",
                writers.len()
            ),
        ));
    }
    for (name, job) in writers {
        let mut violation = |message: String| out.push(finding(file, Some(name), message));
        let waits: Vec<&str> = needs(job);
        for v in verify.iter().filter(|v| !waits.contains(v)) {
            violation(format!("does not need `{v}`: the tag could exist before or without a clean verify"));
        }
        if runs_after_failure(job) {
            violation("`if:` calls always(), failure() or cancelled(), so it runs even when verify failed".into());
        }
        let exprs: Vec<String> = expressions(job).iter().map(|e| e.trim().to_lowercase()).collect();
        if !exprs.iter().any(|e| e == "github.sha") {
            violation("never names `${{ github.sha }}`: it must tag the commit verify checked".into());
        }
        for other in exprs.iter().filter(|e| e.contains("sha") && *e != "github.sha") {
            violation(format!("names `{other}`: it tags only `github.sha`, the commit verify checked"));
        }
        let first_sha =
            steps(job).position(|s| expressions(s).iter().any(|e| e.trim().eq_ignore_ascii_case("github.sha")));
        let checked = steps(job)
            .take(first_sha.unwrap_or(usize::MAX))
            .any(|s| s["run"].as_str().is_some_and(|r| r.contains(VERSION_PATTERN)));
        if !checked {
            violation(format!(
                "must test the version against `{VERSION_PATTERN}` itself before the step that tags: the \
                 test in verify ran on the self-hosted runner"
            ));
        }
    }
    let concurrency = std::iter::once((None, &doc["concurrency"]))
        .chain(jobs.iter().map(|(n, j)| (n.as_str(), &j["concurrency"])))
        .filter(|(_, c)| !c.is_badvalue());
    let mut workflow_level = false;
    for (job, c) in concurrency {
        workflow_level |= job.is_none();
        let group = c.as_str().or_else(|| c["group"].as_str()).unwrap_or("");
        if group.trim().is_empty() || group.contains("${{") || c["cancel-in-progress"] != Yaml::Boolean(false) {
            out.push(finding(
                file,
                job,
                "the release's concurrency must be a literal group with `cancel-in-progress: false`, so \
                 that nothing cancels a running release"
                    .into(),
            ));
        }
    }
    if !workflow_level {
        out.push(finding(
            file,
            None,
            "no workflow-level `concurrency:`; releases run one at a time in a group of their own".into(),
        ));
    }
    out
}

/// Whether a push trigger leaves out the branches bots push: `branches-ignore`
/// lists them, or `branches` names only literal branches that are not theirs, or
/// only tags are filtered (no branch push starts it).
fn skips_bot_branches(push: &Yaml) -> bool {
    if push.as_hash().is_none() {
        return false;
    }
    if !push["branches"].is_badvalue() {
        return string_list(&push["branches"]).iter().all(|b| {
            !b.contains(['*', '?', '[', '!', '+'])
                && BOT_BRANCHES.iter().all(|bot| !b.starts_with(bot.trim_end_matches("**")))
        });
    }
    if push["branches-ignore"].is_badvalue() {
        return !push["tags"].is_badvalue() || !push["tags-ignore"].is_badvalue();
    }
    let ignored = string_list(&push["branches-ignore"]);
    BOT_BRANCHES.iter().all(|b| ignored.contains(b))
}

/// No other workflow can take the release's concurrency group: compared in lower
/// case (GitHub does), every other group is a literal other than a release group,
/// or starts with a literal prefix that no release group starts with, so that no
/// expression in it can evaluate to the release's group.
fn check_concurrency(docs: &[(&str, Yaml)]) -> Vec<Violation> {
    let release: Vec<String> = docs
        .iter()
        .filter(|(f, _)| base_name(f) == RELEASE_WORKFLOW)
        .flat_map(|(_, d)| concurrency_groups(d))
        .map(|g| g.to_lowercase())
        .collect();
    let mut out = Vec::new();
    for (file, doc) in docs.iter().filter(|(f, _)| base_name(f) != RELEASE_WORKFLOW) {
        for group in concurrency_groups(doc) {
            let lower = group.to_lowercase();
            let message = match lower.find("${{") {
                None if release.contains(&lower) => format!(
                    "concurrency group `{group}` is also the release's: a job here could cancel or hold up a \
                     release; give it a group of its own"
                ),
                None => continue,
                Some(i) if lower[..i].trim().is_empty() => format!(
                    "concurrency group `{group}` starts with an expression, which could evaluate to the \
                     release's group; start it with a literal prefix of its own (like `gpu-branch-`)"
                ),
                Some(i) if release.iter().any(|r| r.starts_with(&lower[..i])) => format!(
                    "concurrency group `{group}` could evaluate to the release's: a release group starts \
                     with its literal prefix `{}`; pick another prefix",
                    &lower[..i]
                ),
                Some(_) => continue,
            };
            out.push(finding(file, None, message));
        }
    }
    out
}

/// The commands of a shell script that run cargo (other than `--version`)
/// without `--locked` (or `--frozen`), found as a shell finds commands: after
/// `;`, `&&`, `||`, `|`, `&`, `(`, `` ` `` and newlines, past `NAME=value`
/// assignments and `env`/`time`/`command`/`exec`/`nohup`/`sudo`, and inside the
/// script of `sh -c`/`bash -c`.
pub fn unlocked_cargo(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    for words in shell_commands(script) {
        let mut rest = words.as_slice();
        while let Some((first, tail)) = rest.split_first() {
            let assignment = first
                .split_once('=')
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
            if assignment || ["env", "time", "command", "exec", "nohup", "sudo"].contains(&first.as_str()) {
                rest = tail;
            } else {
                break;
            }
        }
        let Some(program) = rest.first() else { continue };
        let program = program.rsplit('/').next().unwrap_or(program);
        if (program == "sh" || program == "bash")
            && let Some(i) = rest.iter().position(|w| w == "-c")
        {
            out.extend(rest.get(i + 1).map(|s| unlocked_cargo(s)).unwrap_or_default());
        } else if program == "cargo"
            && rest.get(1).is_none_or(|w| w != "--version")
            && !rest.iter().any(|w| w == "--locked" || w == "--frozen")
        {
            out.push(rest.join(" "));
        }
    }
    out
}

/// A shell script's simple commands as word lists: quotes group and are
/// removed, `\` escapes, `\`-newline continues, `#` starts a comment, and
/// operators and parentheses end a command. Enough of sh to find what runs.
fn shell_commands(script: &str) -> Vec<Vec<String>> {
    let (mut commands, mut words, mut word) = (Vec::new(), Vec::new(), None::<String>);
    let mut chars = script.chars().peekable();
    let end_word = |words: &mut Vec<String>, word: &mut Option<String>| words.extend(word.take());
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(e) => word.get_or_insert_default().push(e),
            },
            '\'' => {
                let w = word.get_or_insert_default();
                w.extend(chars.by_ref().take_while(|&q| q != '\''));
            }
            '"' => {
                let w = word.get_or_insert_default();
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        q => w.push(q),
                    }
                }
            }
            '#' if word.is_none() => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
                end_word(&mut words, &mut word);
                commands.push(std::mem::take(&mut words));
            }
            ';' | '&' | '|' | '(' | ')' | '`' | '\n' => {
                end_word(&mut words, &mut word);
                commands.push(std::mem::take(&mut words));
            }
            c if c.is_whitespace() => end_word(&mut words, &mut word),
            c => word.get_or_insert_default().push(c),
        }
    }
    end_word(&mut words, &mut word);
    commands.push(words);
    commands.retain(|w| !w.is_empty() && w != &["$"]);
    commands
}

/// Whether an `if:` is a conjunction, at its top level, of which one term is
/// [`DEFAULT_BRANCH_GUARD`]. A top-level `||` could bypass the guard.
fn guarded(cond: &Yaml) -> bool {
    let Some(text) = bare_condition(cond) else { return false };
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

/// The expressions under a node: the text inside every `${{ … }}` (to the end of
/// the string where one is not closed), and every `if:` value whole.
fn expressions(node: &Yaml) -> Vec<&str> {
    fn walk<'a>(node: &'a Yaml, is_if: bool, out: &mut Vec<&'a str>) {
        match node {
            Yaml::String(s) if is_if => out.push(s),
            Yaml::String(s) => {
                let mut rest = s.as_str();
                while let Some(open) = rest.find("${{") {
                    let inner = &rest[open + 3..];
                    match inner.find("}}") {
                        Some(close) => {
                            out.push(&inner[..close]);
                            rest = &inner[close + 2..];
                        }
                        None => {
                            out.push(inner);
                            break;
                        }
                    }
                }
            }
            Yaml::Array(a) => a.iter().for_each(|n| walk(n, false, out)),
            Yaml::Hash(h) => h.iter().for_each(|(k, v)| {
                walk(k, false, out);
                walk(v, k.as_str() == Some("if"), out);
            }),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(node, false, &mut out);
    out
}

/// Whether `ident` occurs in an expression as a name of its own (contexts are
/// case-insensitive): not part of a longer name, nor a property (`x.secrets`).
fn names_identifier(expr: &str, ident: &str) -> bool {
    let expr = expr.to_lowercase();
    let part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    expr.match_indices(ident).any(|(i, _)| {
        let before = expr[..i].chars().next_back();
        let after = expr[i + ident.len()..].chars().next();
        !before.is_some_and(|c| part(c) || c == '.') && !after.is_some_and(part)
    })
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

    /// The committed workflows with `from` replaced by `to` in `file` (which must
    /// hold `from`, so that a test never checks an edit that did not happen), and
    /// the messages the rules report on them.
    fn edited(file: &str, edits: &[(&str, &str)]) -> Vec<String> {
        let mut all = workflows();
        let (_, text) = all.iter_mut().find(|(f, _)| f == file).expect("a committed workflow");
        for (from, to) in edits {
            assert!(text.contains(from), "{file} no longer contains {from:?}: update this test");
            *text = text.replacen(from, to, 1);
        }
        check_all(&all).unwrap().into_iter().map(|v| v.to_string()).collect()
    }

    fn caught(file: &str, edits: &[(&str, &str)], needle: &str) {
        let v = edited(file, edits);
        assert!(v.iter().any(|m| m.starts_with(file) && m.contains(needle)), "{edits:?} → {v:#?}");
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

    /// A self-hosted job of the gate pool that every rule accepts, to be broken one
    /// rule at a time.
    const JOB: &str = "    runs-on: [self-hosted, gpu, ephemeral, gate]
    permissions: {contents: read}
    env:
      CARGO_HOME: ${{ github.workspace }}/target/job/c
      RUSTUP_HOME: ${{ github.workspace }}/target/job/r
      PIP_CACHE_DIR: ${{ github.workspace }}/target/job/p
      npm_config_cache: ${{ github.workspace }}/target/job/n
    steps:
      - uses: actions/checkout@abc
        with: {persist-credentials: false}
      - run: cargo --locked xtask ci --gpu
      - if: always()
        run: rm -rf target
";

    const PUSH: &str = "on:\n  push:\n    branches-ignore: [main, 'dependabot/**', 'gh-readonly-queue/**', \
                        'renovate/**', 'copilot/**', pre-commit-ci-update-config, 'release-please--**', \
                        'changeset-release/**', 'mergify/**']\n";

    fn pushed(job: &str) -> String {
        format!("{PUSH}jobs:\n  g:\n{job}")
    }

    #[test]
    fn the_template_job_passes() {
        assert!(one(&pushed(JOB)).is_empty(), "{:?}", one(&pushed(JOB)));
    }

    #[test]
    fn dispatch_needs_the_default_branch_guard_without_a_top_level_or() {
        let job = |cond: &str| {
            edited(
                "gpu-approved.yml",
                &[(
                    &format!("    needs: approval\n    if: {DEFAULT_BRANCH_GUARD}\n"),
                    &format!("    needs: approval\n    if: {cond}\n"),
                )],
            )
        };
        assert!(job(DEFAULT_BRANCH_GUARD).is_empty());
        assert!(job(&format!("${{{{ {DEFAULT_BRANCH_GUARD} && !github.event.repository.fork }}}}")).is_empty());
        assert!(job(&format!("(a || b) && {DEFAULT_BRANCH_GUARD}")).is_empty());
        for bad in [format!("{DEFAULT_BRANCH_GUARD} || github.actor == 'x'"), "true".into(), "'a && b'".into()] {
            let v = job(&bad);
            assert_eq!(v.len(), 1, "{bad}: {v:?}");
            assert!(v[0].contains("default branch's copy"), "{v:?}");
        }
    }

    #[test]
    fn pull_request_triggers_and_write_tokens_never_reach_a_self_hosted_job() {
        let v = one(&format!(
            "on: {{pull_request: {{types: [labeled]}}, pull_request_target: null}}\njobs:\n  g:\n{}",
            JOB.replace("{contents: read}", "{contents: write}")
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
            let v = one(&format!(
                "on: pull_request\njobs:\n  g:\n{}",
                JOB.replace("[self-hosted, gpu, ephemeral, gate]", runs_on)
            ));
            assert!(v.iter().any(|m| m.contains("triggered by `pull_request`")), "{runs_on}: {v:?}");
            assert!(v.iter().any(|m| m.contains("literal list of labels")), "{runs_on}: {v:?}");
        }
    }

    /// Labels are case-insensitive and a runner need not be labelled `self-hosted`
    /// in the workflow: only GitHub's image labels are GitHub-hosted.
    #[test]
    fn anything_but_a_github_hosted_image_counts_as_self_hosted() {
        let runs = |runs_on: &str| {
            one(&format!("on: pull_request\njobs:\n  g:\n    runs-on: {runs_on}\n    steps: []\n"))
                .iter()
                .any(|m| m.contains("triggered by `pull_request`"))
        };
        for self_hosted in [
            "[gpu, l4]",
            "SELF-HOSTED",
            "[Self-Hosted, linux]",
            "[ubuntu-latest, gpu]",
            "[]",
            "{labels: [ubuntu-latest]}",
        ] {
            assert!(runs(self_hosted), "{self_hosted}");
        }
        for hosted in ["ubuntu-latest", "Ubuntu-24.04", "[macos-15]", "windows-2025"] {
            assert!(!runs(hosted), "{hosted}");
        }
        // A job that calls a reusable workflow runs wherever that workflow says.
        let v = one("on: pull_request\njobs:\n  g:\n    uses: ./.github/workflows/x.yml\n    secrets: inherit\n");
        assert!(v.iter().any(|m| m.contains("triggered by `pull_request`")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("reusable workflow")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("uses secrets")), "{v:?}");
    }

    #[test]
    fn self_hosted_jobs_need_an_ephemeral_runner_of_their_own_pool() {
        caught("gpu.yml", &[("l4, ephemeral, gate]", "l4, gate]")], "lacks `ephemeral`");
        caught(
            "gpu-approved.yml",
            &[("[self-hosted, linux, x64, gpu, l4, ephemeral, gate]", "[self-hosted, linux, x64, gpu, l4]")],
            "lacks `ephemeral`",
        );
        caught("release.yml", &[("ephemeral, release]", "release]")], "lacks `ephemeral`");
        // The release's verify job never shares a runner pool with the gates.
        caught("release.yml", &[("ephemeral, release]", "ephemeral]")], "the `release` pool");
        caught("release.yml", &[("ephemeral, release]", "ephemeral, release, gate]")], "the `release` pool");
        caught("gpu.yml", &[("ephemeral, gate]", "ephemeral, release]")], "the `gate` pool");
        caught("gpu-approved.yml", &[("ephemeral, gate]", "ephemeral, gate, RELEASE]")], "the `gate` pool");
    }

    #[test]
    fn a_dispatched_gate_runs_the_approved_sha_after_the_approval_check() {
        caught(
            "gpu-approved.yml",
            &[("    needs: approval\n", "")],
            "compares `inputs.sha` with the pull request's head",
        );
        caught(
            "gpu-approved.yml",
            &[("ref: ${{ inputs.sha }}", "ref: refs/pull/${{ inputs.pr }}/head")],
            "`ref: ${{ inputs.sha }}`",
        );
        caught("gpu-approved.yml", &[("          ref: ${{ inputs.sha }}\n", "")], "`ref: ${{ inputs.sha }}`");
        // An approval job that no longer compares the SHA with the head approves nothing.
        caught("gpu-approved.yml", &[(".head.sha", ".base.sha")], "compares `inputs.sha`");
        caught("gpu-approved.yml", &[("          SHA: ${{ inputs.sha }}\n", "")], "compares `inputs.sha`");
        caught(
            "gpu-approved.yml",
            &[(
                &format!("    needs: approval\n    if: {DEFAULT_BRANCH_GUARD}"),
                &format!("    needs: approval\n    if: always() && {DEFAULT_BRANCH_GUARD}"),
            )],
            "even when the approval check failed",
        );
    }

    #[test]
    fn the_release_tags_only_the_commit_verify_checked() {
        caught("release.yml", &[("    needs: verify\n", "")], "does not need `verify`");
        caught(
            "release.yml",
            &[("SHA: ${{ github.sha }}", "SHA: ${{ inputs.sha }}")],
            "never names `${{ github.sha }}`",
        );
        caught(
            "release.yml",
            &[("-f \"sha=$SHA\"", "-f \"sha=${{ needs.verify.outputs.sha }}\"")],
            "names `needs.verify.outputs.sha`",
        );
        let verify_checkout = "          persist-credentials: false\n      - name: cargo";
        caught(
            "release.yml",
            &[(verify_checkout, &verify_checkout.replace("false\n", "false\n          ref: ${{ inputs.sha }}\n"))],
            "check out `github.sha`",
        );
        caught(
            "release.yml",
            &[(
                "    needs: verify\n    if: github.ref",
                "    needs: verify\n    if: ${{ !cancelled() }} && github.ref",
            )],
            "even when verify failed",
        );
        // The one writer: a second job that can write is one too many.
        caught(
            "release.yml",
            &[("    permissions:\n      contents: read\n", "    permissions:\n      contents: write\n")],
            "found 2",
        );
        let extra = "  notes:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ secrets.T }}\n  tag:\n";
        caught("release.yml", &[("  tag:\n", extra)], "found 2");
        caught("release.yml", &[("${{ secrets.RELEASE_APP_PRIVATE_KEY }}", "key")], "found 0");
        // The tag job tests the version itself, before the step that tags.
        let again = "      # Again here: the check above ran on the self-hosted runner.\n";
        caught("release.yml", &[(&format!("{again}{VERSION_STEP}"), again)], "test the version");
        caught(
            "release.yml",
            &[
                (&format!("{again}{VERSION_STEP}"), again),
                ("-f \"sha=$SHA\"\n", &format!("-f \"sha=$SHA\"\n{VERSION_STEP}")),
            ],
            "test the version",
        );
    }

    /// The version test, as verify and the tag job both run it.
    const VERSION_STEP: &str = "      - name: the version is vX.Y.Z
        env:
          VERSION: ${{ inputs.version }}
        run: |
          if ! [[ \"$VERSION\" =~ ^v[0-9]+\\.[0-9]+\\.[0-9]+$ ]]; then
            echo \"::error::the version input must look like v1.2.3\"
            exit 1
          fi
";

    #[test]
    fn job_state_stays_in_target_job_and_goes_at_the_end() {
        let home = "${{ github.workspace }}/target/job/cargo";
        caught("gpu.yml", &[(home, "${{ github.workspace }}/../../.cargo")], "env: CARGO_HOME");
        caught("gpu.yml", &[(home, "${{ github.workspace }}/target/job/../../../.cargo")], "env: CARGO_HOME");
        caught("gpu.yml", &[(home, "${{ github.workspace }}/target/job/")], "env: CARGO_HOME");
        caught("gpu.yml", &[(home, "${{ github.workspace }}/target/job/${{ inputs.x }}")], "env: CARGO_HOME");
        caught("gpu.yml", &[(home, "/home/runner/.cargo")], "env: CARGO_HOME");
        let step_env = "          DEFAULT_BRANCH: ${{ github.event.repository.default_branch }}\n";
        caught(
            "gpu.yml",
            &[(step_env, &format!("{step_env}          CARGO_HOME: /home/runner/.cargo\n"))],
            "sets `CARGO_HOME`",
        );
        caught(
            "gpu.yml",
            &[(step_env, &format!("{step_env}          NPM_CONFIG_CACHE: /tmp/npm\n"))],
            "sets `NPM_CONFIG_CACHE`",
        );
        caught(
            "gpu.yml",
            &[(
                "          rustup toolchain install\n",
                "          echo \"CARGO_HOME=$HOME/.cargo\" >> \"$GITHUB_ENV\"\n",
            )],
            "writes $GITHUB_ENV",
        );
        caught(
            "release.yml",
            &[("          rustup toolchain install\n", "          echo /opt/fake >> \"$GITHUB_PATH\"\n")],
            "writes $GITHUB_PATH",
        );
        let cleanup = "      - name: remove this job's state\n        if: always()\n        run: rm -rf target\n";
        caught("gpu-approved.yml", &[(cleanup, "")], "the last step must be `if: always()`");
        caught("gpu.yml", &[(cleanup, &cleanup.replace("always()", "success()"))], "the last step must be");
        caught(
            "release.yml",
            &[(cleanup, &cleanup.replace("rm -rf target", "rm -rf target/xtask"))],
            "the last step must be",
        );
    }

    #[test]
    fn secrets_and_persisted_credentials_are_violations() {
        let text = pushed(JOB)
            .replace("        with: {persist-credentials: false}\n", "")
            .replace("      - if: always()", "      - run: echo ${{ secrets.T }}\n      - if: always()");
        let v = one(&text);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|m| m.contains("uses secrets")) && v.iter().any(|m| m.contains("persist-credentials")));
    }

    #[test]
    fn secrets_is_caught_as_an_identifier_and_environments_stay_off_the_runner() {
        for expr in ["toJSON(secrets)", "secrets['T']", "SECRETS.T", "format('{0}', secrets . T)"] {
            let text = pushed(JOB)
                .replace("      - if: always()", &format!("      - run: echo ${{{{ {expr} }}}}\n      - if: always()"));
            assert!(one(&text).iter().any(|m| m.contains("uses secrets")), "{expr}");
        }
        let text = pushed(JOB).replace("    steps:", "    if: toJSON(secrets) != ''\n    steps:");
        assert!(one(&text).iter().any(|m| m.contains("uses secrets")));
        let text = format!("{PUSH}env:\n  T: ${{{{ secrets.T }}}}\njobs:\n  g:\n{JOB}");
        assert!(one(&text).iter().any(|m| m.contains("uses secrets")));
        // Not an identifier: a property or a longer name, or the word outside an expression.
        for fine in ["${{ inputs.secrets_note }}", "${{ github.event.secrets }}", "no secrets here"] {
            let text = pushed(JOB)
                .replace("      - if: always()", &format!("      - run: echo '{fine}'\n      - if: always()"));
            assert!(one(&text).is_empty(), "{fine}: {:?}", one(&text));
        }
        caught(
            "release.yml",
            &[("    timeout-minutes: 180\n", "    environment: release\n    timeout-minutes: 180\n")],
            "`environment:`",
        );
    }

    #[test]
    fn concurrency_groups_cannot_reach_the_release() {
        caught(
            "gpu.yml",
            &[("group: gpu-branch-${{ github.ref }}", "group: RELEASE")],
            "`RELEASE` is also the release's",
        );
        caught(
            "gpu.yml",
            &[("group: gpu-branch-${{ github.ref }}", "group: ${{ github.head_ref }}")],
            "starts with an expression",
        );
        caught(
            "ci.yml",
            &[("group: ci-${{ github.ref }}", "group: Rel${{ github.head_ref }}")],
            "literal prefix `rel`",
        );
        caught(
            "release.yml",
            &[("  cancel-in-progress: false", "  cancel-in-progress: true")],
            "literal group with `cancel-in-progress: false`",
        );
        caught(
            "release.yml",
            &[("  cancel-in-progress: false\n", "")],
            "literal group with `cancel-in-progress: false`",
        );
        caught("release.yml", &[("  group: release", "  group: release-${{ inputs.version }}")], "literal group");
        caught(
            "release.yml",
            &[("concurrency:\n  group: release\n  cancel-in-progress: false\n", "")],
            "no workflow-level `concurrency:`",
        );
    }

    #[test]
    fn pushes_of_bot_branches_stay_off_the_runner() {
        caught("gpu.yml", &[("      - 'dependabot/**'\n", "")], "dependabot/**");
        caught("gpu.yml", &[("      - 'gh-readonly-queue/**'\n", "")], "branches-ignore");
        caught("gpu.yml", &[("      - 'renovate/**'\n", "")], "renovate/**");
        caught("gpu.yml", &[("      - 'copilot/**'\n", "")], "copilot/**");
        let only = |on: &str| one(&format!("{on}jobs:\n  g:\n{JOB}"));
        assert!(!only("on: push\n").is_empty());
        assert!(!only("on:\n  push:\n    branches: ['**']\n").is_empty());
        assert!(!only("on:\n  push:\n    branches: [dependabot/cargo/x]\n").is_empty());
        assert!(only("on:\n  push:\n    branches: [main, next]\n").is_empty());
        assert!(only("on:\n  push:\n    tags: ['v*']\n").is_empty());
    }

    #[test]
    fn no_workflow_keeps_a_cache() {
        let checkout = "      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2\n";
        for step in [
            "      - uses: actions/cache@v4\n        with: {path: target, key: k}\n",
            "      - uses: Swatinem/rust-cache@v2\n",
            "      - uses: actions/setup-python@v5\n        with: {cache: pip}\n",
        ] {
            caught("ci.yml", &[(checkout, &format!("{step}{checkout}"))], "keeps a cache");
            caught(
                "release.yml",
                &[("    steps:\n      # Again", &format!("    steps:\n{step}      # Again"))],
                "keeps a cache",
            );
        }
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
    fn cargo_is_found_wherever_a_shell_would_run_it() {
        for script in [
            "FOO=1 cargo build",
            "cd x && cargo test",
            "(cargo run -p x)",
            "true; cargo build",
            "echo $(cargo metadata)",
            "env RUSTFLAGS=-Dwarnings cargo clippy",
            "bash -c 'cargo build --release'",
            "time /usr/bin/cargo test \\\n  --workspace",
            "x || cargo b",
        ] {
            assert_eq!(unlocked_cargo(script).len(), 1, "{script:?}");
        }
        for script in [
            "echo 'cargo build'",
            "FOO=1 cargo --locked build",
            "# cargo build",
            "cargo --version && cargo --frozen test",
            "echo cargo",
            "bash -c 'cargo --locked build'",
        ] {
            assert_eq!(unlocked_cargo(script), Vec::<String>::new(), "{script:?}");
        }
    }

    const COMPOSITE: &str = "runs:\n  using: composite\n  steps:\n";

    #[test]
    fn composite_actions_are_read_as_the_steps_they_run() {
        let mut all = workflows();
        let setup = "          persist-credentials: false\n";
        let (_, gpu) = all.iter_mut().find(|(f, _)| f == "gpu.yml").unwrap();
        assert!(gpu.contains(setup));
        *gpu = gpu.replacen(setup, &format!("{setup}      - uses: ./.github/actions/setup\n"), 1);
        let steps = [
            ("      - uses: actions/cache@v4\n        with: {path: target, key: k}\n", "keeps a cache"),
            ("      - run: echo X=1 >> $GITHUB_ENV\n        shell: bash\n", "GITHUB_ENV"),
            ("      - run: FOO=1 cargo build\n        shell: bash\n", "without --locked"),
            ("      - uses: ./.github/actions/inner\n", "no ./.github/actions/inner/action.yml"),
            ("      - uses: someone/action@0123456789abcdef0123456789abcdef01234567\n", "cannot see"),
        ];
        for (step, needle) in steps {
            let mut files = all.clone();
            files.push((".github/actions/setup/action.yml".into(), format!("{COMPOSITE}{step}")));
            let v: Vec<String> = check_all(&files).unwrap().into_iter().map(|v| v.to_string()).collect();
            assert!(v.iter().any(|m| m.starts_with("gpu.yml") && m.contains(needle)), "{step} → {v:#?}");
        }
        let mut files = all.clone();
        files.push((
            ".github/actions/setup/action.yml".into(),
            format!("{COMPOSITE}      - run: echo ok\n        shell: bash\n"),
        ));
        let v = check_all(&files).unwrap();
        assert!(v.is_empty(), "a clean composite action passes: {v:#?}");
        let mut files = all.clone();
        files.push((".github/actions/setup/action.yml".into(), "runs:\n  using: node20\n  main: x.js\n".into()));
        let v: Vec<String> = check_all(&files).unwrap().into_iter().map(|v| v.to_string()).collect();
        assert!(v.iter().any(|m| m.contains("not a composite")), "{v:#?}");
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

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_2026),
            ..Default::default()
        })]
        /// Any workflow text, the committed ones cut short included, reads as
        /// violations or an error, never a panic.
        #[test]
        fn any_text_never_panics(file in 0usize..4, cut in 0.0f64..1.0, noise in "[a-z:{}\\[\\]$ \n-]{0,40}") {
            let (name, text) = workflows().swap_remove(file);
            let mut end = (text.len() as f64 * cut) as usize;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let _ = check_all(&[(name, format!("{}{noise}", &text[..end]))]);
        }
    }
}
