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

/// `--gpus all|N|LIST`: every listed GPU, the first N, or the named indices and
/// UUIDs (one index needs a comma: `1,`). Checked when the flag is parsed; which
/// GPUs exist is checked by `choose`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSpec {
    All,
    Count(usize),
    /// Indices (`0`) and UUIDs (`GPU-…`), each once, in the order named.
    List(Vec<String>),
}

impl std::str::FromStr for GpuSpec {
    type Err = String;
    fn from_str(spec: &str) -> Result<GpuSpec, String> {
        if spec == "all" {
            return Ok(GpuSpec::All);
        }
        if let Ok(n) = spec.parse::<usize>() {
            if n == 0 {
                return Err("a number counts GPUs and is at least 1; name GPU 0 by its index with a comma (0,)".into());
            }
            return Ok(GpuSpec::Count(n));
        }
        let mut items: Vec<String> = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if items.iter().any(|i| i == item) {
                return Err(format!("GPU {item} named twice"));
            }
            items.push(item.to_string());
        }
        if items.is_empty() {
            return Err(format!("{spec:?} names no GPU; use all, a count N, or indices/UUIDs such as 0,2"));
        }
        Ok(GpuSpec::List(items))
    }
}

impl GpuSpec {
    /// The GPUs of `listed` this names, in the order named.
    pub fn choose(&self, listed: &[ListedGpu]) -> Result<Vec<ListedGpu>, String> {
        let items = match self {
            GpuSpec::All => return Ok(listed.to_vec()),
            GpuSpec::Count(n) if *n > listed.len() => {
                return Err(format!(
                    "--gpus {n}: a number counts GPUs, 1 to the {} this machine lists; name one GPU by its \
                     index with a comma (--gpus {n},) or by UUID",
                    listed.len()
                ));
            }
            GpuSpec::Count(n) => return Ok(listed[..*n].to_vec()),
            GpuSpec::List(items) => items,
        };
        let mut chosen: Vec<ListedGpu> = Vec::new();
        for item in items {
            let gpu = match item.parse::<usize>() {
                Ok(i) => listed.get(i),
                Err(_) => listed.iter().find(|g| !g.uuid.is_empty() && g.uuid == *item),
            }
            .ok_or_else(|| format!("--gpus: no GPU {item} (nvidia-smi -L lists {})", listed.len()))?;
            if chosen.contains(gpu) {
                return Err(format!("--gpus: GPU {item} named twice"));
            }
            chosen.push(gpu.clone());
        }
        Ok(chosen)
    }
}

/// One worker per GPU `spec` names, or one on the run's device (`None`: the
/// `--device` GPU, or the one CUDA picks).
pub fn workers(spec: Option<&GpuSpec>, device: Option<&str>, task: &str) -> anyhow::Result<Vec<Option<ListedGpu>>> {
    let Some(spec) = spec else { return Ok(vec![None]) };
    if device.is_some() {
        return Err(
            crate::errors::CannotRun("--device (or FA_DEVICE) and --gpus both choose GPUs: use one".into()).into()
        );
    }
    let listed = list(task)?;
    Ok(spec.choose(&listed).map_err(crate::errors::CannotRun)?.into_iter().map(Some).collect())
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

    #[test]
    fn gpu_lists_parse_or_say_the_rule_and_choose_what_exists() {
        use super::{GpuSpec, ListedGpu};
        let gpus = |n: usize| -> Vec<ListedGpu> {
            (0..n).map(|i| ListedGpu { name: "NVIDIA H200".into(), uuid: format!("GPU-{i}") }).collect()
        };
        let choose = |s: &str, n| s.parse::<GpuSpec>().and_then(|g| g.choose(&gpus(n)));
        assert_eq!(choose("all", 3).unwrap().len(), 3);
        assert_eq!(choose("2", 3).unwrap(), gpus(2));
        assert_eq!(choose("2,GPU-0", 3).unwrap(), vec![gpus(3)[2].clone(), gpus(3)[0].clone()]);
        assert!(choose("4", 3).unwrap_err().contains("the 3 this machine lists"));
        assert_eq!(choose("0,", 3).unwrap(), gpus(1));
        assert_eq!(choose("2,", 3).unwrap(), vec![gpus(3)[2].clone()]);
        assert!(choose("GPU-9", 3).is_err());
        assert!(choose("0,GPU-0", 3).unwrap_err().contains("twice"));
        // What needs no GPU list is refused when the flag is parsed.
        assert!("0".parse::<GpuSpec>().unwrap_err().contains("(0,)"));
        assert!(",".parse::<GpuSpec>().unwrap_err().contains("names no GPU"));
        assert!("1,1".parse::<GpuSpec>().unwrap_err().contains("twice"));
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
