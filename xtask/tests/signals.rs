//! Ctrl-C, SIGTERM, SIGHUP or SIGQUIT to xtask stops every child tree it
//! started, and so does SIGKILL (through its reaper): the real `xtask build`,
//! with a stand-in nvcc that leaves a grandchild, is signalled mid-compile; it
//! must exit 128 + the signal naming what it stopped, and leave no process.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn alive(pid: i32) -> bool {
    // A zombie waiting for its reaper is gone for this purpose.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// Signals a build mid-compile; its exit status, stderr and the processes left.
fn signal_a_build(sig: i32) -> (std::process::ExitStatus, String, Vec<i32>) {
    let dir = tempfile::tempdir().unwrap();
    common::one_kernel_checkout(dir.path());
    let pids = dir.path().join("pids");
    let nvcc = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/process/nvcc");
    let xtask = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("build")
        .env("XTASK_ROOT", dir.path())
        .env_remove("CARGO_TARGET_DIR")
        .env("NVCC", &nvcc)
        .env("FA_TEST_PIDS", &pids)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let recorded = loop {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let found: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if found.len() == 2 {
            break found;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the stand-in nvcc never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: kill(2) on the xtask child this test started.
    assert_eq!(unsafe { libc::kill(xtask.id() as i32, sig) }, 0);
    let out = xtask.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    while recorded.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    (out.status, stderr, recorded.into_iter().filter(|&p| alive(p)).collect())
}

#[test]
fn each_catchable_signal_stops_every_child_tree_and_exits_128_plus_it() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP"), (libc::SIGQUIT, "SIGQUIT")] {
        let (status, stderr, left) = signal_a_build(sig);
        assert_eq!(status.code(), Some(128 + sig), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{name}: stopped 1 running command(s)")) && stderr.contains("nvcc"),
            "{stderr}"
        );
        assert!(left.is_empty(), "{name}: left running: {left:?}");
    }
}

#[test]
fn sigkill_leaves_no_child_behind() {
    use std::os::unix::process::ExitStatusExt;
    let (status, stderr, left) = signal_a_build(libc::SIGKILL);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{stderr}");
    assert!(left.is_empty(), "the reaper left running: {left:?}");
}
