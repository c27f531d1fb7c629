//! `cuobjdump -sass` output → opcode counts per function. Pure: the build runs
//! cuobjdump, this only reads its text. What it answers: did the tensor-core
//! instructions the kernel is written for survive compilation (HMMA for mma.sync,
//! HGMMA for wgmma, LDSM for ldmatrix, LDGSTS for cp.async, UTMALDG for TMA), and
//! is there any local-memory traffic (LDL/STL).

use std::collections::BTreeMap;

/// Base opcode (before the first `.`) → count, per function.
pub type OpcodeCounts = BTreeMap<String, BTreeMap<String, u32>>;

/// Opcodes that mean local memory: spills, or arrays indexed at run time.
pub const LOCAL_MEMORY: [&str; 2] = ["LDL", "STL"];

pub fn opcode_counts(text: &str) -> OpcodeCounts {
    let mut out = OpcodeCounts::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Function :") {
            let name = name.trim().to_string();
            out.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        let (Some(func), Some(op)) = (&current, instruction_opcode(line)) else { continue };
        *out.get_mut(func).expect("entry made above").entry(op).or_default() += 1;
    }
    out
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

    const FIXTURE: &str = include_str!("../tests/data/sass/flash-fwd-sm90a-excerpt.sass");

    #[test]
    fn counts_opcodes_per_function_from_real_cuobjdump_output() {
        let counts = opcode_counts(FIXTURE);
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
                    .L_x_0:\n/*0020*/ EXIT ;\n/*zz*/ NOPE ;\n";
        let counts = opcode_counts(text);
        assert_eq!(counts["k"], BTreeMap::from([("EXIT".into(), 1), ("LDC".into(), 1), ("STL".into(), 1)]));
        assert!(opcode_counts("no functions here").is_empty());
    }
}
