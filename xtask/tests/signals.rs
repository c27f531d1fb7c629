//! Ctrl-C or SIGTERM to xtask stops every child tree it started: the real
//! `xtask build`, with a stand-in nvcc that leaves a grandchild, is signalled
//! mid-compile; it must exit 143 naming what it stopped, and leave no process.

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

#[test]
fn sigterm_stops_every_child_tree_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = dir.path().join("kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::write(kernels.join("one.cu"), "extern \"C\" __global__ void one() {}\n").unwrap();
    std::fs::write(
        kernels.join("manifest.json"),
        r#"{"static_smem_limit": 49152,
            "archs": {"sm_89": {"gencode": "arch=compute_89,code=sm_89", "smem_optin_limit": 101376}},
            "sources": [{"file": "one.cu", "archs": ["sm_89"], "kernels": [{"entry": "one", "max_registers": 255}]}]}"#,
    )
    .unwrap();
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
    assert_eq!(unsafe { libc::kill(xtask.id() as i32, libc::SIGTERM) }, 0);
    let out = xtask.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("SIGTERM: stopped 1 running command(s)") && stderr.contains("nvcc"), "{stderr}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while recorded.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = recorded.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "left running: {left:?}");
}
