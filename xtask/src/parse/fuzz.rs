//! Property tests over every parser of tool output: arbitrary text, text made of
//! the tokens the parsers look for, and the captured outputs under
//! `tests/data` cut short or mutated never panic; a captured output cut short
//! reads as an error or as part of what the whole output reads, never as
//! something else. Cases are bounded so the suite stays a few seconds long.

use std::sync::LazyLock;

use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::parse::ncu;
use crate::parse::ptxas;
use crate::parse::sanitizer;
use crate::parse::sass;
use crate::parse::smi;
use crate::tools::toolchain;
use fa_schema::schema::{BenchRun, DeviceInfo, ServeReply, TestRun};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// Captured tool outputs, by path under `tests/data`.
const FIXTURES: [&str; 24] = [
    "h200/nvidia-smi-q-x.xml",
    "h200/compute-sanitizer-initcheck-uninit.txt",
    "h200/compute-sanitizer-initcheck-uninit.xml",
    "h200/compute-sanitizer-memcheck-clean.xml",
    "h200/compute-sanitizer-memcheck-oob.txt",
    "h200/compute-sanitizer-memcheck-oob.xml",
    "h200/compute-sanitizer-racecheck-hazard.txt",
    "h200/compute-sanitizer-racecheck-hazard.xml",
    "h200/compute-sanitizer-synccheck-divergent.txt",
    "h200/compute-sanitizer-synccheck-divergent.xml",
    "h200/ncu-csv-details.csv",
    "h200/ncu-csv-page-raw-tensor-regex.csv",
    "h200/ncu-csv-page-raw.csv",
    "h200/bench-torch-sdpa.json",
    "project/memcheck-FA_DEFECT_OOB_TAIL.summary.txt",
    "project/memcheck-FA_DEFECT_OOB_TAIL.xml",
    "project/racecheck-FA_DEFECT_RACE.txt",
    "project/racecheck-FA_DEFECT_RACE.xml",
    "sass/flash-fwd-sm90a-excerpt.sass",
    "ptxas-verbose-sm89-sm90-sm90a.txt",
    "ptxas-c7511-wgmma-serialized-sm90a.txt",
    "build/ptxas-too-much-smem-sm89.txt",
    "iterate/fa-bench-candidate-0.json",
    "h100/bench-a.json",
];

static TEXTS: LazyLock<Vec<String>> = LazyLock::new(|| {
    FIXTURES
        .iter()
        .map(|f| std::fs::read_to_string(format!("{DATA}/{f}")).expect("a fixture under tests/data"))
        .collect()
});

/// Indices of the XML captures in `FIXTURES`.
fn xml_fixtures() -> Vec<usize> {
    FIXTURES.iter().enumerate().filter(|(_, f)| f.ends_with(".xml")).map(|(i, _)| i).collect()
}

/// Pieces of the syntax the parsers key on, to build and splice in.
const TOKENS: [&str; 36] = [
    "<",
    ">",
    "/>",
    "</",
    "<!DOCTYPE x>",
    "<![CDATA[",
    "]]>",
    "<?x?>",
    "<!--",
    "-->",
    "&amp;",
    "&#0;",
    "&x;",
    "<record>",
    "</record>",
    "<ComputeSanitizerOutput>",
    "</ComputeSanitizerOutput>",
    "<nvidia_smi_log>",
    "<gpu id=\"0\">",
    "<size>",
    "<line>",
    "\"",
    "\",\"",
    "\"ID\",",
    "\n",
    " ",
    "=",
    "(",
    ")",
    ",",
    "18446744073709551616",
    "========= ERROR SUMMARY:",
    "RACECHECK SUMMARY: 1 hazard displayed (",
    "LEAK SUMMARY:",
    "Function : k\n",
    "\t\t..........\n",
];

fn tokens() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&TOKENS[..]), 0..48).prop_map(|t| t.concat())
}

/// ptxas report lines and pieces of them.
const PTXAS_LINES: [&str; 9] = [
    "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n",
    "ptxas info    : Function properties for k\n",
    "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n",
    "ptxas info    : Used 99 registers, used 1 barriers, 4096 bytes smem\n",
    "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to x in the function 'k'\n",
    "ptxas warning : w\n",
    "ptxas info    : Compiling '",
    "'",
    "\n",
];

fn ptxas_tokens() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&PTXAS_LINES[..]), 0..24).prop_map(|t| t.concat())
}

/// One edit: at a fraction of the text, delete up to `len` bytes, insert a
/// token, or cut the text there.
#[derive(Debug, Clone)]
enum Edit {
    Delete(f64, usize),
    Insert(f64, &'static str),
    Cut(f64),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0..1.0f64, 1..64usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        (0.0..1.0f64, prop::sample::select(&TOKENS[..])).prop_map(|(at, t)| Edit::Insert(at, t)),
        (0.0..1.0f64).prop_map(Edit::Cut),
    ]
}

