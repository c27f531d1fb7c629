//! The one way xtask runs a subprocess: logged, captured to a file, bounded by a
//! timeout that kills the child's whole process group. `Cmd` runs its children
//! through duct (spawning, redirection, waiting with a timeout); duct's own kill
//! reaches only the direct child, so every child starts in its own process group
//! (a timeout must reach grandchildren: nvcc runs cicc and ptxas) and this layer
//! kills the group. A terminal's Ctrl-C therefore reaches xtask alone:
//! `on_signals` stops every group still running and exits 128 + the signal
//! (SIGINT, SIGTERM, SIGHUP, SIGQUIT); where xtask dies without a handler
//! (SIGKILL), its reaper process kills them. Short probes (git) go through
//! xshell (`sh`).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How many trailing lines of output an error message quotes.
const TAIL_LINES: usize = 20;

pub struct Cmd {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    timeout: Duration,
    log: Option<PathBuf>,
    quiet: bool,
    echo: bool,
    on_line: Option<LineHook>,
}

/// Called with each line the child writes (stdout or stderr), as it arrives.
type LineHook = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The last lines of stdout and stderr together, for error messages.
    pub fn tail(&self) -> String {
        tail(&format!("{}{}", self.stdout, self.stderr), TAIL_LINES)
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Cmd {
    pub fn new(program: impl Into<PathBuf>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_secs(120),
            log: None,
            quiet: false,
            echo: false,
            on_line: None,
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Cmd {
        self.env.push((key.to_string(), value.into()));
        self
    }

    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Cmd {
        self.cwd = Some(dir.into());
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Cmd {
        self.timeout = timeout;
        self
    }

    /// Also write stdout and stderr to this file (created with its parents).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Cmd {
        self.log = Some(path.into());
        self
    }

    /// Do not echo the command line (for cheap probes such as `--version`).
    pub fn quiet(mut self) -> Cmd {
        self.quiet = true;
        self
    }

    /// Also copy the child's output to ours as it arrives (progress lines of long runs).
    pub fn echo(mut self) -> Cmd {
        self.echo = true;
        self
    }

    /// Calls `hook` with each line of output as it arrives (a driver's per-case
    /// lines feeding a progress bar); the output is still captured whole.
    pub fn on_line(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Cmd {
        self.on_line = Some(std::sync::Arc::new(hook));
        self
    }

    /// The value this command sets for `key`, if it sets one.
    #[cfg(test)]
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn display(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            if a.contains(' ') || a.is_empty() {
                s.push_str(&format!("'{a}'"));
            } else {
                s.push_str(a);
            }
        }
        s
    }

    /// The command line, with the environment it sets under `-v`.
    fn announce(&self, shown: &str, suffix: &str) {
        match verbosity() {
            Verbosity::Quiet => {}
            Verbosity::Normal if self.quiet || !detail() => {}
            Verbosity::Normal => eprintln!("$ {shown}{suffix}"),
            Verbosity::Verbose => {
                let env: String = self.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
                let cwd = self.cwd.as_ref().map(|d| format!(" (in {})", d.display())).unwrap_or_default();
                eprintln!("$ {env}{shown}{suffix}{cwd}");
            }
        }
    }

    /// Whether the child's output is echoed as it runs.
    fn echoes(&self) -> bool {
        match verbosity() {
            Verbosity::Quiet => false,
            Verbosity::Normal => self.echo && detail(),
            Verbosity::Verbose => true,
        }
    }

    /// The duct expression: program, arguments, environment, folder, and a
    /// process group of its own; exit statuses are the caller's to judge.
    fn expression(&self) -> duct::Expression {
        // As an OsStr, not a Path: duct would run a one-word Path from the current folder.
        let mut e = duct::cmd(self.program.as_os_str(), &self.args).unchecked().before_spawn(|c| {
            c.process_group(0);
            Ok(())
        });
        for (k, v) in &self.env {
            e = e.env(k, v);
        }
        if let Some(dir) = &self.cwd {
            e = e.dir(dir);
        }
        e
    }

    /// Runs to completion and returns the output whatever the exit status;
    /// errors only when the process cannot be started or times out.
    pub fn run(self) -> Result<Output> {
        let shown = self.display();
        self.announce(&shown, "");
        let (out_r, out_w) = os_pipe::pipe().context("creating a pipe")?;
        let (err_r, err_w) = os_pipe::pipe().context("creating a pipe")?;
        let start = Instant::now();
        // The expression, and with it this process's copies of the write ends, is
        // gone once started: the readers see the end when the child tree closes its own.
        let handle = self
            .expression()
            .stdin_null()
            .stdout_file(out_w)
            .stderr_file(err_w)
            .start()
            .with_context(|| format!("could not start `{shown}`"))?;
        let pgid = handle.pids().first().copied().context("duct started no process")? as libc::pid_t;
        let _running = Running::register(pgid, &shown);
        let echo = self.echoes();
        let stdout =
            drain(out_r, echo.then(|| Box::new(std::io::stdout()) as Box<dyn Write + Send>), self.on_line.clone());
        let stderr =
            drain(err_r, echo.then(|| Box::new(std::io::stderr()) as Box<dyn Write + Send>), self.on_line.clone());
        let waited = handle.wait_timeout(self.timeout).with_context(|| format!("waiting for `{shown}`"))?;
        // The leader is gone, or out of time: either way nothing it started may linger.
        kill_group(pgid);
        let Some(done) = waited else {
            let _ = handle.wait();
            let out = join(stdout) + &join(stderr);
            self.write_log(&out)?;
            bail!(
                "`{shown}` timed out after {} s; last output:\n{}",
                self.timeout.as_secs_f64(),
                tail(&out, TAIL_LINES)
            );
        };
        let status = done.status;
        let output = Output { status, stdout: join(stdout), stderr: join(stderr), elapsed: start.elapsed() };
        self.write_log(&format!("{}{}", output.stdout, output.stderr))?;
        Ok(output)
    }

    /// Like [`Cmd::run`], but a non-zero exit is an error quoting the output's tail.
    pub fn run_checked(self) -> Result<Output> {
        let shown = self.display();
        let out = self.run()?;
        if !out.success() {
            bail!("`{shown}` failed ({}); last output:\n{}", out.status, out.tail());
        }
        Ok(out)
    }

    fn write_log(&self, text: &str) -> Result<()> {
        let Some(path) = &self.log else { return Ok(()) };
        write_file(path, format!("$ {}\n{text}", self.display()))
    }
}

/// A long-lived child that answers one line per request line (`fa-bench
/// --serve`): its own process group, stderr to the log file, the group killed
/// when the session is dropped, every reply awaited within a timeout.
pub struct Session {
    shown: String,
    child: duct::Handle,
    pgid: libc::pid_t,
    stdin: os_pipe::PipeWriter,
    replies: std::sync::mpsc::Receiver<String>,
    log: Option<PathBuf>,
    _running: Running,
}

impl Cmd {
    /// Starts the command as a [`Session`].
    pub fn session(self) -> Result<Session> {
        let shown = self.display();
        self.announce(&shown, " (session)");
        let stderr = match &self.log {
            Some(path) => {
                write_file(path, format!("$ {shown}\n"))?;
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                Some(f)
            }
            None => None,
        };
        let (stdin_r, stdin) = os_pipe::pipe().context("creating a pipe")?;
        let (stdout, stdout_w) = os_pipe::pipe().context("creating a pipe")?;
        let e = self.expression().stdin_file(stdin_r).stdout_file(stdout_w);
        let e = match stderr {
            Some(f) => e.stderr_file(f),
            None => e.stderr_null(),
        };
        let child = e.start().with_context(|| format!("could not start `{shown}`"))?;
        let pgid = child.pids().first().copied().context("duct started no process")? as libc::pid_t;
        let running = Running::register(pgid, &shown);
        let (send, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Session { shown, child, pgid, stdin, replies, log: self.log, _running: running })
    }
}

impl Session {
    /// The next line the child writes, within `timeout`.
    pub fn read_line(&mut self, timeout: Duration) -> Result<String> {
        use std::sync::mpsc::RecvTimeoutError;
        match self.replies.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                bail!("`{}` gave no answer within {} s{}", self.shown, timeout.as_secs_f64(), self.see_log())
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|o| o.status.to_string()).unwrap_or_else(|e| e.to_string());
                bail!("`{}` ended ({status}){}", self.shown, self.see_log())
            }
        }
    }

    /// Writes one line, expecting no answer.
    pub fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .with_context(|| format!("writing to `{}`{}", self.shown, self.see_log()))
    }

    /// Writes one line and reads the answer.
    pub fn request(&mut self, line: &str, timeout: Duration) -> Result<String> {
        self.send(line)?;
        self.read_line(timeout)
    }

    fn see_log(&self) -> String {
        let Some(log) = &self.log else { return String::new() };
        let text = fa_schema::file::read_text(log).unwrap_or_default();
        format!("; its log {}:\n{}", log.display(), tail(&text, TAIL_LINES))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        kill_group(self.pgid);
        let _ = self.child.wait();
    }
}

