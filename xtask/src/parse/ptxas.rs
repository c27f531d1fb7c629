//! Parser for `ptxas -v` reports. Pure: text in, records out.
//!
//! The report is a sequence of `ptxas info    : <message>` lines. A record opens
//! at `Compiling entry function 'NAME' for 'sm_XX'`; the following
//! `Function properties for NAME` line is followed by the stack/spill line, and
//! `Used …` carries optional, unordered clauses (`N registers`, `used N barriers`,
//! `N bytes smem`, `N bytes cmem[0]`, `N bytes cumulative stack size`). An info
//! line printed before the entries it names ("(C75xx) Potential Performance Loss:
//! wgmma.mma_async instructions are serialized due to REASON in the function
//! 'NAME'") says ptxas serialised an entry's wgmma instructions; its code and
//! reason are kept (C7510: a call inside the wgmma pipeline, C7511: too few
//! registers, C7515: a non-wgmma write to an accumulator while a wgmma may be in
//! flight, and any other).
//!
//! Output cut short never reads as an entry that uses nothing: a record counts
//! only once its `Used …` line is read, and a last line without its newline (it
//! may stop anywhere) is not read. The entry is then missing from the report,
//! which fails the build.

use serde::{Deserialize, Serialize};

/// Resources ptxas reports for one entry function compiled for one arch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    pub name: String,
    pub arch: String,
    pub registers: u32,
    pub barriers: u32,
    /// Static shared memory in bytes (dynamic shared memory is not in the report).
    pub smem_static: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Constant memory summed over all banks.
    pub cmem: u32,
    pub cumulative_stack: u32,
    /// Why ptxas made every wgmma wait for the previous one (empty: it did not),
    /// which silently halves tensor throughput.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wgmma_serialized: Vec<WgmmaSerialized>,
}

/// One ptxas notice that an entry's wgmma instructions are serialised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WgmmaSerialized {
    /// The message code, e.g. `C7515`.
    pub code: String,
    /// ptxas's reason, e.g. "insufficient register resources for the wgmma pipeline".
    pub reason: String,
}

impl KernelResources {
    pub fn spill_bytes(&self) -> u32 {
        self.spill_stores + self.spill_loads
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub kernels: Vec<KernelResources>,
    /// `ptxas warning` lines, verbatim (for example C7508 about `setmaxnreg`).
    pub warnings: Vec<String>,
}

pub fn parse(text: &str) -> Report {
    let mut report = Report::default();
    // Index of the record the next property lines belong to.
    let mut current: Option<usize> = None;
    // Set after `Function properties for X`; the next line holds stack/spills.
    let mut properties_of: Option<String> = None;
    let mut serialized: Vec<(&str, WgmmaSerialized)> = Vec::new();
    // Per record: its `Used …` line was read.
    let mut used: Vec<bool> = Vec::new();
    let whole = if text.ends_with('\n') { text } else { text.rsplit_once('\n').map_or("", |(w, _)| w) };

    for raw in whole.lines() {
        let line = raw.trim();
        if let Some(owner) = properties_of.take()
            && let Some(idx) = current.filter(|&i| report.kernels[i].name == owner)
        {
            apply_clauses(&mut report.kernels[idx], line);
            continue;
        }
        if let Some(msg) = strip_tag(line, "ptxas warning") {
            report.warnings.push(msg.to_string());
            continue;
        }
        let Some(msg) = strip_tag(line, "ptxas info") else {
            continue;
        };
        if let Some(notice) = wgmma_serialization(msg) {
            serialized.push(notice);
        } else if let Some(rest) = msg.strip_prefix("Compiling entry function ") {
            let mut quoted = rest.split('\'').skip(1).step_by(2);
            if let (Some(name), Some(arch)) = (quoted.next(), quoted.next()) {
                report.kernels.push(KernelResources {
                    name: name.to_string(),
                    arch: arch.to_string(),
                    ..KernelResources::default()
                });
                used.push(false);
                current = Some(report.kernels.len() - 1);
            }
        } else if let Some(name) = msg.strip_prefix("Function properties for ") {
            properties_of = Some(name.trim().to_string());
        } else if let Some(clauses) = msg.strip_prefix("Used ") {
            if let Some(idx) = current {
                apply_clauses(&mut report.kernels[idx], clauses);
                used[idx] = true;
            }
        } else if msg.starts_with("Compiling ") {
            // A non-entry function: its properties must not land on the last entry.
            current = None;
        }
    }
    let mut complete = used.into_iter();
    report.kernels.retain(|_| complete.next().unwrap_or(false));
    for k in &mut report.kernels {
        k.wgmma_serialized =
            serialized.iter().filter(|(name, _)| *name == k.name).map(|(_, notice)| notice.clone()).collect();
    }
    report
}

/// "(C75xx) Potential Performance Loss: wgmma.mma_async instructions are
/// serialized due to REASON in the function 'NAME'" → (NAME, code, REASON).
fn wgmma_serialization(msg: &str) -> Option<(&str, WgmmaSerialized)> {
    let (_, after) = msg.split_once("wgmma.mma_async instructions are serialized")?;
    let name = msg.rsplit('\'').nth(1)?;
    let code = msg.strip_prefix('(').and_then(|m| m.split_once(')')).map_or("", |(c, _)| c);
    let reason = after.trim_start().strip_prefix("due to ").unwrap_or(after.trim_start());
    let reason = reason.rsplit_once(" in the function").map_or(reason, |(r, _)| r).trim();
    Some((name, WgmmaSerialized { code: code.to_string(), reason: reason.to_string() }))
}

/// `"ptxas info    : msg"` → `"msg"` when the line carries `tag`.
fn strip_tag<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(tag)?;
    let (pad, msg) = rest.split_once(':')?;
    pad.trim().is_empty().then_some(msg.trim())
}

