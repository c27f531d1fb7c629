//! The committed kernel manifest, `kernels/manifest.json`: sources, entry points,
//! target archs, resource budgets and launch geometry. xtask compiles and budgets
//! from it and copies it beside the fatbins; kernel-ffi launches from that copy,
//! so build and launch cannot drift apart. Shared by both crates (xtask includes
//! this file by path); pure serde and validation, no IO beyond `load`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Largest static `__shared__` allocation a kernel may declare (48 KB on sm_80+).
    pub static_smem_limit: u32,
    pub archs: BTreeMap<String, Arch>,
    pub sources: Vec<Source>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arch {
    /// The `-gencode` value, e.g. `arch=compute_90a,code=sm_90a`; a `compute_XY`
    /// in its `code` list (`arch=compute_80,code=[sm_80,compute_80]`) embeds PTX
    /// as well, which the driver JIT-compiles on later GPUs ([`Manifest::pick_arch`]).
    pub gencode: String,
    /// Opt-in shared memory per block (static + dynamic) in bytes.
    pub smem_optin_limit: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Path relative to `kernels/`.
    pub file: String,
    pub archs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defines: Vec<String>,
    pub kernels: Vec<Kernel>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    pub entry: String,
    pub max_registers: u32,
    /// Dynamic shared memory the launcher requests, in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dynamic_smem: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_spills: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_stack: bool,
    /// Archs on which this entry may spill to local memory anyway (spills, their
    /// stack frame, LDL/STL); every other arch keeps the no-spill budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_memory_on: Vec<String>,
    /// SASS opcodes the compiled entry must contain, e.g. `HGMMA` for wgmma: proof
    /// that the tensor-core path survived compilation (checked by `cargo xtask build`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sass_requires: Vec<String>,
    /// More opcodes required on one arch only, e.g. `QMMA` where e4m3 mma.sync is
    /// native (sm_89; sm_90 emulates it through f16 HMMA).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sass_requires_on: BTreeMap<String, Vec<String>>,
    /// Launch geometry the kernel was compiled for; kernel-ffi launches with it.
    #[serde(default)]
    pub launch: Option<Launch>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    pub threads: u32,
    /// Query rows per CTA (tiled kernels).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_m: u32,
    /// Keys per tile (tiled kernels).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_n: u32,
    /// As many CTAs as are resident at once, each looping over work units from a
    /// 1-D grid (else one CTA per query block, split and batch × head).
    #[serde(default, skip_serializing_if = "is_false")]
    pub persistent: bool,
    /// Groups of warps that split each CTA's keys between them over the same query
    /// rows (the portable `_kg2` entries; threads = groups × warps per group × 32).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub key_groups: u32,
}

