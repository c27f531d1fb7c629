//! What the command-line tools share: exit codes (0 passed, 1 a check failed,
//! 2 could not run) with one error line and no backtrace, stdout that a closed
//! pipe ends quietly, atomic output files, and the kernel-choice check that runs
//! against the kernel manifest before any CUDA call.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::Precision;
use crate::attention::{Family, KernelChoice};
use crate::manifest::Manifest;
use crate::scores::Scores;

pub use fa_schema::exit::CheckFailed;

/// 0 passed, 1 a check failed (`CheckFailed` anywhere in the chain), 2 could not run.
pub fn exit_code(result: &Result<()>) -> u8 {
    result.as_ref().map_or_else(fa_schema::exit::code, |()| 0)
}

/// Prints the error chain on one line and exits with `exit_code`.
pub fn finish(result: Result<()>) -> ExitCode {
    let code = exit_code(&result);
    if let Err(e) = &result {
        let what = if code == 1 { "failed" } else { "error" };
        eprintln!("{what}: {e:#}");
    }
    ExitCode::from(code)
}

/// Writes `text` to stdout. A reader that went away (`fa-test --list | head -1`)
/// is not an error: the tool ends as if it had printed everything.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// Replaces `path` with `bytes` atomically, refusing a target that is not a
/// regular file (`fa_schema::file::write_atomic`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    fa_schema::file::write_atomic(path, bytes, false)
}

/// Refuses kernel choices (`--variant`, `--block-m`, `--key-groups`, `--persistent`)
/// that no forward entry of the manifest for (dtype, head dim, causal) has, on
/// any arch: such a flag is wrong whatever the GPU. What the device in hand
/// loads is checked again at the launch. Entry names follow `Family::entry_stem`:
/// `flash_fwd[_hopper]_<dtype>_d<D>[_causal]` with `_m64` or `_kg2`, and a
/// `_persistent` twin.
pub fn check_choice(
    manifest: &Manifest,
    choice: &KernelChoice,
    precision: impl Into<Precision>,
    head_dim: usize,
    scores: Scores,
) -> Result<()> {
    let precision = precision.into();
    if *choice == KernelChoice::default() {
        return Ok(());
    }
    let families = choice.variant.family().map_or(Family::ALL.to_vec(), |f| vec![f]);
    let geometries = entry_geometries(manifest, &families, precision, head_dim, scores);
    let fits = |&(_, m, g, p): &(Family, u32, u32, bool)| {
        choice.block_m.is_none_or(|want| want == m)
            && choice.key_groups.is_none_or(|want| want == g)
            && choice.persistent.is_none_or(|want| want == p)
    };
    if geometries.iter().any(fits) {
        return Ok(());
    }
    let asked = [
        choice.variant.family().map(|f| format!("--variant {}", f.name())),
        choice.block_m.map(|m| format!("--block-m {m}")),
        choice.key_groups.map(|g| format!("--key-groups {g}")),
        choice.persistent.map(|p| format!("--persistent {p}")),
    ];
    let asked: Vec<String> = asked.into_iter().flatten().collect();
    let problem = format!("{} D={head_dim}{}", precision.name(), scores.suffix().replace('_', " "));
    if geometries.is_empty() {
        bail!("{}: the kernel manifest has no such forward entry for {problem}", asked.join(" "));
    }
    let have: Vec<String> = geometries
        .iter()
        .map(|(v, m, g, p)| format!("{} {m} rows {g} key group(s){}", v.name(), if *p { " persistent" } else { "" }))
        .collect();
    bail!(
        "{}: no forward entry for {problem} has that; the kernel manifest has {}; pick one of those or leave the choice to the planner",
        asked.join(" "),
        have.join(", ")
    )
}

/// (family, query rows, key groups, persistent) of the manifest's forward entries
/// of `families` for (precision, head dim, scores): e4m3 inputs with no e4m3
/// entry for the scores run dequantised, on the output dtype's entries.
fn entry_geometries(
    manifest: &Manifest,
    families: &[Family],
    precision: Precision,
    head_dim: usize,
    scores: Scores,
) -> Vec<(Family, u32, u32, bool)> {
    let mut out = Vec::new();
    for &family in families {
        let of = |precision| {
            let base = family.entry_stem(precision, head_dim, scores);
            Family::entry_names(&base)
                .into_iter()
                .flat_map(|name| [name.clone(), format!("{name}_persistent")])
                .filter_map(|name| manifest.kernel(&name).and_then(|k| k.launch))
                .map(|l| (family, l.block_m, l.key_groups, l.persistent))
                .collect::<Vec<_>>()
        };
        out.extend(of(precision.run_as(|| !of(precision).is_empty())));
    }
    out
}

