//! Is there a GPU here? Asked of `nvidia-smi`, so xtask never links CUDA.

use std::time::Duration;

use crate::process::Cmd;

/// For the commands that cannot run without a GPU: a `CannotRun` naming why.
pub fn require(task: &str) -> anyhow::Result<Vec<String>> {
    detect().map_err(|why| crate::CannotRun(format!("`{task}` needs a GPU: {why}")).into())
}

/// `Ok(names)` when at least one GPU is visible, else `Err(reason)`.
pub fn detect() -> Result<Vec<String>, String> {
    let out = Cmd::new("nvidia-smi")
        .arg("-L")
        .quiet()
        .timeout(Duration::from_secs(30))
        .run()
        .map_err(|_| "nvidia-smi not found (no NVIDIA driver on this machine)".to_string())?;
    if !out.success() {
        return Err(format!("nvidia-smi -L failed: {}", out.tail()));
    }
    let gpus = parse_list(&out.stdout);
    if gpus.is_empty() { Err("nvidia-smi lists no GPU".into()) } else { Ok(gpus) }
}

/// `GPU 0: NVIDIA H200 (UUID: GPU-…)` lines → names.
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("GPU "))
        .filter_map(|l| l.split_once(": "))
        .map(|(_, rest)| rest.split(" (UUID").next().unwrap_or(rest).trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_gpu_list() {
        let text = "GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA L4 (UUID: GPU-5678)\n";
        assert_eq!(super::parse_list(text), vec!["NVIDIA H200", "NVIDIA L4"]);
        assert!(super::parse_list("No devices were found\n").is_empty());
    }
}
