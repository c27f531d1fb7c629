//! The kernel set a run judges: a folder of fatbins, its `manifest.json` copy,
//! and `kernel-set.json`, which names the sources they were built from (one
//! hash over the manifest, every kernel source and header, and the extra
//! defines). Every GPU stage loads the set from `Paths::kernels` and records it
//! in its report; a stage handed a prebuilt set (`--kernels DIR`) refuses one
//! built from other sources than the checkout's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::errors::CheckFailed;
use crate::paths::Paths;
use crate::report::read_json;
use crate::tools::process::write_file;

pub const FILE: &str = "kernel-set.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelSet {
    /// sha256 of the sources the fatbins were built from (see `sources_hash`).
    pub sources: String,
    /// The extra `--define`s of the build (planted defects, experiments).
    pub defines: Vec<String>,
    /// The folder, as this run found it (not stored in the file).
    #[serde(default, skip_serializing)]
    pub dir: PathBuf,
}

/// One hash over `manifest`, every `.cu`, `.cuh` and `.h` file in `src_dir`
/// (by name, in name order) and `defines`, each part length-prefixed.
pub fn sources_hash(manifest: &Path, src_dir: &Path, defines: &[String]) -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(src_dir)
        .with_context(|| format!("listing {}", src_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "cu" || x == "cuh" || x == "h"))
        .collect();
    files.sort();
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(&std::fs::read(manifest).with_context(|| format!("reading {}", manifest.display()))?);
    for f in &files {
        part(f.file_name().unwrap_or_default().as_encoded_bytes());
        part(&std::fs::read(f).with_context(|| format!("reading {}", f.display()))?);
    }
    for d in defines {
        part(d.as_bytes());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `out_dir/kernel-set.json` for a build of `manifest` (sources beside it).
pub fn record(out_dir: &Path, manifest: &Path, src_dir: &Path, defines: &[String]) -> Result<()> {
    let set = KernelSet {
        sources: sources_hash(manifest, src_dir, defines)?,
        defines: defines.to_vec(),
        dir: PathBuf::new(),
    };
    write_file(&out_dir.join(FILE), serde_json::to_string_pretty(&set)? + "\n")
}

/// The kernel set in `dir`, where one was recorded.
pub fn load(dir: &Path) -> Option<KernelSet> {
    read_json::<KernelSet>(&dir.join(FILE)).ok().map(|s| KernelSet { dir: dir.to_path_buf(), ..s })
}

/// The run's kernel set: the prebuilt one in `paths.kernels`, checked against the
/// checkout's sources, or a fresh build into it.
pub fn prepare(paths: &Paths, build: &crate::build::Options, prebuilt: bool) -> Result<()> {
    if !prebuilt {
        return crate::build::run(paths, build);
    }
    let set = verify(paths)?;
    eprintln!("xtask: kernels from {} (sources {})", set.dir.display(), &set.sources[..12.min(set.sources.len())]);
    Ok(())
}

/// The prebuilt set in `paths.kernels`, checked against the checkout's sources.
pub fn verify(paths: &Paths) -> Result<KernelSet> {
    let dir = &paths.kernels;
    let Some(set) = load(dir) else {
        bail!(
            "{} holds no {FILE}: it was not built by this xtask's `build`; rebuild it with \
             `cargo xtask build --out-dir {}`",
            dir.display(),
            dir.display()
        );
    };
    let manifest = paths.manifest();
    let src_dir = manifest.parent().unwrap_or(Path::new("."));
    let want = sources_hash(&manifest, src_dir, &set.defines)?;
    if set.sources != want {
        return Err(CheckFailed(format!(
            "the kernel set in {} was built from other sources than {} (sources hash {} here, {} there); \
             rebuild it with `cargo xtask build --out-dir {}` or drop --kernels to build into target/kernels",
            dir.display(),
            src_dir.display(),
            &want[..12],
            &set.sources[..set.sources.len().min(12)],
            dir.display()
        ))
        .into());
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkout(dir: &Path) -> Paths {
        let kernels = dir.join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        std::fs::write(kernels.join("manifest.json"), "{}").unwrap();
        std::fs::write(kernels.join("a.cu"), "kernel a").unwrap();
        std::fs::write(kernels.join("a.cuh"), "header").unwrap();
        let target = dir.join("target");
        Paths { root: dir.to_path_buf(), cuda_wheels: target.join("cuda"), kernels: dir.join("prebuilt"), target }
    }

    #[test]
    fn a_set_from_other_sources_is_refused_and_one_from_these_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = checkout(tmp.path());
        let src = tmp.path().join("kernels");
        let err = verify(&paths).unwrap_err().to_string();
        assert!(err.contains("no kernel-set.json") && err.contains("--out-dir"), "{err}");

        record(&paths.kernels, &src.join("manifest.json"), &src, &[]).unwrap();
        assert_eq!(verify(&paths).unwrap().dir, paths.kernels);

        for (file, text) in [("a.cuh", "edited header"), ("b.cu", "a new source"), ("manifest.json", "{ }")] {
            let before = std::fs::read(src.join(file)).ok();
            std::fs::write(src.join(file), text).unwrap();
            let err = verify(&paths).unwrap_err();
            assert!(err.downcast_ref::<CheckFailed>().is_some(), "{file}: {err:#}");
            assert!(err.to_string().contains("built from other sources"), "{err}");
            match before {
                Some(b) => std::fs::write(src.join(file), b).unwrap(),
                None => std::fs::remove_file(src.join(file)).unwrap(),
            }
        }
        assert!(verify(&paths).is_ok());

        // A set built with a planted define is not the checkout's own build...
        record(&paths.kernels, &src.join("manifest.json"), &src, &["FA_PLANT=1".into()]).unwrap();
        let set = verify(&paths).unwrap();
        assert_eq!(set.defines, ["FA_PLANT=1"], "…and says so in what it records");
        assert_ne!(set.sources, sources_hash(&src.join("manifest.json"), &src, &[]).unwrap());
    }
}
