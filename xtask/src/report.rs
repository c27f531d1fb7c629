//! Report envelope and the typed payloads xtask writes under `target/xtask/`.
//! One module for writer and reader, so the schema lives in one place. It runs
//! nothing: the git state and the kernel set come in as values
//! (`tools::process::git_state`, `compile::kernel_set::record`).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use fa_schema::file::write_file;

/// Bumped whenever a payload changes shape.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub schema_version: u32,
    /// `build`, `test`, …
    pub kind: String,
    pub git_rev: String,
    pub git_dirty: bool,
    /// RFC 3339, UTC.
    pub timestamp: String,
    pub host: String,
    pub toolchain: Toolchain,
    /// The GPU used, where one was.
    pub device: Option<Device>,
    /// The kernels the run loaded, where it loaded any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_set: Option<KernelSetRecord>,
    pub payload: T,
}

/// Which kernel set a report judged: its folder and the sources it was built from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelSetRecord {
    pub dir: String,
    /// `kernel_set::sources_hash`; absent for a folder without `kernel-set.json`.
    pub sources: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defines: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Toolchain {
    pub nvcc: Option<String>,
    pub nvcc_path: Option<String>,
    pub driver: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    pub compute_capability: String,
    pub sm_count: u32,
    /// CUDA's device UUID, `GPU-…`: the GPU the run used, whichever ordinal it had.
    #[serde(default)]
    pub uuid: Option<String>,
}

impl From<&fa_schema::schema::DeviceInfo> for Device {
    fn from(d: &fa_schema::schema::DeviceInfo) -> Device {
        Device {
            name: d.name.clone(),
            compute_capability: d.compute_capability.clone(),
            sm_count: d.sm_count,
            uuid: d.uuid.clone(),
        }
    }
}

/// The checkout a report was made from: `XTASK_GIT_REV` where set, else git's HEAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitState {
    pub rev: String,
    /// Tracked files differ from HEAD.
    pub dirty: bool,
}

impl<T: Serialize> Envelope<T> {
    pub fn new(kind: &str, git: GitState, toolchain: Toolchain, device: Option<Device>, payload: T) -> Self {
        Envelope {
            schema_version: SCHEMA_VERSION,
            kind: kind.to_string(),
            git_rev: git.rev,
            git_dirty: git.dirty,
            timestamp: rfc3339(SystemTime::now()),
            host: fa_schema::file::read_text(Path::new("/proc/sys/kernel/hostname"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            toolchain,
            device,
            kernel_set: None,
            payload,
        }
    }

    /// Records the kernel set the report judged.
    pub fn kernels(mut self, set: KernelSetRecord) -> Self {
        self.kernel_set = Some(set);
        self
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        write_file(path, serde_json::to_string_pretty(self)? + "\n")
    }
}

/// Reads a JSON file another process wrote; errors name the file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fa_schema::file::read_text(path)?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `(rev, dirty)`. `XTASK_GIT_REV` overrides, for copies of the tree without `.git`
/// (the GPU machine).
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t.max(UNIX_EPOCH)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_303_647);
        assert_eq!(rfc3339(t), "2026-11-21T23:27:27Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(5)), "1970-01-01T00:00:00Z");
    }
}