// Defaults stay out of the written manifest, so `tune --apply` keeps it terse.
fn is_zero(x: &u32) -> bool {
    *x == 0
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

fn is_false(x: &bool) -> bool {
    !*x
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Manifest> {
        let text =
            crate::file::read_text(path).with_context(|| format!("reading kernel manifest {}", path.display()))?;
        let manifest = Manifest::parse(&text).with_context(|| format!("in kernel manifest {}", path.display()))?;
        Ok(manifest)
    }

    pub fn parse(text: &str) -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_str(text)?;
        manifest.validate()?;
        Ok(manifest)
    }

    fn validate(&self) -> Result<()> {
        for arch in self.archs.keys() {
            check_arch_name(arch)?;
        }
        let mut fatbins = BTreeMap::new();
        for src in &self.sources {
            let stem = check_source_file(&src.file)?;
            if let Some(other) = fatbins.insert(stem, &src.file) {
                bail!("sources {other} and {} would both build {stem}.<arch>.fatbin; rename one", src.file);
            }
            for k in &src.kernels {
                check_entry_name(&k.entry)?;
            }
            for arch in &src.archs {
                if !self.archs.contains_key(arch) {
                    bail!(
                        "source {} lists arch `{arch}`, which is not under \"archs\" (known: {})",
                        src.file,
                        self.archs.keys().cloned().collect::<Vec<_>>().join(", ")
                    );
                }
            }
            if src.kernels.is_empty() {
                bail!("source {} lists no kernels; every entry point needs a budget", src.file);
            }
            for k in &src.kernels {
                if let Some(l) = k.launch
                    && (l.key_groups == 0 || l.threads % (32 * l.key_groups) != 0)
                {
                    bail!(
                        "{}: key_groups {} must be at least 1 and divide its {} threads into whole warps",
                        k.entry,
                        l.key_groups,
                        l.threads
                    );
                }
            }
        }
        Ok(())
    }

    /// The arch whose code runs on compute capability `major.minor`, by the
    /// driver's rules for loading a fatbin:
    ///
    /// 1. SASS built for exactly this device: `sm_XYa` (which runs on X.Y only),
    ///    else `sm_XY`;
    /// 2. else the highest SASS of the same major whose minor is not above the
    ///    device's (SASS is binary compatible within a major: sm_86 runs on 8.7);
    /// 3. else the arch whose embedded PTX has the highest compute capability not
    ///    above the device's ([`Arch::ptx`]): the driver JIT-compiles it, e.g.
    ///    compute_80 PTX on an sm_120 GPU.
    ///
    /// `None` when nothing runs there; [`Manifest::unsupported`] says why.
    pub fn pick_arch(&self, major: i32, minor: i32) -> Option<String> {
        for exact in [format!("sm_{major}{minor}a"), format!("sm_{major}{minor}")] {
            if self.archs.contains_key(&exact) {
                return Some(exact);
            }
        }
        let same_major = self
            .archs
            .keys()
            .filter_map(|a| Some((sass_capability(a)?, a)))
            .filter(|&((ma, mi), _)| ma == major && mi <= minor)
            .max_by_key(|&(cc, _)| cc);
        if let Some((_, a)) = same_major {
            return Some(a.clone());
        }
        self.archs
            .iter()
            .filter_map(|(a, arch)| Some((arch.ptx()?, a)))
            .filter(|&(cc, _)| cc <= (major, minor))
            .max_by_key(|&(cc, _)| cc)
            .map(|(_, a)| a.clone())
    }

    /// Why `pick_arch(major, minor)` found nothing: what the manifest builds and
    /// where each of its builds runs.
    pub fn unsupported(&self, major: i32, minor: i32) -> String {
        let sass = self.archs.keys().cloned().collect::<Vec<_>>().join(", ");
        let mut ptx: Vec<(i32, i32)> = self.archs.values().filter_map(Arch::ptx).collect();
        ptx.sort();
        ptx.dedup();
        let ptx = match ptx.as_slice() {
            [] => "no PTX".to_string(),
            [(ma, mi), ..] => format!(
                "PTX for {} (JIT-compiled on compute capability {ma}.{mi} and newer)",
                ptx.iter().map(|(a, b)| format!("compute_{a}{b}")).collect::<Vec<_>>().join(", ")
            ),
        };
        format!(
            "no kernel build runs on sm_{major}{minor} (compute capability {major}.{minor}): the manifest has SASS \
             for {sass} (each runs on its own compute capability and later minors of the same major; an `a` \
             arch only on its own) and {ptx}"
        )
    }

    /// `pick_arch` for a compute capability written `major.minor` (as nvidia-smi and
    /// `fa-test --info` print it); `None` if it is malformed or nothing matches.
    pub fn arch_for(&self, compute_capability: &str) -> Option<String> {
        let (a, b) = compute_capability.trim().split_once('.')?;
        self.pick_arch(a.parse().ok()?, b.parse().ok()?)
    }

    pub fn kernel(&self, entry: &str) -> Option<&Kernel> {
        self.sources.iter().flat_map(|s| &s.kernels).find(|k| k.entry == entry)
    }
}

impl Arch {
    /// The compute capability of the PTX this arch's gencode embeds, if any that
    /// other GPUs can JIT-compile: `code=[sm_80,compute_80]` → `(8, 0)`. PTX of an
    /// arch-specific target (`compute_90a`) runs on that arch alone, so it is not counted.
    pub fn ptx(&self) -> Option<(i32, i32)> {
        let (_, code) = self.gencode.split_once("code=")?;
        code.trim_matches(['[', ']', '"', '\''])
            .split(',')
            .filter_map(|c| c.trim().strip_prefix("compute_"))
            .filter_map(capability)
            .max()
    }
}

