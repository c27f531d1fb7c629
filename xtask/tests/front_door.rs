//! A GPU task on a machine with no GPU says so before it builds anything: the
//! real xtask, with no nvidia-smi on PATH and a stand-in nvcc that records
//! every start, must exit 2 at once with nvcc never run.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn gpu_tasks_refuse_before_building_where_there_is_no_gpu() {
    let dir = tempfile::tempdir().unwrap();
    common::one_kernel_checkout(dir.path());
    let (pids, empty) = (dir.path().join("pids"), dir.path().join("empty-path"));
    std::fs::create_dir_all(&empty).unwrap();
    let nvcc = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/process/nvcc");
    for task in ["test", "sanitize", "bench", "tune"] {
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg(task)
            .env("XTASK_ROOT", dir.path())
            .env_remove("CARGO_TARGET_DIR")
            .env("PATH", &empty)
            .env("NVCC", &nvcc)
            .env("FA_TEST_PIDS", &pids)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{task}: {stderr}");
        assert!(stderr.contains(&format!("`{task}` needs a GPU")), "{task}: {stderr}");
        assert!(start.elapsed() < Duration::from_secs(20), "{task} took {:?}", start.elapsed());
        assert!(!pids.exists(), "{task} started nvcc before refusing");
    }
}

#[test]
fn a_bad_value_and_a_missing_tool_are_said_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    common::one_kernel_checkout(dir.path());
    let (pids, empty) = (dir.path().join("pids"), dir.path().join("empty-path"));
    std::fs::create_dir_all(&empty).unwrap();
    let nvcc = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/process/nvcc");
    let xtask = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(args)
            .env("XTASK_ROOT", dir.path())
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("NVCC_CCBIN")
            .env("PATH", &empty)
            .env("NVCC", &nvcc)
            .env("FA_TEST_PIDS", &pids)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // clap refuses a value against the launch API's rules: exit 2, the rule named.
    let (code, stderr) = xtask(&["bench", "--shape", "1,1,128,80"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("head dim is 80"), "{stderr}");
    let (code, stderr) = xtask(&["test", "--gpus", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
    // No host compiler: said with what to install, before nvcc starts.
    let (code, stderr) = xtask(&["build"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("gcc and g++, not found on PATH") && stderr.contains("apt install g++"), "{stderr}");
    assert!(!pids.exists(), "nvcc started");
}
