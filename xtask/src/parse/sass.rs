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
    Ok(listing(text)?.into_iter().map(|(name, code)| (name, count(&code))).collect())
}

/// One instruction of a listing: its address, base opcode, and the address a
/// branch names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instr {
    pub addr: u32,
    pub op: String,
    pub target: Option<u32>,
}

/// Every function's instructions, in address order.
pub fn listing(text: &str) -> Result<BTreeMap<String, Vec<Instr>>> {
    let mut out = BTreeMap::new();
    // The function being read, until its `..........` line.
    let mut current: Option<(String, Vec<Instr>)> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Function :") {
            if let Some((open, _)) = &current {
                bail!("cuobjdump -sass: function {open} has no end before function {}", name.trim());
            }
            current = Some((name.trim().to_string(), Vec::new()));
        } else if line == ".........." {
            let Some((name, code)) = current.take() else { bail!("cuobjdump -sass: a function end with no function") };
            out.insert(name, code);
        } else if let (Some((_, code)), Some(instr)) = (&mut current, instruction(line)) {
            code.push(instr);
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

/// Base opcode → count over `code`.
pub fn count(code: &[Instr]) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for i in code {
        *counts.entry(i.op.clone()).or_default() += 1;
    }
    counts
}

/// Tensor-core instructions: mma.sync (HMMA) and wgmma (HGMMA).
const MMA: [&str; 2] = ["HMMA", "HGMMA"];

/// An attention kernel's key-tile loop: the innermost loop (from a backward
/// branch's target to the branch) that holds both a tensor-core instruction
/// and an exponential (MUFU); none where no loop does. (Every loop holding an
/// MMA alone can be a rare path's, such as a recomputed score tile.)
pub fn main_loop(code: &[Instr]) -> Option<&[Instr]> {
    let at = |addr: u32| code.partition_point(|i| i.addr < addr);
    code.iter()
        .filter(|b| b.op == "BRA" && b.target.is_some_and(|t| t <= b.addr))
        .filter_map(|b| {
            let (from, to) = (at(b.target?), at(b.addr) + 1);
            let body = code.get(from..to)?;
            let has = |ops: &[&str]| body.iter().any(|i| ops.contains(&i.op.as_str()));
            (has(&MMA) && has(&["MUFU"])).then_some(body)
        })
        .min_by_key(|body| body.len())
}

/// `/*0ab0*/  @!P0 HGMMA.64x128x16.F32 R24, … ;  /* 0x… */` → address 0xab0,
/// `HGMMA`; `/*0460*/ @!P1 BRA 0x510 ;` → a branch to 0x510. Lines without an
/// address comment first (headers, encodings, labels) are not instructions.
fn instruction(line: &str) -> Option<Instr> {
    let rest = line.strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let addr = u32::from_str_radix(addr, 16).ok()?;
    let mut words = rest.split_whitespace();
    let mut word = words.next()?;
    if word.starts_with('@') {
        word = words.next()?;
    }
    let op = word.split('.').next()?.trim_end_matches(';');
    if op.is_empty() || !op.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()) || op.starts_with("0X") {
        return None;
    }
    let target = (op == "BRA")
        .then(|| {
            words
                .take_while(|w| !w.starts_with("/*"))
                .find_map(|w| w.trim_end_matches([';', ',']).strip_prefix("0x"))
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        })
        .flatten();
    Some(Instr { addr, op: op.to_string(), target })
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
    fn the_main_loop_is_the_innermost_loop_with_mma_and_exponentials() {
        // A loop with an MMA alone (a rare path's), a loop of FMAs nested in the
        // key-tile loop, and the key-tile loop (MMA and MUFU) inside an outer one.
        let text = "Function : k\n/*0000*/ HMMA.16816.F32 R0, R4, R8, R0 ;\n/*0010*/ @P3 BRA 0x0 ;\n\
                    /*0020*/ HMMA.16816.F32 R0, R4, R8, R0 ;\n/*0030*/ FFMA R1, R1, R2, R3 ;\n\
                    /*0040*/ @P0 BRA 0x30 ;\n/*0050*/ MUFU.EX2 R5, R5 ;\n/*0060*/ @P1 BRA P2, 0x20 ;\n\
                    /*0070*/ @P4 BRA 0x0 ;\n/*0080*/ EXIT ;\n..........\n";
        let code = &listing(text).unwrap()["k"];
        assert_eq!(code[4].target, Some(0x30));
        assert_eq!(code[6].target, Some(0x20), "a predicate operand before the target");
        let body = main_loop(code).unwrap();
        assert_eq!((body[0].addr, body.len()), (0x20, 5));
        assert_eq!(count(body)["FFMA"], 1);
        assert!(main_loop(&code[..2]).is_none(), "no exponential");
        // The excerpt's functions are read with their branches.
        let fns = listing(FIXTURE).unwrap();
        assert!(fns.values().flatten().any(|i| i.op == "BRA" && i.target.is_some()));
        assert_eq!(opcode_counts(FIXTURE).unwrap()["flash_fwd_f16_d64"], count(&fns["flash_fwd_f16_d64"]));
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
