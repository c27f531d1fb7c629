//! xtask: the kernel team's build-and-verify pipeline. `main` parses flags and
//! dispatches; each task lives in its own module.

mod check;
mod ci;
mod compile;
mod errors;
mod flags;
mod measure;
mod optimise;
mod parse;
mod paths;
mod report;
mod table;
#[cfg(test)]
mod tidy;
mod tools;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use compile::kernel_set;
use flags::{BenchAction, Cli, ReportAction, Task};
use measure::{bench, compare, profile, tune};
use optimise::{iterate, summary};
use tools::{preflight, process};
use verify::{sanitize, test};

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == process::REAPER_ARG) {
        return process::reap();
    }
    let cli = Cli::parse();
    process::set_verbosity(cli.verbosity());
    if let Some(device) = &cli.device {
        // SAFETY: no other thread exists yet. The kernel-ffi binaries read FA_DEVICE,
        // so every child of every stage opens the GPU the user named.
        unsafe { std::env::set_var("FA_DEVICE", device) };
    }
    if let Err(e) = process::on_signals().and_then(|()| process::start_reaper()) {
        eprintln!("xtask: could not run: {e:#}");
        return ExitCode::from(2);
    }
    match dispatch(cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let code = errors::exit_code(&err);
            if code == 1 {
                eprintln!("xtask: FAILED: {err:#}");
            } else {
                eprintln!("xtask: could not run: {err:#}");
            }
            ExitCode::from(code)
        }
    }
}

fn dispatch(task: Task) -> anyhow::Result<()> {
    let paths = task.paths()?;
    match task {
        Task::Build(b) => compile::run(&paths, &b.options()),
        Task::Check { build, require_gpu, sanitize, test } => {
            check::run(&paths, &check::Options { build: build.options(), require_gpu, sanitize, test: test.options() })
        }
        Task::Sanitize { build, tool, tool_timeout, defects, spread } => {
            tools::gpu::require("sanitize")?; // before any build
            kernel_set::prepare(&paths, &build.options(), build.kernels.is_some())?;
            let b = build.options();
            let tools = if tool.is_empty() { sanitize::Tool::ALL.to_vec() } else { tool };
            sanitize::run(
                &paths,
                &sanitize::Options {
                    tools,
                    timeout: tool_timeout.map(Duration::from_secs),
                    defects,
                    build_timeout: b.timeout,
                    jobs: b.jobs,
                    gpus: spread.gpus,
                    shard: spread.shard,
                },
            )
        }
        Task::Preflight => preflight::run(&paths),
        Task::Summary => summary::run(&paths),
        Task::Tune { build, apply, variant_timeout, budget_ms, gpus } => {
            tools::gpu::require("tune")?; // before any build
            let b = build.options();
            compile::run(&paths, &b)?; // the committed configuration: fa-test --info loads it
            tune::run(
                &paths,
                &tune::Options {
                    apply,
                    build_timeout: b.timeout,
                    jobs: b.jobs,
                    variant_timeout: Duration::from_secs(variant_timeout),
                    budget_ms,
                    gpus,
                },
            )
        }
        Task::Ci { gpu, build, test, against, base_dir, gate } => {
            let bench = bench::Options { against, base_dir, ..gate.options("f16") };
            ci::run(&paths, &ci::Options { gpu, build: build.options(), test: test.options(), bench })
        }
        Task::Iterate { hypothesis, predict, sanitize, no_revert, build, test, gate, dtype } => {
            let b = build.options();
            let opts = iterate::Options {
                hypothesis,
                prediction: predict,
                sanitize,
                no_revert,
                bench: gate.options(&dtype),
                sanitize_opts: sanitize::Options::all(b.timeout, b.jobs),
                build: b,
                test: test.options(),
            };
            iterate::run(&paths, &opts)
        }
        Task::Bench { action: Some(BenchAction::Compare { a, b }), .. } => compare::run(&paths, &a, &b),
        Task::Bench {
            action: None,
            build,
            gate,
            dtype,
            against,
            base_dir,
            save_baseline,
            baseline,
            vs_torch,
            self_test,
        } => {
            tools::gpu::require("bench")?; // before any build
            kernel_set::prepare(&paths, &build.options(), build.kernels.is_some())?;
            let opts = bench::Options {
                against,
                base_dir,
                save_baseline,
                baseline,
                vs_torch,
                self_test,
                ..gate.options(&dtype)
            };
            bench::run(&paths, &opts)
        }
        Task::Profile { shapes, base_clocks, profile_timeout, gpus } => profile::run(
            &paths,
            &profile::Options { shapes, base_clocks, timeout: Duration::from_secs(profile_timeout), gpus },
        ),
        Task::Report { action: ReportAction::Merge { files, out } } => test::merge(&paths, &files, out.as_deref()),
        Task::Test { build, test } => {
            tools::gpu::require("test")?; // before any build
            kernel_set::prepare(&paths, &build.options(), build.kernels.is_some())?;
            test::run(&paths, &test.options())
        }
    }
}