/// A short git query in `dir`, through xshell: its trimmed stdout, or `None`
/// where git fails or is absent (a copy of the tree without `.git`). For
/// instant queries only: no timeout, nothing logged.
pub fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let sh = xshell::Shell::new().ok()?;
    sh.change_dir(dir);
    xshell::cmd!(sh, "git {args...}").quiet().ignore_stderr().read().ok()
}

/// The first executable `name` in the folders of `path` (a `PATH` value).
pub fn on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Refuses, naming what to install, where a tool a stage runs is not on `PATH`.
pub fn require_tools(names: &[&str], needed_for: &str, install: &str) -> Result<()> {
    let path = std::env::var_os("PATH");
    let missing: Vec<&str> = names.iter().copied().filter(|n| on_path(n, path.as_deref()).is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(crate::errors::CannotRun(format!("{needed_for} needs {}, not found on PATH; {install}", missing.join(" and ")))
        .into())
}

/// The checkout in `root` as reports record it: `XTASK_GIT_REV` where set (a
/// copy without .git on the GPU machine), else HEAD and whether tracked files
/// differ from it; "unknown" outside git.
pub fn git_state(root: &Path) -> crate::report::GitState {
    use crate::report::GitState;
    if let Ok(rev) = std::env::var("XTASK_GIT_REV") {
        return GitState { rev, dirty: false };
    }
    match git(root, &["rev-parse", "HEAD"]) {
        Some(rev) => {
            let dirty = git(root, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            GitState { rev, dirty }
        }
        None => GitState { rev: "unknown".into(), dirty: false },
    }
}

/// How much xtask says about the commands it runs, set once from `-q`/`-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}

static VERBOSITY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);

pub fn set_verbosity(v: Verbosity) {
    VERBOSITY.store(v as u8, std::sync::atomic::Ordering::Relaxed);
}

/// Whether stages print their full tables (else a line each, the tables going to
/// their files): off under `-q`, and inside `check` unless `-v`.
static DETAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub fn set_detail(on: bool) {
    DETAIL.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn detail() -> bool {
    match verbosity() {
        Verbosity::Quiet => false,
        Verbosity::Normal => DETAIL.load(std::sync::atomic::Ordering::Relaxed),
        Verbosity::Verbose => true,
    }
}

/// A stage's full table: always to `path`, to stdout when `detail()`.
pub fn table(path: &Path, text: &str) -> Result<()> {
    write_file(path, format!("{text}\n"))?;
    if detail() {
        println!("{text}");
    }
    Ok(())
}

pub fn verbosity() -> Verbosity {
    match VERBOSITY.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Verbosity::Quiet,
        1 => Verbosity::Normal,
        _ => Verbosity::Verbose,
    }
}

pub use fa_schema::file::{write_atomic, write_file};

/// An advisory lock on a file (flock), released when dropped or when the process
/// ends however it ends; the file names its holder for anyone who waits.
pub struct Lock {
    _file: std::fs::File,
}

impl Lock {
    fn open(path: &Path) -> Result<std::fs::File> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))
    }

    fn held(mut file: std::fs::File, what: &str) -> Lock {
        let _ = file.set_len(0).and_then(|()| write!(file, "pid {}: {what}", std::process::id()));
        Lock { _file: file }
    }

    /// The lock, or `Ok(Err(holder))` naming who holds it.
    pub fn try_hold(path: &Path, what: &str) -> Result<Result<Lock, String>> {
        let file = Lock::open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Ok(Lock::held(file, what))),
            Err(std::fs::TryLockError::WouldBlock) => {
                Ok(Err(fa_schema::file::read_text(path).unwrap_or_default().trim().to_string()))
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    /// The lock, waiting for its holder (named once on stderr) to let go.
    pub fn hold(path: &Path, what: &str) -> Result<Lock> {
        if let Ok(lock) = Lock::try_hold(path, what)? {
            return Ok(lock);
        }
        let file = Lock::open(path)?;
        let holder = fa_schema::file::read_text(path).unwrap_or_default();
        eprintln!("xtask: waiting for {} ({})", path.display(), holder.trim());
        file.lock().with_context(|| format!("locking {}", path.display()))?;
        Ok(Lock::held(file, what))
    }
}