/// Applies comma-separated clauses of the form `[used] N words…`.
fn apply_clauses(k: &mut KernelResources, clauses: &str) {
    for clause in clauses.split(',') {
        let mut words = clause.split_whitespace().peekable();
        if words.peek() == Some(&"used") {
            words.next();
        }
        let Some(value) = words.next().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let unit: Vec<&str> = words.collect();
        match unit.as_slice() {
            ["registers"] | ["register"] => k.registers = value,
            ["barriers"] | ["barrier"] => k.barriers = value,
            ["bytes", "smem"] => k.smem_static = value,
            ["bytes", bank] if bank.starts_with("cmem") => k.cmem += value,
            ["bytes", "stack", "frame"] => k.stack_frame = value,
            ["bytes", "spill", "stores"] => k.spill_stores = value,
            ["bytes", "spill", "loads"] => k.spill_loads = value,
            ["bytes", "cumulative", "stack", "size"] => k.cumulative_stack = value,
            _ => {} // clauses this parser does not track (gmem, lmem, textures…)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_ARCHS: &str = include_str!("../../tests/data/ptxas-verbose-sm89-sm90-sm90a.txt");

    /// Entries with a wgmma-serialisation notice, in report order.
    fn serialized(r: &Report) -> Vec<&str> {
        r.kernels.iter().filter(|k| !k.wgmma_serialized.is_empty()).map(|k| k.name.as_str()).collect()
    }

    fn find<'a>(r: &'a Report, name: &str, arch: &str) -> &'a KernelResources {
        r.kernels
            .iter()
            .find(|k| k.name == name && k.arch == arch)
            .unwrap_or_else(|| panic!("{name} for {arch} missing from {r:#?}"))
    }

    #[test]
    fn parses_every_entry_for_every_arch() {
        let r = parse(THREE_ARCHS);
        assert_eq!(r.kernels.len(), 9);
        for arch in ["sm_89", "sm_90", "sm_90a"] {
            assert_eq!(r.kernels.iter().filter(|k| k.arch == arch).count(), 3);
        }
        let tiles = find(&r, "tiles", "sm_89");
        assert_eq!(
            *tiles,
            KernelResources {
                name: "tiles".into(),
                arch: "sm_89".into(),
                registers: 13,
                barriers: 1,
                smem_static: 9216,
                cmem: 368,
                ..Default::default()
            }
        );
        assert_eq!(find(&r, "tiles", "sm_90a").registers, 12);
        assert_eq!(find(&r, "tiles", "sm_90").cmem, 0, "sm_90 lines carry no cmem clause");
    }

    #[test]
    fn stack_frame_and_mangled_names() {
        let r = parse(THREE_ARCHS);
        let spilly = find(&r, "spilly", "sm_90a");
        assert_eq!(spilly.stack_frame, 1024);
        assert_eq!(spilly.cumulative_stack, 1024);
        assert_eq!(spilly.registers, 58);
        assert_eq!(spilly.spill_bytes(), 0);
        assert_eq!(find(&r, "_Z5templILi64EEvPKfPf", "sm_89").registers, 10);
    }

    #[test]
    fn clauses_in_any_order_and_spills() {
        let text = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
            ptxas info    : Function properties for k\n\
            \x20   16 bytes stack frame, 40 bytes spill stores, 24 bytes spill loads\n\
            ptxas info    : Used 512 bytes smem, used 2 barriers, 255 registers\n\
            ptxas warning : (C7508) Potential Performance Loss: 'setmaxnreg' ignored\n";
        let r = parse(text);
        let k = &r.kernels[0];
        assert_eq!((k.registers, k.barriers, k.smem_static), (255, 2, 512));
        assert_eq!((k.stack_frame, k.spill_stores, k.spill_loads), (16, 40, 24));
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("C7508"));
    }

    #[test]
    fn device_function_properties_do_not_leak_into_entries() {
        let text = "ptxas info    : Compiling entry function 'k' for 'sm_89'\n\
            ptxas info    : Function properties for helper\n\
            \x20   64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
            ptxas info    : Function properties for k\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 32 registers\n";
        let k = &parse(text).kernels[0];
        assert_eq!((k.stack_frame, k.spill_bytes(), k.registers), (0, 0, 32));
    }

    #[test]
    fn wgmma_serialisation_is_flagged_on_the_entries_it_names() {
        // Captured from nvcc 13.0 on an experimental Hopper kernel whose half key
        // tile shared the full tile's accumulator array.
        let r = parse(include_str!("../../tests/data/ptxas-c7511-wgmma-serialized-sm90a.txt"));
        assert_eq!(r.kernels.len(), 5);
        assert_eq!(
            serialized(&r),
            [
                "flash_fwd_hopper_f16_d128_causal",
                "flash_fwd_hopper_f16_d128_m64",
                "flash_fwd_hopper_f16_d64_causal_m64"
            ]
        );
        assert_eq!(find(&r, "flash_fwd_hopper_f16_d64_causal_m64", "sm_90a").registers, 128);
        let why = &find(&r, "flash_fwd_hopper_f16_d128_m64", "sm_90a").wgmma_serialized;
        assert_eq!(
            why,
            &[WgmmaSerialized {
                code: "C7511".into(),
                reason: "insufficient register resources for the wgmma pipeline".into()
            }]
        );
        assert!(parse(THREE_ARCHS).kernels.iter().all(|k| k.wgmma_serialized.is_empty()));
        // C7510: a printf added to the kernel for a timing trace.
        let r = parse(include_str!("../../tests/data/ptxas-c7510-wgmma-call-sm90a.txt"));
        assert_eq!(
            serialized(&r),
            ["flash_fwd_hopper_f16_d128_m64", "flash_fwd_hopper_f16_d128", "flash_fwd_hopper_f16_d64_m64"]
        );
        assert_eq!(find(&r, "flash_fwd_hopper_f16_d128", "sm_90a").wgmma_serialized[0].code, "C7510");
        // C7515: O zeroed with one constant copied into its registers after a Q·Kᵀ
        // was issued (perf/rejected/exp-turns-chained-issue, before its fix).
        let r = parse(include_str!("../../tests/data/ptxas-c7515-wgmma-accumulator-sm90a.txt"));
        let flagged: Vec<(&str, &str)> = r
            .kernels
            .iter()
            .flat_map(|k| k.wgmma_serialized.iter().map(move |w| (k.name.as_str(), w.code.as_str())))
            .collect();
        assert_eq!(flagged, [("flash_fwd_hopper_f16_d64", "C7515"), ("flash_fwd_hopper_f16_d64_causal", "C7515")]);
        assert!(
            find(&r, "flash_fwd_hopper_f16_d64", "sm_90a").wgmma_serialized[0]
                .reason
                .starts_with("non wgmma instructions defining accumulator registers")
        );
    }

    #[test]
    fn output_cut_short_leaves_the_entry_out() {
        let full = parse(THREE_ARCHS).kernels;
        for cut in (0..THREE_ARCHS.len()).filter(|&c| THREE_ARCHS.is_char_boundary(c)) {
            // Whatever is read is read whole; the rest is missing, not zero.
            let read = parse(&THREE_ARCHS[..cut]).kernels;
            assert_eq!(read[..], full[..read.len()], "cut at byte {cut}");
        }
        let text = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
            ptxas info    : Function properties for k\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 168 registers, used 1 barriers, 49152 bytes smem\n";
        assert_eq!(parse(text).kernels[0].smem_static, 49152);
        assert!(parse(&text[..text.len() - 1]).kernels.is_empty(), "the Used line without its newline");
        assert!(parse(&text[..text.find("ptxas info    : Used").unwrap()]).kernels.is_empty());
    }

    #[test]
    fn garbage_is_ignored_not_fatal() {
        let r = parse("nvcc warning : something\nptxas info : Used lots of registers\n\n");
        assert!(r.kernels.is_empty());
    }
}