/// The byte at `at` of `text`, moved back to a char boundary.
fn index(text: &str, at: f64) -> usize {
    let mut i = ((text.len() as f64 * at) as usize).min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(text: &str, edits: &[Edit]) -> String {
    let mut s = text.to_string();
    for e in edits {
        match *e {
            Edit::Delete(at, n) => {
                let i = index(&s, at);
                let mut j = (i + n).min(s.len());
                while !s.is_char_boundary(j) {
                    j += 1;
                }
                s.replace_range(i..j, "");
            }
            Edit::Insert(at, t) => s.insert_str(index(&s, at), t),
            Edit::Cut(at) => s.truncate(index(&s, at)),
        }
    }
    s
}

/// Every parser on `text`; each returns or errs, and a panic fails the property.
fn parse_all(text: &str) {
    let _ = ptxas::parse(text);
    let _ = sass::opcode_counts(text);
    for code in sass::listing(text).into_iter().flat_map(|fns| fns.into_values()) {
        let _ = sass::main_loop(&code);
    }
    let _ = sanitizer::parse_xml(text);
    let _ = sanitizer::parse_summary(text);
    let _ = smi::parse(text);
    let _ = ncu::parse(text);
    let _ = toolchain::parse_nvcc_version(text);
    let _ = serde_json::from_str::<TestRun>(text);
    let _ = serde_json::from_str::<BenchRun>(text);
    let _ = serde_json::from_str::<DeviceInfo>(text);
    let _ = serde_json::from_str::<ServeReply>(text);
}

/// A fixed seed: CI judges the same inputs on every run (a new seed is a local
/// experiment: PROPTEST_RNG_SEED does not override this).
fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_2026),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        parse_all(&text);
    }

    #[test]
    fn the_parsers_own_tokens_never_panic(text in tokens(), ptxas in ptxas_tokens()) {
        parse_all(&text);
        parse_all(&ptxas);
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// quick-xml 0.38 reached `unreachable!` on a DOCTYPE between two pieces of text.
    #[test]
    fn a_doctype_spliced_into_captured_xml_never_panics(
        which in prop::sample::select(xml_fixtures()),
        at in 0.0..1.0f64,
    ) {
        let mut xml = TEXTS[which].clone();
        xml.insert_str(index(&xml, at), "<!DOCTYPE x>");
        let _ = smi::parse(&xml);
        let _ = sanitizer::parse_xml(&xml);
    }

    #[test]
    fn mutated_captures_never_panic(
        which in 0..FIXTURES.len(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        parse_all(&mutate(&TEXTS[which], &edits));
    }

    #[test]
    fn captures_cut_short_read_as_errors_or_as_part_of_the_whole(
        which in 0..FIXTURES.len(),
        at in 0.0..1.0f64,
    ) {
        let full = &TEXTS[which];
        let cut = &full[..index(full, at)];
        // Past the root's end (`</root>`, or `<root/>` for an empty report) only
        // whitespace is left: that cut is the whole document.
        let xml_whole = |root: &str| {
            [format!("</{root}>"), format!("<{root}/>")]
                .iter()
                .any(|end| full.find(end.as_str()).is_some_and(|e| cut.len() >= e + end.len()))
        };
        if let Ok(s) = smi::parse(cut) {
            prop_assert!(xml_whole("nvidia_smi_log"));
            prop_assert_eq!(Some(s), smi::parse(full).ok());
        }
        if let Ok(f) = sanitizer::parse_xml(cut) {
            prop_assert!(xml_whole("ComputeSanitizerOutput"));
            prop_assert_eq!(Some(f), sanitizer::parse_xml(full).ok());
        }
        if let Some(s) = sanitizer::parse_summary(cut) {
            prop_assert_eq!(Some(s), sanitizer::parse_summary(full));
        }
        if let Ok(t) = ncu::parse(cut) {
            let whole = ncu::parse(full).expect("a cut that reads comes from a CSV that reads");
            prop_assert!(t.rows.len() <= whole.rows.len() && t.rows[..] == whole.rows[..t.rows.len()]);
        }
        if let Ok(read) = sass::opcode_counts(cut) {
            let whole = sass::opcode_counts(full).expect("a cut that reads comes from a dump that reads");
            prop_assert!(read.iter().all(|(f, c)| whole.get(f) == Some(c)));
        }
        let (read, whole) = (ptxas::parse(cut).kernels, ptxas::parse(full).kernels);
        prop_assert!(read.len() <= whole.len() && read[..] == whole[..read.len()]);
    }
}