/// `--version`: the crate version, the git revision and rustc it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("FA_GIT_REV"), ", ", env!("FA_RUSTC"), ")");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Variant;

    fn manifest() -> Manifest {
        Manifest::parse(include_str!("../../kernels/manifest.json")).unwrap()
    }

    fn choice(
        variant: Variant,
        block_m: Option<u32>,
        key_groups: Option<u32>,
        persistent: Option<bool>,
    ) -> KernelChoice {
        KernelChoice { variant, block_m, key_groups, persistent }
    }

    #[test]
    fn a_check_that_failed_exits_1_and_anything_else_that_stops_the_tool_2() {
        assert_eq!(exit_code(&Ok(())), 0);
        assert_eq!(exit_code(&Err(CheckFailed("2 of 9 cases failed".into()).into())), 1);
        let wrapped = Err(anyhow::Error::new(CheckFailed("x".into())).context("writing"));
        assert_eq!(exit_code(&wrapped), 1);
        assert_eq!(exit_code(&Err(anyhow::anyhow!("no NVIDIA driver here"))), 2);
    }

    #[test]
    fn entry_flags_no_compiled_entry_has_are_refused_before_the_gpu() {
        let m = manifest();
        let check = |c: KernelChoice, causal: bool| {
            let scores = Scores { band: if causal { crate::Band::Causal } else { crate::Band::Full }, softcap: None };
            check_choice(&m, &c, crate::Dtype::F16, 64, scores).map_err(|e| format!("{e:#}"))
        };
        assert!(check(KernelChoice::default(), false).is_ok());
        assert!(check(choice(Variant::Portable, Some(32), Some(2), None), false).is_ok());
        assert!(check(choice(Variant::Portable, None, Some(2), None), false).is_ok());
        assert!(check(choice(Variant::Hopper, Some(64), None, Some(true)), false).is_ok());
        assert!(check(choice(Variant::Auto, Some(128), None, None), true).is_ok());
        let e = check(choice(Variant::Auto, Some(96), None, None), false).unwrap_err();
        assert!(e.starts_with("--block-m 96: no forward entry for f16 D=64 has that"), "{e}");
        assert!(
            e.contains("portable 32 rows 2 key group(s)") && e.contains("hopper 64 rows 1 key group(s) persistent")
        );
        let e = check(choice(Variant::Hopper, None, Some(2), None), false).unwrap_err();
        assert!(e.starts_with("--variant hopper --key-groups 2: no forward entry"), "{e}");
        assert!(!e.contains("portable"), "only the Hopper kernel's entries are offered: {e}");
        let e = check(choice(Variant::Portable, Some(64), Some(2), None), false).unwrap_err();
        assert!(e.contains("--block-m 64 --key-groups 2"), "{e}");
        // The portable kernel's entries are not persistent.
        assert!(check(choice(Variant::Portable, None, None, Some(true)), true).is_err());
    }

    #[test]
    fn block_m_192_names_the_e4m3_d128_three_warpgroup_entry() {
        let m = manifest();
        let fp8 = crate::Precision { input: crate::Dtype::E4m3, output: crate::Dtype::Bf16 };
        let causal = Scores { band: crate::Band::Causal, softcap: None };
        let wide = choice(Variant::Hopper, Some(192), None, None);
        assert!(check_choice(&m, &wide, fp8, 128, Scores::default()).is_ok());
        let e = format!("{:#}", check_choice(&m, &wide, fp8, 128, causal).unwrap_err());
        assert!(e.contains("hopper 128 rows") && !e.contains("192 rows"), "{e}");
        // 16-bit D=128 has no 192-row entry.
        assert!(check_choice(&m, &wide, crate::Dtype::Bf16, 128, Scores::default()).is_err());
    }

    #[test]
    fn e4m3_calls_take_e4m3_entries_or_run_dequantised_on_16_bit_ones() {
        let m = manifest();
        let fp8 = crate::Precision { input: crate::Dtype::E4m3, output: crate::Dtype::Bf16 };
        let causal = Scores { band: crate::Band::Causal, softcap: None };
        let check = |c: KernelChoice, scores| check_choice(&m, &c, fp8, 128, scores).map_err(|e| format!("{e:#}"));
        assert!(check(choice(Variant::Portable, Some(64), None, None), causal).is_ok());
        // The Hopper kernel runs D=128 and 256 on its e4m3 entries, windows dequantised on its bf16 ones.
        assert!(check(choice(Variant::Hopper, Some(128), None, None), causal).is_ok());
        for name in ["flash_fwd_hopper_e4m3_bf16_d256", "flash_fwd_hopper_e4m3_f16_d256_causal"] {
            assert!(m.sources.iter().flat_map(|s| &s.kernels).any(|k| k.entry == name), "{name}");
        }
        let window = Scores { band: crate::Band::Local { left: 8, right: 0 }, softcap: None };
        assert!(check(choice(Variant::Hopper, None, None, None), window).is_ok());
        // Windows have no e4m3 entry: the portable kernel's bf16 one runs them dequantised.
        assert!(check(choice(Variant::Portable, Some(64), None, None), window).is_ok());
        let e = check(choice(Variant::Portable, Some(128), None, None), window).unwrap_err();
        assert!(
            e.contains("no forward entry for e4m3_bf16 D=128 local has that") && e.contains("portable 64 rows"),
            "{e}"
        );
    }

    #[test]
    fn output_files_are_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("fa-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        std::fs::write(&path, "old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["out.json"], "no temporary file left behind");
        let e = write_atomic(&dir.join("missing/out.json"), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("missing"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
