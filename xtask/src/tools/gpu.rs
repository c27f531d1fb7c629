//! Is there a GPU here? Asked of `nvidia-smi`, so xtask never links CUDA.

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use crate::tools::process::Cmd;

/// For the commands that cannot run without a GPU: a `CannotRun` naming why.
pub fn require(task: &str) -> anyhow::Result<Vec<String>> {
    detect().map_err(|why| crate::errors::CannotRun(format!("`{task}` needs a GPU: {why}")).into())
}

/// `Ok(names)` when at least one GPU is visible, else `Err(reason)`: no driver,
/// or an nvidia-smi that fails or hangs (a broken driver), said as such.
pub fn detect() -> Result<Vec<String>, String> {
    detect_with(Path::new("nvidia-smi"), Duration::from_secs(30))
}

/// Every GPU `nvidia-smi -L` lists, with its UUID: what `--gpus` chooses from.
pub fn list(task: &str) -> anyhow::Result<Vec<ListedGpu>> {
    listed_with(Path::new("nvidia-smi"), Duration::from_secs(30))
        .map_err(|why| crate::errors::CannotRun(format!("`{task}` needs a GPU: {why}")).into())
}

fn detect_with(smi: &Path, timeout: Duration) -> Result<Vec<String>, String> {
    Ok(listed_with(smi, timeout)?.into_iter().map(|g| g.name).collect())
}

fn listed_with(smi: &Path, timeout: Duration) -> Result<Vec<ListedGpu>, String> {
    let out = match Cmd::new(smi).arg("-L").quiet().timeout(timeout).run() {
        Ok(out) => out,
        Err(e)
            if e.root_cause().downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == ErrorKind::NotFound) =>
        {
            return Err("nvidia-smi not found (no NVIDIA driver on this machine)".into());
        }
        Err(e) => return Err(format!("nvidia-smi did not answer: {e:#}")),
    };
    if !out.success() {
        return Err(format!("nvidia-smi -L failed ({}): {}", out.status, out.tail()));
    }
    let gpus = parse_list(&out.stdout);
    if gpus.is_empty() { Err("nvidia-smi lists no GPU".into()) } else { Ok(gpus) }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGpu {
    pub name: String,
    /// `GPU-…`; empty where nvidia-smi printed none.
    pub uuid: String,
}

/// `GPU 0: NVIDIA H200 (UUID: GPU-…)` lines → names and UUIDs, in index order.
pub fn parse_list(text: &str) -> Vec<ListedGpu> {
    text.lines()
        .filter_map(|l| l.strip_prefix("GPU "))
        .filter_map(|l| l.split_once(": "))
        .map(|(_, rest)| {
            let (name, uuid) = rest.split_once(" (UUID: ").unwrap_or((rest, ""));
            ListedGpu { name: name.trim().to_string(), uuid: uuid.trim_end().trim_end_matches(')').to_string() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_gpu_list() {
        let text = "GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA L4 (UUID: GPU-5678)\n";
        let names: Vec<String> = super::parse_list(text).into_iter().map(|g| g.name).collect();
        assert_eq!(names, vec!["NVIDIA H200", "NVIDIA L4"]);
        assert_eq!(super::parse_list(text)[1].uuid, "GPU-5678");
        assert!(super::parse_list("No devices were found\n").is_empty());
    }

    /// Committed stand-ins for a broken driver's nvidia-smi (no script is written at test time).
    #[test]
    fn a_failing_or_hanging_nvidia_smi_is_said_as_such() {
        use std::path::Path;
        use std::time::Duration;
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/process");
        let fails = super::detect_with(&data.join("nvidia-smi-fails"), Duration::from_secs(10)).unwrap_err();
        assert!(fails.contains("failed") && fails.contains("Failed to initialize NVML"), "{fails}");
        let hangs = super::detect_with(&data.join("nvidia-smi-hangs"), Duration::from_secs(1)).unwrap_err();
        assert!(hangs.contains("did not answer") && hangs.contains("timed out"), "{hangs}");
        let absent = super::detect_with(&data.join("no-such-nvidia-smi"), Duration::from_secs(1)).unwrap_err();
        assert!(absent.contains("not found"), "{absent}");
    }
}
