//! `cuobjdump -sass` output → opcode counts per function. Pure: the build runs
//! cuobjdump, this only reads its text. What it answers: did the tensor-core
//! instructions the kernel is written for survive compilation (HMMA for mma.sync,
//! HGMMA for wgmma, LDSM for ldmatrix, LDGSTS for cp.async, UTMALDG for TMA), and
//! is there any local-memory traffic (LDL/STL). cuobjdump ends every function
//! with a `..........` line: output without a function, or with one whose end
//! is missing, was cut short and would under-count, so it is an error.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

/// Base opcode (before the first `.`) → count, per function.
pub type OpcodeCounts = BTreeMap<String, BTreeMap<String, u32>>;

/// Opcodes that mean local memory: spills, or arrays indexed at run time.
pub const LOCAL_MEMORY: [&str; 2] = ["LDL", "STL"];

pub fn opcode_counts(text: &str) -> Result<OpcodeCounts> {
    let mut out = OpcodeCounts::new();
    // The function being read, until its `..........` line.
    let mut current: Option<(String, BTreeMap<String, u32>)> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Function :") {
            if let Some((open, _)) = &current {
                bail!("cuobjdump -sass: function {open} has no end before function {}", name.trim());
            }
            current = Some((name.trim().to_string(), BTreeMap::new()));
        } else if line == ".........." {
            let Some((name, counts)) = current.take() else {
                bail!("cuobjdump -sass: a function end with no function")
            };
            out.insert(name, counts);
        } else if let (Some((_, counts)), Some(op)) = (&mut current, instruction_opcode(line)) {
            *counts.entry(op).or_default() += 1;
        }
    }
    if let Some((open, _)) = current {
        bail!("cuobjdump -sass output ends inside function {open}: it was cut short");
    }
    if out.is_empty() {
        bail!("cuobjdump -sass listed no function: is the fatbin empty, or the output missing?");
    }
    Ok(out)
}

/// `/*0ab0*/  @!P0 HGMMA.64x128x16.F32 R24, … ;  /* 0x… */` → `HGMMA`. Lines
/// without an address comment first (headers, encodings, labels) are not instructions.
fn instruction_opcode(line: &str) -> Option<String> {
    let rest = line.strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut words = rest.split_whitespace();
    let mut word = words.next()?;
    if word.starts_with('@') {
        word = words.next()?;
    }
    let op = word.split('.').next()?.trim_end_matches(';');
    (!op.is_empty() && op.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()) && !op.starts_with("0X"))
        .then(|| op.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../tests/data/sass/flash-fwd-sm90a-excerpt.sass");

    #[test]
    fn counts_opcodes_per_function_from_real_cuobjdump_output() {
        let counts = opcode_counts(FIXTURE).unwrap();
        let hopper = &counts["flash_fwd_hopper_f16_d64"];
        assert_eq!(hopper["HGMMA"], 4, "{hopper:?}");
        assert!(hopper.contains_key("UTMALDG"), "TMA loads: {hopper:?}");
        assert!(hopper.contains_key("SYNCS"), "mbarriers: {hopper:?}");
        assert!(!hopper.contains_key("HMMA"));
        let portable = &counts["flash_fwd_f16_d64"];
        assert_eq!((portable["HMMA"], portable["LDSM"]), (19, 16), "{portable:?}");
        assert!(portable.contains_key("LDSM") && portable.contains_key("LDGSTS"), "{portable:?}");
        assert!(counts.values().all(|c| LOCAL_MEMORY.iter().all(|op| !c.contains_key(*op))));
    }

    #[test]
    fn predicates_headers_and_odd_lines() {
        let text = "\n\tcode for sm_90a\n\t\tFunction : k\n\t.headerflags @\"EF_CUDA_SM90\"\n\
                    /*0000*/ LDC R1, c[0x0][0x28] ; /* 0x00000a00ff017b82 */\n\
                    /* 0x000fe40000000800 */\n\
                    /*0010*/ @!P0 STL.64 [R1], R2 ; /* 0x0000000201008387 */\n\
                    .L_x_0:\n/*0020*/ EXIT ;\n/*zz*/ NOPE ;\n\t\t..........\n";
        let counts = opcode_counts(text).unwrap();
        assert_eq!(counts["k"], BTreeMap::from([("EXIT".into(), 1), ("LDC".into(), 1), ("STL".into(), 1)]));
    }

    #[test]
    fn output_absent_or_cut_short_is_an_error() {
        for (text, says) in [
            ("", "listed no function"),
            ("no functions here\n", "listed no function"),
            ("\t\t..........\n", "with no function"),
        ] {
            let err = opcode_counts(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
        // Cut anywhere, a function is read whole or refused, never counted short
        // (a missing STL would pass a spill budget).
        let full = opcode_counts(FIXTURE).unwrap();
        for (cut, _) in FIXTURE.match_indices('\n') {
            if let Ok(read) = opcode_counts(&FIXTURE[..cut]) {
                assert!(read.iter().all(|(f, c)| full.get(f) == Some(c)), "cut at byte {cut}: {read:?}");
            }
        }
        let last = FIXTURE.rfind("Function :").unwrap();
        assert!(opcode_counts(&FIXTURE[..FIXTURE.rfind("..........").unwrap()]).is_err());
        assert!(opcode_counts(&FIXTURE[..last + 200]).is_err());
        let two = FIXTURE.replacen("\t\t..........\n", "", 1);
        assert!(opcode_counts(&two).unwrap_err().to_string().contains("no end before function flash_fwd_f16_d64"));
    }
}
