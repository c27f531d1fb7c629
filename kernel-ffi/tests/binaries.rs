//! The binaries as a user meets them, on any machine: what must be refused is
//! refused before the first CUDA call (so with exit 2 and the real reason even
//! without a GPU), reads are bounded, kernels are found in the checkout, and a
//! closed pipe ends a listing quietly.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use safetensors::{Dtype, tensor::TensorView};

const FA_RUN: &str = env!("CARGO_BIN_EXE_fa-run");
const FA_BENCH: &str = env!("CARGO_BIN_EXE_fa-bench");
const FA_TEST: &str = env!("CARGO_BIN_EXE_fa-test");
const MANIFEST: &str = include_str!("../../kernels/manifest.json");

/// A fresh folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("binaries-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `cmd`, killing it after `limit` (a read without bound never ends).
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Exit code and stderr; asserts no panic.
fn outcome(out: &Output) -> (Option<i32>, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code(), stderr)
}

/// A safetensors file of zero-filled f16 tensors.
fn qkv_file(path: &Path, tensors: &[(&str, Vec<usize>)]) {
    let data: Vec<Vec<u8>> = tensors.iter().map(|(_, s)| vec![0u8; 2 * s.iter().product::<usize>()]).collect();
    let views: Vec<_> = tensors
        .iter()
        .zip(&data)
        .map(|((name, shape), d)| (*name, TensorView::new(Dtype::F16, shape.clone(), d).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn fa_run(dir: &Path, input: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(FA_RUN);
    cmd.arg("--input").arg(input).arg("--output").arg(dir.join("out.safetensors")).args(extra);
    cmd.env("FA_KERNEL_DIR", dir.join("no-kernels")).env_remove("CARGO_TARGET_DIR");
    cmd
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn fa_run_reports_a_shape_the_kernels_cannot_run_as_such() {
    let dir = scratch("shape");
    let input = dir.join("qkv.safetensors");
    let t = vec![1, 2, 8, 80];
    qkv_file(&input, &[("q", t.clone()), ("k", t.clone()), ("v", t)]);
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, &input, &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("q head dim is 80; the kernels support head dims [64, 96, 128, 192, 256]"), "{stderr}");
    qkv_file(&input, &[("q", vec![1, 4, 8, 64]), ("k", vec![1, 3, 8, 64]), ("v", vec![1, 3, 8, 64])]);
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, &input, &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("q heads (4) must be a multiple of k/v heads (3)"), "{stderr}");
}

#[test]
fn fa_run_reads_no_further_than_the_file_holds() {
    let dir = scratch("bounded");
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, Path::new("/dev/zero"), &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/dev/zero is a character device, not a regular file"), "{stderr}");
    // A header that claims a terabyte.
    let input = dir.join("claims.safetensors");
    std::fs::write(&input, [(1u64 << 40).to_le_bytes().as_slice(), b"{}"].concat()).unwrap();
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, &input, &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("declare a header of 1099511627776 bytes"), "{stderr}");
    // A file cut short: its last tensor lies past the end.
    qkv_file(&input, &[("q", vec![1, 1, 8, 64]), ("k", vec![1, 1, 8, 64]), ("v", vec![1, 1, 8, 64])]);
    let bytes = std::fs::read(&input).unwrap();
    std::fs::write(&input, &bytes[..bytes.len() - 100]).unwrap();
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, &input, &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("truncated or corrupt safetensors file") && stderr.contains("claims data bytes"),
        "{stderr}"
    );
}

/// A FIFO at `path`, which a reader without `O_NONBLOCK` would wait on forever.
fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn fifos_devices_and_folders_are_refused_as_inputs_and_outputs_without_hanging() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("special");
    let f = dir.join("fifo");
    fifo(&f);
    let (code, stderr) = outcome(&run(&mut fa_run(&dir, &f, &[]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is a FIFO, not a regular file"), "{stderr}");
    for cases in [f.as_path(), Path::new("/dev/zero")] {
        let (code, stderr) = outcome(&run(Command::new(FA_TEST).arg("--cases").arg(cases).arg("--list"), LIMIT));
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("--cases") && stderr.contains("not a regular file"), "{stderr}");
    }
    for target in [f.as_path(), dir.as_path()] {
        let (code, stderr) = outcome(&run(Command::new(FA_TEST).args(["--list", "--json"]).arg(target), LIMIT));
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("--json") && stderr.contains("must name a regular file"), "{stderr}");
    }
    assert!(std::fs::symlink_metadata(&f).unwrap().file_type().is_fifo(), "the FIFO was not replaced");
    let input = dir.join("qkv.safetensors");
    let t = vec![1, 2, 8, 64];
    qkv_file(&input, &[("q", t.clone()), ("k", t.clone()), ("v", t)]);
    let mut cmd = Command::new(FA_RUN);
    cmd.arg("--input").arg(&input).arg("--output").arg(&f).env("FA_KERNEL_DIR", "/nonexistent");
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--output") && stderr.contains("is a FIFO"), "{stderr}");
}