/// `sm_86` → `(8, 6)`; `None` for an arch with a letter suffix (`sm_90a`, which
/// runs on sm_90 alone) or any other name.
fn sass_capability(arch: &str) -> Option<(i32, i32)> {
    capability(arch.strip_prefix("sm_")?)
}

/// `86` → `(8, 6)`, `120` → `(12, 0)`: the digits nvcc names archs by.
fn capability(digits: &str) -> Option<(i32, i32)> {
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i32 = digits.parse().ok()?;
    Some((n / 10, n % 10))
}

impl Source {
    /// The fatbin this source builds for `arch`, in the kernel folder:
    /// `<file name without .cu>.<arch>.fatbin` (`a/k.one.cu` → `k.one.sm_90a.fatbin`).
    pub fn fatbin(&self, arch: &str) -> String {
        format!("{}.{arch}.fatbin", source_stem(&self.file))
    }
}

/// A source's file name without its `.cu`.
fn source_stem(file: &str) -> &str {
    let name = file.rsplit('/').next().unwrap_or(file);
    name.strip_suffix(".cu").unwrap_or(name)
}

/// Arch keys become file names: `sm_<digits>` with an optional letter suffix (`sm_90a`).
fn check_arch_name(arch: &str) -> Result<()> {
    let digits = arch.strip_prefix("sm_").map(|r| r.strip_suffix(|c: char| c.is_ascii_lowercase()).unwrap_or(r));
    if !digits.is_some_and(|d| !d.is_empty() && d.len() <= 4 && d.bytes().all(|b| b.is_ascii_digit())) {
        bail!(
            "arch `{}` is not sm_<digits>[letter] (e.g. sm_89, sm_90a): arch keys name the fatbins",
            arch.escape_debug()
        );
    }
    Ok(())
}

/// Source files are `.cu` paths inside `kernels/`: relative, no `..`, no hidden
/// or empty components, names of letters, digits, `_`, `-` and `.`. Returns the stem.
fn check_source_file(file: &str) -> Result<&str> {
    let rule = "a source is a relative path inside kernels/ ending in .cu, of names made of letters, digits, \
                `_`, `-` and `.` (no `..`, no leading `.`)";
    let ok_part = |p: &str| {
        !p.is_empty() && !p.starts_with('.') && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    };
    if !file.ends_with(".cu") || !file.split('/').all(ok_part) || source_stem(file).is_empty() {
        bail!("source `{}`: {rule}", file.escape_debug());
    }
    Ok(source_stem(file))
}

/// Entry points are C identifiers; they name SASS sections and report rows.
fn check_entry_name(entry: &str) -> Result<()> {
    let mut bytes = entry.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        bail!("entry `{}` is not a C identifier", entry.escape_debug());
    }
    Ok(())
}

impl Kernel {
    /// Whether register spills are within this entry's budget on `arch`.
    pub fn may_spill(&self, arch: &str) -> bool {
        self.allow_spills || self.local_memory_on.iter().any(|a| a == arch)
    }

    /// Whether a stack frame is within this entry's budget on `arch`.
    pub fn may_use_stack(&self, arch: &str) -> bool {
        self.allow_stack || self.local_memory_on.iter().any(|a| a == arch)
    }
}