/// The process groups of the children running now, with their command lines.
static RUNNING: std::sync::Mutex<Vec<(libc::pid_t, String)>> = std::sync::Mutex::new(Vec::new());

/// A child's entry in `RUNNING`, removed when the child is done with.
struct Running(libc::pid_t);

impl Running {
    fn register(pgid: libc::pid_t, shown: &str) -> Running {
        RUNNING.lock().unwrap_or_else(|e| e.into_inner()).push((pgid, shown.to_string()));
        tell_reaper(&format!("+{pgid}"));
        Running(pgid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.lock().unwrap_or_else(|e| e.into_inner()).retain(|(g, _)| *g != self.0);
        tell_reaper(&format!("-{}", self.0));
    }
}

/// The argument that turns an xtask process into the reaper of its parent.
pub const REAPER_ARG: &str = "__reap-children";

/// The write end of the reaper's stdin, once `start_reaper` ran.
static REAPER: std::sync::Mutex<Option<std::process::ChildStdin>> = std::sync::Mutex::new(None);

fn tell_reaper(line: &str) {
    if let Some(pipe) = REAPER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = writeln!(pipe, "{line}");
    }
}

/// Starts a second xtask process (`xtask __reap-children`) that learns of every
/// child process group as it starts and ends, and kills those still running
/// when its stdin closes: when this process is gone however it went, SIGKILL
/// included, which no handler here can catch.
pub fn start_reaper() -> Result<()> {
    let exe = std::env::current_exe().context("finding xtask's own executable for its reaper")?;
    let child = std::process::Command::new(exe)
        .arg(REAPER_ARG)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .context("starting xtask's reaper of its children")?;
    *REAPER.lock().unwrap_or_else(|e| e.into_inner()) = child.stdin;
    Ok(())
}

