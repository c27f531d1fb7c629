#!/bin/sh
# The runner's job-started hook (ACTIONS_RUNNER_HOOK_JOB_STARTED, ci/README.md):
# the runner refuses, before any step, a job its pool was not made for, whatever
# labels the job's workflow asked for. Labels are chosen by whoever writes the
# workflow, so they alone cannot keep a collaborator's branch off the release
# pool. FA_RUNNER_POOL (release or gate) is set in the runner image.
#   release: only main's .github/workflows/release.yml, dispatched;
#   gate:    only gpu.yml (pushes) and gpu-approved.yml (dispatches).
set -eu
repo="${GITHUB_REPOSITORY:?not run by the Actions runner}"
ref="${GITHUB_WORKFLOW_REF:?not run by the Actions runner}"
event="${GITHUB_EVENT_NAME:?not run by the Actions runner}"
refuse() {
    echo "runner hook: this ${FA_RUNNER_POOL:-unset}-pool runner refuses $ref ($event): $1" >&2
    exit 1
}
case "${FA_RUNNER_POOL:-}" in
release)
    [ "$ref" = "$repo/.github/workflows/release.yml@refs/heads/main" ] \
        || refuse "the release pool runs only main's release.yml"
    [ "$event" = workflow_dispatch ] || refuse "a release is dispatched"
    ;;
gate)
    case "$ref" in
    "$repo/.github/workflows/gpu.yml@"*) [ "$event" = push ] || refuse "gpu.yml runs on pushes" ;;
    "$repo/.github/workflows/gpu-approved.yml@refs/heads/main") [ "$event" = workflow_dispatch ] || refuse "gpu-approved.yml is dispatched" ;;
    *) refuse "the gate pool runs only gpu.yml and main's gpu-approved.yml" ;;
    esac
    ;;
*) refuse "FA_RUNNER_POOL must be release or gate in the runner's image" ;;
esac