/// Whether an entry belongs to the Hopper (sm_90a) forward kernel.
pub fn is_hopper_entry(entry: &str) -> bool {
    entry.starts_with("flash_fwd_hopper_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_manifest_parses() {
        let m = Manifest::parse(include_str!("../../kernels/manifest.json")).unwrap();
        assert_eq!(m.archs.keys().collect::<Vec<_>>(), ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]);
        for src in &m.sources {
            let hopper = src.kernels.iter().all(|k| is_hopper_entry(&k.entry));
            // e4m3 mma.sync needs sm_89.
            let e4m3 = src.kernels.iter().all(|k| k.entry.contains("e4m3"));
            let expected: &[&str] = match (hopper, e4m3) {
                (true, _) => &["sm_90a"],
                (_, true) => &["sm_89", "sm_90", "sm_90a"],
                _ => &["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"],
            };
            assert_eq!(src.archs, expected, "{}", src.file);
        }
        // Only sm_80 carries PTX, for GPUs newer than any SASS built.
        let ptx: Vec<_> = m.archs.iter().filter_map(|(a, arch)| Some((a.as_str(), arch.ptx()?))).collect();
        assert_eq!(ptx, [("sm_80", (8, 0))]);
    }

    #[test]
    fn arch_selection() {
        let m = Manifest::parse(include_str!("../../kernels/manifest.json")).unwrap();
        let pick = |major, minor| m.pick_arch(major, minor);
        // Exact SASS.
        assert_eq!(pick(8, 0).as_deref(), Some("sm_80"));
        assert_eq!(pick(8, 6).as_deref(), Some("sm_86"));
        assert_eq!(pick(8, 9).as_deref(), Some("sm_89"));
        assert_eq!(pick(9, 0).as_deref(), Some("sm_90a"));
        // The same major's highest SASS not above the device's minor (Orin is 8.7).
        assert_eq!(pick(8, 7).as_deref(), Some("sm_86"));
        assert_eq!(pick(8, 8).as_deref(), Some("sm_86"));
        // sm_90a SASS runs on 9.0 alone; a later 9.x gets sm_90.
        assert_eq!(pick(9, 1).as_deref(), Some("sm_90"));
        // Newer majors JIT-compile sm_80's compute_80 PTX.
        assert_eq!(pick(10, 0).as_deref(), Some("sm_80"));
        assert_eq!(pick(12, 0).as_deref(), Some("sm_80"));
        // Older than any build: nothing, and the message says what runs where.
        assert_eq!(pick(7, 5), None);
        assert_eq!(
            m.unsupported(7, 5),
            "no kernel build runs on sm_75 (compute capability 7.5): the manifest has SASS for sm_80, sm_86, sm_89, \
             sm_90, sm_90a (each runs on its own compute capability and later minors of the same major; an `a` arch \
             only on its own) and PTX for compute_80 (JIT-compiled on compute capability 8.0 and newer)"
        );
        assert_eq!(m.arch_for("9.0").as_deref(), Some("sm_90a"));
        assert_eq!(m.arch_for(" 8.9\n").as_deref(), Some("sm_89"));
        assert_eq!(m.arch_for("12.0").as_deref(), Some("sm_80"));
        assert_eq!(m.arch_for("nine"), None);
        let mut plain = m.clone();
        plain.archs.remove("sm_90a");
        assert_eq!(plain.pick_arch(9, 0).as_deref(), Some("sm_90"));
        // Without the PTX, a GPU newer than every SASS build runs nothing.
        let mut sass_only = m.clone();
        sass_only.archs.get_mut("sm_80").unwrap().gencode = "arch=compute_80,code=sm_80".into();
        assert_eq!(sass_only.pick_arch(12, 0), None);
        assert_eq!(sass_only.pick_arch(8, 0).as_deref(), Some("sm_80"));
        assert!(sass_only.unsupported(12, 0).ends_with("and no PTX"), "{}", sass_only.unsupported(12, 0));
    }

    #[test]
    fn ptx_is_read_from_the_gencode_and_picked_by_capability() {
        let arch = |gencode: &str| Arch { gencode: gencode.into(), smem_optin_limit: 0 };
        assert_eq!(arch("arch=compute_80,code=[sm_80,compute_80]").ptx(), Some((8, 0)));
        assert_eq!(arch("arch=compute_86,code=\"sm_86,compute_86\"").ptx(), Some((8, 6)));
        assert_eq!(arch("arch=compute_120,code=compute_120").ptx(), Some((12, 0)));
        assert_eq!(arch("arch=compute_89,code=sm_89").ptx(), None, "arch=compute_89 alone embeds no PTX");
        assert_eq!(arch("arch=compute_90a,code=[sm_90a,compute_90a]").ptx(), None, "runs on sm_90 alone");
        assert_eq!(arch("g").ptx(), None);
        // The highest PTX not above the device wins; a higher one does not run.
        let mut m = Manifest::parse(&with_source("sm_75", "k.cu")).unwrap();
        m.archs.insert("sm_75".into(), arch("arch=compute_75,code=[sm_75,compute_75]"));
        m.archs.insert("sm_86".into(), arch("arch=compute_86,code=[sm_86,compute_86]"));
        assert_eq!(m.pick_arch(8, 0).as_deref(), Some("sm_75"), "compute_86 PTX does not run on 8.0");
        assert_eq!(m.pick_arch(8, 9).as_deref(), Some("sm_86"), "SASS of the same major");
        assert_eq!(m.pick_arch(9, 0).as_deref(), Some("sm_86"), "the highest PTX");
        assert_eq!(m.pick_arch(7, 0), None);
    }

    #[test]
    fn key_groups_default_to_one_and_must_split_whole_warps() {
        let m = Manifest::parse(include_str!("../../kernels/manifest.json")).unwrap();
        let launch = |e: &str| m.kernel(e).and_then(|k| k.launch).unwrap();
        assert_eq!(launch("flash_fwd_f16_d64_m64").key_groups, 1);
        assert_eq!(launch("flash_fwd_f16_d64_kg2").key_groups, 2);
        let text = r#"{"static_smem_limit": 49152, "archs": {}, "sources": [{"file": "a.cu", "archs": [],
            "kernels": [{"entry": "k", "max_registers": 64, "launch": {"threads": 96, "key_groups": 2}}]}]}"#;
        let err = format!("{:#}", Manifest::parse(text).unwrap_err());
        assert!(err.contains("k: key_groups 2") && err.contains("96 threads"), "{err}");
    }

    fn with_source(arch: &str, file: &str) -> String {
        format!(
            r#"{{"static_smem_limit": 49152, "archs": {{"{arch}": {{"gencode": "g", "smem_optin_limit": 1}}}},
            "sources": [{{"file": "{file}", "archs": ["{arch}"], "kernels": [{{"entry": "k", "max_registers": 64}}]}}]}}"#
        )
    }

    #[test]
    fn names_that_become_paths_are_refused_unless_plain() {
        assert!(Manifest::parse(&with_source("sm_90a", "sub/k.one.cu")).is_ok());
        for arch in ["sm_89/../../../../tmp/escape/pwned", "sm_", "sm_9x0", "gfx90a", "sm_89 ", "sm_89ab", ""] {
            let err = format!("{:#}", Manifest::parse(&with_source(arch, "k.cu")).unwrap_err());
            assert!(err.contains("is not sm_<digits>"), "{arch}: {err}");
        }
        for file in ["../k.cu", "/abs/k.cu", "a/../k.cu", ".hidden.cu", "k.cuh", "k .cu", "a//k.cu", ".cu", "k;x.cu"] {
            let err = format!("{:#}", Manifest::parse(&with_source("sm_89", file)).unwrap_err());
            assert!(err.contains("relative path inside kernels/"), "{file}: {err}");
        }
        let bad_entry = with_source("sm_89", "k.cu").replace(r#""entry": "k""#, r#""entry": "k/x""#);
        assert!(format!("{:#}", Manifest::parse(&bad_entry).unwrap_err()).contains("C identifier"));
    }

    #[test]
    fn fatbins_are_named_by_the_last_dot_and_never_collide() {
        let m = Manifest::parse(&with_source("sm_89", "sub/k.one.cu")).unwrap();
        assert_eq!(m.sources[0].fatbin("sm_89"), "k.one.sm_89.fatbin");
        let two = r#"{"static_smem_limit": 49152, "archs": {},
            "sources": [{"file": "a/k.cu", "archs": [], "kernels": [{"entry": "k", "max_registers": 64}]},
                        {"file": "b/k.cu", "archs": [], "kernels": [{"entry": "j", "max_registers": 64}]}]}"#;
        let err = format!("{:#}", Manifest::parse(two).unwrap_err());
        assert!(err.contains("would both build k.<arch>.fatbin"), "{err}");
    }

    #[test]
    fn unknown_arch_is_named() {
        let text = r#"{"static_smem_limit": 49152, "archs": {},
            "sources": [{"file": "a.cu", "archs": ["sm_70"], "kernels": [{"entry": "k", "max_registers": 64}]}]}"#;
        let err = format!("{:#}", Manifest::parse(text).unwrap_err());
        assert!(err.contains("sm_70"), "{err}");
    }
}
