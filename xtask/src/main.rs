//! xtask: the kernel team's build-and-verify pipeline. `main` parses the
//! command line, builds the run context once and dispatches; each command
//! lives in `commands/`, the stages it calls in their own modules.

mod ci;
mod commands;
mod compile;
mod errors;
mod ledger;
mod measure;
mod optimise;
mod parse;
mod report;
mod run;
mod table;
#[cfg(test)]
mod tidy;
mod tools;
mod verify;
mod wheel;

use std::process::ExitCode;

use clap::Parser;

use commands::{Cli, Command};
use tools::process;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == process::REAPER_ARG) {
        return process::reap();
    }
    let cli = Cli::parse();
    process::set_verbosity(cli.verbosity());
    if let Err(e) = process::on_signals().and_then(|()| process::start_reaper()) {
        eprintln!("xtask: could not run: {e:#}");
        return ExitCode::from(2);
    }
    let cx = match run::Run::new(cli.device.clone(), cli.command.kernel_dir()) {
        Ok(cx) => cx,
        Err(e) => return errors::report(&e),
    };
    let result = match cli.command {
        Command::Build(c) => c.run(&cx),
        Command::Check(c) => c.run(&cx),
        Command::Sanitize(c) => c.run(&cx),
        Command::Bench(c) => c.run(&cx),
        Command::Ci(c) => c.run(&cx),
        Command::Iterate(c) => c.run(&cx),
        Command::Summary(c) => c.run(&cx),
        Command::Tune(c) => c.run(&cx),
        Command::Preflight(c) => c.run(&cx),
        Command::Profile(c) => c.run(&cx),
        Command::Test(c) => c.run(&cx),
        Command::Report(c) => c.run(&cx),
        Command::Wheel(c) => c.run(&cx),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => errors::report(&e),
    }
}
