//! `kernel-set.json`, the record a finished `cargo xtask build` writes last into
//! its kernel folder: the sources it was built from and the sha256 of every file
//! it wrote (the manifest copy and each fatbin). A build removes it first, so a
//! failed or interrupted build leaves a folder without one; a loader checks every
//! file it reads against it, so new launch geometry is never run with old
//! fatbins, nor the other way round.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const FILE: &str = "kernel-set.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelSet {
    /// sha256 of the sources the fatbins were built from (xtask's `sources_hash`).
    pub sources: String,
    /// The extra `--define`s of the build (planted defects, experiments).
    pub defines: Vec<String>,
    /// sha256 of each file the build wrote into the folder, by file name.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

impl KernelSet {
    /// The set recorded in `dir`, or an error that says how to get a whole one.
    pub fn load(dir: &Path) -> Result<KernelSet> {
        let path = dir.join(FILE);
        let Some(text) = crate::file::read_text_if_exists(&path)? else {
            bail!(
                "{} holds no {FILE}: its last build did not finish (or it was not written by `cargo xtask \
                 build`), so its fatbins and manifest may not belong together; run `cargo xtask build`",
                dir.display()
            );
        };
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Refuses `bytes` as the folder's `name` unless the build recorded exactly them.
    pub fn check(&self, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
        let rebuild = "rebuild the set with `cargo xtask build`";
        match self.files.get(name) {
            None => {
                bail!("{} does not list {name} among the files its build wrote; {rebuild}", dir.join(FILE).display())
            }
            Some(want) if *want != sha256_hex(bytes) => bail!(
                "{} is not the file {FILE} records (it changed after the build finished); {rebuild}",
                dir.join(name).display()
            ),
            Some(_) => Ok(()),
        }
    }

    /// Reads `dir/name` (bounded, regular) and checks it against the record.
    pub fn read_checked(&self, dir: &Path, name: &str) -> Result<Vec<u8>> {
        let bytes = crate::file::read(&dir.join(name))?;
        self.check(dir, name, &bytes)?;
        Ok(bytes)
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_loaded_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let err = format!("{:#}", KernelSet::load(dir.path()).unwrap_err());
        assert!(err.contains("last build did not finish"), "{err}");
        std::fs::write(dir.path().join("k.sm_90a.fatbin"), b"fatbin").unwrap();
        let set = KernelSet {
            sources: "s".into(),
            defines: vec![],
            files: [("k.sm_90a.fatbin".to_string(), sha256_hex(b"fatbin"))].into(),
        };
        std::fs::write(dir.path().join(FILE), serde_json::to_string(&set).unwrap()).unwrap();
        let set = KernelSet::load(dir.path()).unwrap();
        assert_eq!(set.read_checked(dir.path(), "k.sm_90a.fatbin").unwrap(), b"fatbin");
        std::fs::write(dir.path().join("k.sm_90a.fatbin"), b"another build's fatbin").unwrap();
        let err = format!("{:#}", set.read_checked(dir.path(), "k.sm_90a.fatbin").unwrap_err());
        assert!(err.contains("changed after the build finished"), "{err}");
        std::fs::write(dir.path().join("manifest.json"), b"{}").unwrap();
        let err = format!("{:#}", set.read_checked(dir.path(), "manifest.json").unwrap_err());
        assert!(err.contains("does not list manifest.json"), "{err}");
    }
}