/// The reaper's whole life: groups in (`+pgid`), groups out (`-pgid`), and at the
/// end of its input every group still in is killed. Signals meant for xtask (a
/// terminal's Ctrl-C reaches its whole process group) do not stop it early.
pub fn reap() -> std::process::ExitCode {
    use std::io::BufRead;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: setting a signal's disposition to SIG_IGN runs no code in a handler.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut groups = std::collections::BTreeSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (sign, pgid) = line.split_at(line.len().min(1));
        match (sign, pgid.parse::<libc::pid_t>()) {
            ("+", Ok(g)) if g > 1 => groups.insert(g),
            ("-", Ok(g)) => groups.remove(&g),
            _ => false,
        };
    }
    for g in groups {
        kill_group(g);
    }
    std::process::ExitCode::SUCCESS
}

/// On SIGINT, SIGTERM, SIGHUP (a closed terminal or ssh session) or SIGQUIT:
/// kill every child process group still running, say which, and exit 128 + the
/// signal. Call once, first thing in `main`.
pub fn on_signals() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
        .context("installing signal handlers")?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let running = std::mem::take(&mut *RUNNING.lock().unwrap_or_else(|e| e.into_inner()));
            for (pgid, _) in &running {
                kill_group(*pgid);
            }
            let name = match sig {
                SIGINT => "SIGINT",
                SIGTERM => "SIGTERM",
                SIGHUP => "SIGHUP",
                _ => "SIGQUIT",
            };
            let stopped: Vec<&str> = running.iter().map(|(_, shown)| shown.as_str()).collect();
            if stopped.is_empty() {
                eprintln!("xtask: {name}: stopped");
            } else {
                eprintln!("xtask: {name}: stopped {} running command(s): {}", stopped.len(), stopped.join("; "));
            }
            std::process::exit(128 + sig);
        }
    });
    Ok(())
}

fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

type Reader = std::thread::JoinHandle<String>;

