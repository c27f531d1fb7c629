//! The kernel set a run judges: a folder of fatbins, its `manifest.json` copy,
//! and `kernel-set.json`, which names the sources they were built from (one
//! hash over the manifest, every kernel source and header, and the extra
//! defines). Every GPU stage loads the set from `Run::kernels` and records it
//! in its report; a stage handed a prebuilt set (`--kernels DIR`) refuses one
//! built from other sources than the checkout's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::errors::CheckFailed;
use crate::run::Run;
use crate::tools::process::write_file;
pub use fa_schema::kernel_set::{FILE, KernelSet};
use fa_schema::manifest::Manifest;

/// What a report records of the kernel set in `dir`: the folder, and the
/// sources and defines it was built from where its record is readable.
pub fn reported(dir: &Path) -> crate::report::KernelSetRecord {
    let set = load(dir);
    crate::report::KernelSetRecord {
        dir: dir.display().to_string(),
        sources: set.as_ref().map(|s| s.sources.clone()),
        defines: set.map(|s| s.defines).unwrap_or_default(),
    }
}

/// One hash over `manifest`, every `.cu`, `.cuh` and `.h` file in `src_dir`
/// (by name, in name order) and `defines`, each part length-prefixed.
pub fn sources_hash(manifest: &Path, src_dir: &Path, defines: &[String]) -> Result<String> {
    let mut files = Vec::new();
    source_files(src_dir, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(&fa_schema::file::read(manifest)?);
    for f in &files {
        part(f.strip_prefix(src_dir).unwrap_or(f).as_os_str().as_encoded_bytes());
        part(&fa_schema::file::read(f)?);
    }
    for d in defines {
        part(d.as_bytes());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The `.cu`, `.cuh` and `.h` files under `dir`, in every folder but hidden ones.
pub fn source_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let (path, kind) = (e.path(), e.file_type().with_context(|| format!("reading {}", e.path().display()))?);
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            source_files(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "cu" || x == "cuh" || x == "h") {
            out.push(path);
        }
    }
    Ok(())
}

/// Opens a build of `out_dir`: the old record goes first, so the folder is not
/// loadable until `record` says the build finished.
pub fn begin(out_dir: &Path) -> Result<()> {
    match std::fs::remove_file(out_dir.join(FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", out_dir.join(FILE).display()))
        }
        _ => Ok(()),
    }
}

/// Finishes a build of `manifest` (read from `manifest_path`, sources in
/// `src_dir`) into `out_dir`: copies the manifest beside the fatbins, then
/// writes `kernel-set.json` with the hash of every file the set holds.
pub fn record(
    out_dir: &Path,
    manifest: &Manifest,
    manifest_path: &Path,
    src_dir: &Path,
    defines: &[String],
) -> Result<()> {
    // kernel-ffi launches from this copy, so fatbins and launch geometry travel together.
    write_file(&out_dir.join("manifest.json"), serde_json::to_string_pretty(manifest)? + "\n")?;
    let mut names = vec!["manifest.json".to_string()];
    names.extend(manifest.sources.iter().flat_map(|s| s.archs.iter().map(|a| s.fatbin(a))));
    let files = names
        .into_iter()
        .map(|n| Ok((n.clone(), fa_schema::kernel_set::sha256_hex(&fa_schema::file::read(&out_dir.join(&n))?))))
        .collect::<Result<_>>()?;
    let set = KernelSet { sources: sources_hash(manifest_path, src_dir, defines)?, defines: defines.to_vec(), files };
    write_file(&out_dir.join(FILE), serde_json::to_string_pretty(&set)? + "\n")
}

/// The kernel set in `dir`, where a finished build recorded one.
pub fn load(dir: &Path) -> Option<KernelSet> {
    KernelSet::load(dir).ok()
}

/// The run's kernel set: the prebuilt one in `cx.kernels`, checked against the
/// checkout's sources (and the build's `--manifest`, where it names one), or a
/// fresh build into it.
pub fn prepare(cx: &Run, build: &crate::compile::Options, prebuilt: bool) -> Result<()> {
    if !prebuilt {
        return crate::compile::run(cx, build);
    }
    let set = verify(cx, &build.manifest_path(cx))?;
    eprintln!("xtask: kernels from {} (sources {})", cx.kernels.display(), &set.sources[..12.min(set.sources.len())]);
    Ok(())
}

/// The prebuilt set in `cx.kernels`, checked against `manifest` and the
/// sources beside it, as `record` hashed them.
pub fn verify(cx: &Run, manifest: &Path) -> Result<KernelSet> {
    let dir = &cx.kernels;
    let set = KernelSet::load(dir)
        .with_context(|| format!("rebuild it with `cargo xtask build --out-dir {}`", dir.display()))?;
    let src_dir = manifest.parent().unwrap_or(Path::new("."));
    let want = sources_hash(manifest, src_dir, &set.defines)?;
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

    const EMPTY: &str = r#"{"static_smem_limit": 49152, "archs": {}, "sources": []}"#;

    fn record_in(cx: &Run, src: &Path, defines: &[String]) {
        let manifest = Manifest::parse(EMPTY).unwrap();
        std::fs::create_dir_all(&cx.kernels).unwrap();
        record(&cx.kernels, &manifest, &src.join("manifest.json"), src, defines).unwrap();
    }

    fn checkout(dir: &Path) -> Run {
        let kernels = dir.join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        std::fs::write(kernels.join("manifest.json"), EMPTY).unwrap();
        std::fs::write(kernels.join("a.cu"), "kernel a").unwrap();
        std::fs::write(kernels.join("a.cuh"), "header").unwrap();
        let target = dir.join("target");
        Run {
            root: dir.to_path_buf(),
            cuda_wheels: target.join("cuda"),
            kernels: dir.join("prebuilt"),
            target,
            device: None,
        }
    }

    #[test]
    fn a_set_from_other_sources_is_refused_and_one_from_these_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let cx = checkout(tmp.path());
        let src = tmp.path().join("kernels");
        let err = format!("{:#}", verify(&cx, &cx.manifest()).unwrap_err());
        assert!(err.contains("no kernel-set.json") && err.contains("--out-dir"), "{err}");

        record_in(&cx, &src, &[]);
        assert!(verify(&cx, &cx.manifest()).is_ok());

        for (file, text) in [
            ("a.cuh", "edited header"),
            ("b.cu", "a new source"),
            ("sub/c.cu", "one in a folder"),
            ("manifest.json", "{ }"),
        ] {
            let before = std::fs::read(src.join(file)).ok();
            std::fs::create_dir_all(src.join(file).parent().unwrap()).unwrap();
            std::fs::write(src.join(file), text).unwrap();
            let err = verify(&cx, &cx.manifest()).unwrap_err();
            assert!(err.downcast_ref::<CheckFailed>().is_some(), "{file}: {err:#}");
            assert!(err.to_string().contains("built from other sources"), "{err}");
            match before {
                Some(b) => std::fs::write(src.join(file), b).unwrap(),
                None => std::fs::remove_file(src.join(file)).unwrap(),
            }
        }
        assert!(verify(&cx, &cx.manifest()).is_ok());

        // A set built with a planted define is not the checkout's own build...
        record_in(&cx, &src, &["FA_PLANT=1".into()]);
        let set = verify(&cx, &cx.manifest()).unwrap();
        assert_eq!(set.defines, ["FA_PLANT=1"], "…and says so in what it records");
        assert_ne!(set.sources, sources_hash(&src.join("manifest.json"), &src, &[]).unwrap());
    }

    #[test]
    fn a_set_built_from_another_manifest_verifies_against_that_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let cx = checkout(tmp.path());
        let src = tmp.path().join("kernels");
        let other = src.join("sm90a.json");
        std::fs::write(&other, r#"{"static_smem_limit": 49152, "archs": {}, "sources": [], "x": 1}"#).unwrap();
        std::fs::create_dir_all(&cx.kernels).unwrap();
        record(&cx.kernels, &Manifest::parse(EMPTY).unwrap(), &other, &src, &[]).unwrap();
        // `--kernels DIR --manifest M` checks the set against M; without it, against the checkout's.
        let options = |manifest| crate::compile::Options {
            manifest,
            ..crate::compile::Options::new(std::time::Duration::from_secs(1), 1)
        };
        prepare(&cx, &options(Some(other)), true).unwrap();
        let err = prepare(&cx, &options(None), true).unwrap_err();
        assert!(err.to_string().contains("built from other sources"), "{err:#}");
    }
}