#[test]
fn a_kernel_set_whose_build_did_not_finish_is_not_loaded() {
    let dir = scratch("torn");
    let kernels = dir.join("kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::write(kernels.join("manifest.json"), MANIFEST).unwrap();
    let input = dir.join("qkv.safetensors");
    let t = vec![1, 2, 8, 64];
    qkv_file(&input, &[("q", t.clone()), ("k", t.clone()), ("v", t)]);
    let mut cmd = fa_run(&dir, &input, &[]);
    cmd.env("FA_KERNEL_DIR", &kernels);
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("holds no kernel-set.json: its last build did not finish"), "{stderr}");
}

#[test]
fn fa_run_finds_the_kernels_of_the_checkout_it_runs_in() {
    let dir = scratch("checkout");
    let kernels = dir.join("target/kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::create_dir_all(dir.join("kernels")).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("kernels/manifest.json"), MANIFEST).unwrap();
    std::fs::write(kernels.join("manifest.json"), MANIFEST).unwrap();
    let input = dir.join("qkv.safetensors");
    let t = vec![1, 2, 8, 64];
    qkv_file(&input, &[("q", t.clone()), ("k", t.clone()), ("v", t)]);
    // `--block-m 96` stops it before CUDA, naming the manifest it checked.
    let mut cmd = fa_run(&dir, &input, &["--block-m", "96"]);
    cmd.env_remove("FA_KERNEL_DIR").current_dir(dir.join("sub"));
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    let want = format!("checking the flags against {}: --block-m 96:", kernels.join("manifest.json").display());
    assert!(stderr.contains(&want), "{stderr}");
    // FA_KERNEL_DIR, where set, is the only place looked.
    let mut cmd = fa_run(&dir, &input, &[]);
    cmd.current_dir(dir.join("sub"));
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("FA_KERNEL_DIR=") && stderr.contains("no-kernels holds no manifest.json"), "{stderr}");
}

#[test]
fn fa_bench_reports_bad_shapes_and_flags_as_such() {
    let dir = scratch("bench");
    let (code, stderr) = outcome(&run(Command::new(FA_BENCH).args(["--shape", "1,1,128,80"]), LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("q head dim is 80"), "{stderr}");
    std::fs::write(dir.join("manifest.json"), MANIFEST).unwrap();
    let mut cmd = Command::new(FA_BENCH);
    cmd.args(["--shape", "1,1,128,64", "--variant", "hopper", "--key-groups", "2"]).env("FA_KERNEL_DIR", &dir);
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--variant hopper --key-groups 2: no forward entry for f16 D=64 has that"), "{stderr}");
}

#[test]
fn a_fa_test_worker_without_kernels_says_so_and_does_not_wait() {
    // --worker reads case names from stdin only once its kernels are loaded.
    let mut cmd = Command::new(FA_TEST);
    cmd.arg("--worker").env("FA_KERNEL_DIR", "/nonexistent");
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent"), "{stderr}");
}

#[test]
fn fa_test_refuses_auto_when_parsing_its_flags() {
    let mut cmd = Command::new(FA_TEST);
    cmd.args(["--variant", "auto"]).env("FA_KERNEL_DIR", "/nonexistent");
    let (code, stderr) = outcome(&run(&mut cmd, LIMIT));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid value 'auto' for '--variant"), "{stderr}");
}

#[test]
fn fa_test_list_into_a_closed_pipe_ends_quietly() {
    // The full list is far longer than a pipe's buffer, so fa-test is still
    // writing when the reader goes away.
    let mut child = Command::new(FA_TEST)
        .arg("--list")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("f16-d64-"), "{first}");
    let out = child.wait_with_output().unwrap();
    let (code, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
