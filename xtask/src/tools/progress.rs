//! Progress on long stages. On a terminal (and not under CI), an indicatif bar
//! or spinner on stderr, cleared when the stage ends. Elsewhere (CI, a pipe, a
//! log) plain lines: the stage's name as it starts (outside `check`), then a
//! count at most every [`HEARTBEAT`], so a long stage shows it is alive; every
//! item with `-v`. Lines an item reports (failures, gate verdicts) always show;
//! `-q` shows nothing else.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::tools::process::{Verbosity, detail, verbosity};

/// Longest silence of a plain-line progress outside `detail()`.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

pub struct Progress {
    label: String,
    total: Mutex<Option<u64>>,
    bar: Option<ProgressBar>,
    state: Mutex<Plain>,
}

struct Plain {
    done: u64,
    start: Instant,
    last_line: Instant,
}

/// How progress is shown: decided once per stage from the terminal, `CI` and `-q`/`-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Bar,
    Lines,
    Silent,
}

pub fn mode() -> Mode {
    match verbosity() {
        Verbosity::Quiet => Mode::Silent,
        _ if std::io::stderr().is_terminal() && std::env::var_os("CI").is_none() => Mode::Bar,
        _ => Mode::Lines,
    }
}

impl Progress {
    /// `total` items, e.g. compile units or test cases.
    pub fn bar(label: &str, total: u64) -> Progress {
        Progress::start(label, Some(total), mode())
    }

    /// Work of unknown length (a wheel install, a cargo build): a spinner with the elapsed time.
    pub fn spinner(label: &str) -> Progress {
        Progress::start(label, None, mode())
    }

    fn start(label: &str, total: Option<u64>, mode: Mode) -> Progress {
        let bar = (mode == Mode::Bar).then(|| {
            let (bar, template) = match total {
                Some(n) => (ProgressBar::new(n), "{prefix} [{bar:30}] {pos}/{len} {elapsed} {wide_msg}"),
                None => (ProgressBar::new_spinner(), "{prefix} {spinner} {elapsed} {wide_msg}"),
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        if mode == Mode::Lines && detail() {
            eprintln!("{label}…");
        }
        let now = Instant::now();
        Progress {
            label: label.to_string(),
            total: Mutex::new(total),
            bar,
            state: Mutex::new(Plain { done: 0, start: now, last_line: now }),
        }
    }

    /// One item done whose line always shows (a gate verdict, a failure).
    pub fn report(&self, line: &str) {
        if mode() != Mode::Silent || self.bar.is_some() {
            self.println(line);
        }
        self.count(line, false);
    }

    /// One item done; `line` says which and how it went.
    pub fn item(&self, line: &str) {
        self.count(line, true);
    }

    fn count(&self, line: &str, show: bool) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.done += 1;
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(line.to_string());
            if show && verbosity() == Verbosity::Verbose {
                bar.println(line);
            }
        } else if mode() == Mode::Lines {
            if !show {
                s.last_line = Instant::now();
            } else if verbosity() == Verbosity::Verbose {
                eprintln!("{line}");
            } else if s.last_line.elapsed() >= HEARTBEAT {
                let total = *self.total.lock().unwrap_or_else(|e| e.into_inner());
                let of = total.map(|t| format!("/{t}")).unwrap_or_default();
                eprintln!("{}: {}{of} after {:.0} s", self.label, s.done, s.start.elapsed().as_secs_f64());
                s.last_line = Instant::now();
            }
        }
    }

    /// A line that always shows (a failure), above the bar where there is one.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// The item count, once known (a driver says how many cases it will run).
    pub fn set_total(&self, total: u64) {
        *self.total.lock().unwrap_or_else(|e| e.into_inner()) = Some(total);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// A status under the spinner or bar (plain mode keeps quiet).
    pub fn message(&self, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg.to_string());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_progress_counts_items_and_never_panics() {
        let p = Progress::start("test", Some(3), Mode::Lines);
        for i in 0..5 {
            p.item(&format!("[{i}/3] case"));
        }
        p.println("FAILED case");
        assert_eq!(p.state.lock().unwrap().done, 5);
        let s = Progress::start("install", None, Mode::Silent);
        s.item("x");
        s.message("y");
        assert!(s.bar.is_none());
    }

    #[test]
    fn a_bar_is_cleared_when_the_stage_ends() {
        let p = Progress::start("build", Some(2), Mode::Bar);
        p.item("a");
        let bar = p.bar.clone().unwrap();
        assert_eq!(bar.position(), 1);
        drop(p);
        assert!(bar.is_finished());
    }
}