fn drain<R: Read + Send + 'static>(
    mut p: R,
    mut echo: Option<Box<dyn Write + Send>>,
    hook: Option<LineHook>,
) -> Reader {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let mut line_start = 0;
        while let Ok(n) = p.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if let Some(out) = echo.as_mut() {
                let _ = out.write_all(&chunk[..n]);
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(hook) = &hook {
                while let Some(nl) = buf[line_start..].iter().position(|&b| b == b'\n') {
                    hook(String::from_utf8_lossy(&buf[line_start..line_start + nl]).trim_end_matches('\r'));
                    line_start += nl + 1;
                }
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

fn join(reader: Reader) -> String {
    reader.join().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_is_never_written_in_place() {
        // A second name for the old file: an in-place write (truncate, write) would
        // show through it, as a killed `--save-baseline` would leave half a file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline.json");
        write_file(&path, "old").unwrap();
        std::fs::hard_link(&path, dir.path().join("witness")).unwrap();
        write_file(&path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(dir.path().join("witness")).unwrap(), "old");
    }

    #[test]
    fn write_file_replaces_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/baseline.json");
        write_file(&path, "old").unwrap();
        write_file(&path, "new").unwrap();
        let sub = dir.path().join("sub");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(&sub).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["baseline.json"]);
    }

    #[test]
    fn captures_output_and_status() {
        let out = Cmd::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]).quiet().run().unwrap();
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.status.code(), Some(3));
        assert!(Cmd::new("false").quiet().run_checked().is_err());
    }

    #[test]
    fn output_lines_reach_the_hook_as_they_arrive_and_are_still_captured() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook = seen.clone();
        let out = Cmd::new("sh")
            .args(["-c", "printf 'a\\n' >&2; sleep 0.2; printf 'b\\r\\nc' >&2; sleep 0.2; echo out"])
            .quiet()
            .on_line(move |l| hook.lock().unwrap().push(l.to_string()))
            .run()
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), ["a", "b", "out"], "an unterminated last line is not a line yet");
        assert_eq!(out.stderr, "a\nb\r\nc");
        assert_eq!(out.stdout, "out\n");
    }

    #[test]
    fn timeout_kills_the_whole_tree() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("grandchild.pid");
        // The child starts a grandchild that would outlive it, then hangs.
        let script = format!("sleep 300 & echo $! > {}; echo started; sleep 300", marker.display());
        let start = Instant::now();
        let err =
            Cmd::new("sh").args(["-c", &script]).timeout(Duration::from_secs(1)).quiet().run().unwrap_err().to_string();
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "took {took:?}");
        assert!(err.contains("timed out after 1 s"), "{err}");
        assert!(err.contains("started"), "{err}");
        let pid: libc::pid_t = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        // Give the kernel a moment to reap, then the grandchild must be gone.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
        assert!(!alive, "grandchild {pid} survived the timeout");
    }

    fn is_zombie(pid: libc::pid_t) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(true)
    }

    #[test]
    fn a_session_answers_line_by_line_and_its_group_dies_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("grandchild.pid");
        let script =
            format!("sleep 300 & echo $! > {}; echo hello; while read l; do echo \"got $l\"; done", marker.display());
        let mut s = Cmd::new("sh").args(["-c", &script]).log(dir.path().join("s.log")).quiet().session().unwrap();
        assert_eq!(s.read_line(Duration::from_secs(5)).unwrap(), "hello");
        assert_eq!(s.request("x", Duration::from_secs(5)).unwrap(), "got x");
        let pid: libc::pid_t = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        drop(s);
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
        assert!(!alive, "grandchild {pid} survived the session");
    }

    #[test]
    fn a_silent_or_dead_session_is_an_error_naming_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("s.log");
        let mut s = Cmd::new("sh").args(["-c", "echo oops >&2; sleep 300"]).log(&log).quiet().session().unwrap();
        let err = s.request("x", Duration::from_millis(300)).unwrap_err().to_string();
        assert!(err.contains("no answer within 0.3 s") && err.contains("oops"), "{err}");
        let mut s = Cmd::new("sh").args(["-c", "exit 4"]).log(&log).quiet().session().unwrap();
        let err = s.read_line(Duration::from_secs(5)).unwrap_err().to_string();
        assert!(err.contains("ended (exit status: 4)"), "{err}");
    }

    #[test]
    fn missing_program_is_a_clear_error() {
        let err = Cmd::new("/nonexistent/tool").quiet().run().unwrap_err();
        assert!(format!("{err:#}").contains("could not start `/nonexistent/tool`"));
    }
}
