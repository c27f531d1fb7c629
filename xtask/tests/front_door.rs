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
