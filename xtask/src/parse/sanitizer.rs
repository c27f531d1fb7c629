//! Parsers for compute-sanitizer output. Pure: text in, records out.
//!
//! The XML (`--xml --save FILE`) holds one `<record>` per finding up to the print
//! limit; the text output's `ERROR SUMMARY` / `RACECHECK SUMMARY` lines hold the
//! true counts. Unknown elements are ignored, never fatal; output that is absent,
//! cut short or not the tool's never reads as a clean run.

use anyhow::Result;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, Default)]
struct RawOutput {
    #[serde(rename = "record", default)]
    records: Vec<RawRecord>,
}

#[derive(Debug, Deserialize)]
struct RawRecord {
    kind: Option<String>,
    level: Option<String>,
    who: Option<RawWho>,
    what: Option<RawWhat>,
    #[serde(rename = "where")]
    location: Option<RawWhere>,
    #[serde(rename = "hostStack")]
    host_stack: Option<RawStack>,
}

#[derive(Debug, Deserialize)]
struct RawWho {
    #[serde(rename = "threadIdx")]
    thread: Option<Dim3>,
    #[serde(rename = "blockIdx")]
    block: Option<Dim3>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Dim3 {
    #[serde(default)]
    pub x: u32,
    #[serde(default)]
    pub y: u32,
    #[serde(default)]
    pub z: u32,
}

#[derive(Debug, Deserialize)]
struct RawWhat {
    text: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    address: Option<String>,
    size: Option<u64>,
    space: Option<String>,
    source: Option<RawAccess>,
    /// Racecheck lists one destination per conflicting instruction.
    #[serde(rename = "destination", default)]
    destinations: Vec<RawAccess>,
}

#[derive(Debug, Deserialize)]
struct RawAccess {
    direction: Option<String>,
    #[serde(rename = "where")]
    location: Option<RawWhere>,
    count: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawWhere {
    func: Option<String>,
    path: Option<String>,
    line: Option<u32>,
    pc: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawStack {
    #[serde(rename = "frame", default)]
    frames: Vec<RawFrame>,
}

#[derive(Debug, Deserialize)]
struct RawFrame {
    func: Option<String>,
}

/// A source location in a kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub kernel: String,
    pub file: String,
    /// 0 when the report carries no line (then `pc` places it).
    pub line: u32,
    pub pc: Option<String>,
}

impl Location {
    /// `file.cu:12`, or `kernel+0x32a0` when the record has no line information.
    pub fn source(&self) -> String {
        match (self.line, &self.pc) {
            (0, Some(pc)) => format!("{}+{pc}", self.kernel),
            _ => format!("{}:{}", self.file, self.line),
        }
    }
}

/// One finding, normalised across tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// `Precise`, `Analysis` (racecheck), `Initcheck`, `Synccheck`, …
    pub kind: String,
    /// `Error`, `Warning`; absent in some records (treated as errors).
    pub level: String,
    pub what: String,
    pub location: Location,
    /// For races: the other access.
    pub other: Option<Location>,
    pub thread: Option<Dim3>,
    pub block: Option<Dim3>,
    pub address: Option<String>,
    pub size: Option<u64>,
    /// Hazard count a racecheck record stands for.
    pub count: u64,
    pub host_stack: Vec<String>,
}

impl Finding {
    pub fn is_error(&self) -> bool {
        !self.level.eq_ignore_ascii_case("warning") && !self.level.eq_ignore_ascii_case("info")
    }
}

fn location(w: Option<&RawWhere>) -> Location {
    w.map(|w| Location {
        kernel: w.func.clone().unwrap_or_default(),
        file: w.path.as_deref().map(short_path).unwrap_or_default().to_string(),
        line: w.line.unwrap_or(0),
        pc: w.pc.clone(),
    })
    .unwrap_or_default()
}

fn short_path(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Parses `--xml` output into findings.
pub fn parse_xml(xml: &str) -> Result<Vec<Finding>> {
    let raw: RawOutput = crate::parse::xml::from_str(xml, "ComputeSanitizerOutput", "compute-sanitizer XML")?;
    Ok(raw
        .records
        .into_iter()
        .map(|r| {
            let what = r.what.as_ref();
            let dests: &[RawAccess] = what.map_or(&[], |w| &w.destinations);
            let dest = dests.first();
            let src = what.and_then(|w| w.source.as_ref());
            // Races carry their location inside what/source and what/destination.
            let (loc, other) = match (&r.location, src) {
                (Some(w), _) => (location(Some(w)), None),
                (None, Some(s)) => (location(s.location.as_ref()), dest.map(|d| location(d.location.as_ref()))),
                (None, None) => (Location::default(), None),
            };
            let mut text = what.and_then(|w| w.text.clone()).unwrap_or_default();
            if let Some(kind) = what.and_then(|w| w.kind.as_deref()) {
                text = format!("{text}: {kind}");
            }
            if let (Some(s), Some(d)) = (src, dest) {
                let dir = |a: &RawAccess| a.direction.clone().unwrap_or_default();
                text = format!("{text} ({} → {})", dir(s), dir(d));
            }
            Finding {
                kind: r.kind.unwrap_or_default(),
                level: r.level.unwrap_or_else(|| "Error".into()),
                what: text,
                location: loc,
                other,
                thread: r.who.as_ref().and_then(|w| w.thread),
                block: r.who.as_ref().and_then(|w| w.block),
                address: what.and_then(|w| w.address.clone()),
                size: what.and_then(|w| w.size),
                count: if dests.is_empty() { 1 } else { dests.iter().map(|d| d.count.unwrap_or(1)).sum() },
                host_stack: r
                    .host_stack
                    .map(|s| s.frames.into_iter().filter_map(|f| f.func).collect())
                    .unwrap_or_default(),
            }
            .with_space(what.and_then(|w| w.space.as_deref()))
        })
        .collect())
}

impl Finding {
    fn with_space(mut self, space: Option<&str>) -> Finding {
        if let Some(space) = space
            && !self.what.contains(space)
        {
            self.what = format!("{} [{space}]", self.what);
        }
        self
    }
}

/// The counts from the text output's summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub errors: u64,
    pub warnings: u64,
    /// From memcheck's `LEAK SUMMARY` (with `--leak-check full`).
    pub leaked_bytes: u64,
}

/// Reads `ERROR SUMMARY: N errors` (memcheck, initcheck, synccheck) or
/// `RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)`, and memcheck's
/// `LEAK SUMMARY: N bytes leaked in M allocations`. `None` when no complete summary
/// line exists, or a leak line does not read: the tool checked nothing, died, or
/// its output was cut short.
pub fn parse_summary(text: &str) -> Option<Summary> {
    let mut leaked_bytes = 0;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim_start_matches('=').trim();
        if let Some(rest) = line.strip_prefix("LEAK SUMMARY:") {
            leaked_bytes = leak(rest)?;
        } else if found.is_none() {
            found = error_summary(line).or_else(|| racecheck_summary(line));
        }
    }
    found.map(|s| Summary { leaked_bytes, ..s })
}

/// `N bytes leaked in M allocations` → N.
fn leak(rest: &str) -> Option<u64> {
    match rest.split_whitespace().collect::<Vec<_>>()[..] {
        [n, "byte" | "bytes", "leaked", ..] => n.parse().ok(),
        _ => None,
    }
}

/// `ERROR SUMMARY: N errors`. The line after it, `ERROR SUMMARY: N errors were
/// not printed…`, has more words and is not a summary.
fn error_summary(line: &str) -> Option<Summary> {
    match line.strip_prefix("ERROR SUMMARY:")?.split_whitespace().collect::<Vec<_>>()[..] {
        [n, "error" | "errors"] => Some(Summary { errors: n.parse().ok()?, warnings: 0, leaked_bytes: 0 }),
        _ => None,
    }
}

/// `RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)`, every word of it.
fn racecheck_summary(line: &str) -> Option<Summary> {
    let (head, inner) = line.strip_prefix("RACECHECK SUMMARY:")?.split_once('(')?;
    let [hazards, "hazard" | "hazards", "displayed"] = head.split_whitespace().collect::<Vec<_>>()[..] else {
        return None;
    };
    hazards.parse::<u64>().ok()?;
    let words: Vec<&str> = inner.strip_suffix(')')?.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    match words[..] {
        [e, "error" | "errors", w, "warning" | "warnings"] => {
            Some(Summary { errors: e.parse().ok()?, warnings: w.parse().ok()?, leaked_bytes: 0 })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!("{}/tests/data/h200/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn memcheck_out_of_bounds() {
        let f = parse_xml(&fixture("compute-sanitizer-memcheck-oob.xml")).unwrap();
        assert_eq!(f.len(), 100, "the XML stops at the print limit");
        let first = &f[0];
        assert_eq!((first.kind.as_str(), first.level.as_str()), ("Precise", "Error"));
        assert!(first.what.contains("out of bounds"), "{}", first.what);
        assert_eq!(first.location.source(), "k.cu:5");
        assert_eq!(first.location.kernel, "oob");
        assert_eq!(first.thread, Some(Dim3 { x: 64, y: 0, z: 0 }));
        assert_eq!(first.block, Some(Dim3 { x: 8, y: 0, z: 0 }));
        assert_eq!(first.size, Some(4));
        assert_eq!(first.host_stack[0], "cuLaunchKernel");
        let s = parse_summary(&fixture("compute-sanitizer-memcheck-oob.txt")).unwrap();
        assert_eq!(s.errors, 224_584, "the text count, not the 100 XML records");
    }

    #[test]
    fn racecheck_hazard() {
        let f = parse_xml(&fixture("compute-sanitizer-racecheck-hazard.xml")).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, "Analysis");
        assert_eq!(f[0].location.line, 4);
        assert_eq!(f[0].other.as_ref().unwrap().line, 6);
        assert_eq!(f[0].count, 1024);
        assert!(f[0].what.contains("Race condition (Write → Read)"), "{}", f[0].what);
        let s = parse_summary(&fixture("compute-sanitizer-racecheck-hazard.txt")).unwrap();
        assert_eq!(s, Summary { errors: 1, warnings: 0, leaked_bytes: 0 });
    }

    #[test]
    fn initcheck_and_synccheck() {
        let f = parse_xml(&fixture("compute-sanitizer-initcheck-uninit.xml")).unwrap();
        assert!(f.iter().all(|r| r.kind == "Initcheck" && r.is_error()), "no level means error");
        assert!(f[0].what.starts_with("Uninitialized __global__ memory read"));
        assert_eq!(parse_summary(&fixture("compute-sanitizer-initcheck-uninit.txt")).unwrap().errors, 256);
        let f = parse_xml(&fixture("compute-sanitizer-synccheck-divergent.xml")).unwrap();
        assert_eq!(f[0].what, "Barrier error: Divergent thread(s) in warp");
        assert_eq!(f[0].location.kernel, "divergent_barrier");
        assert_eq!(parse_summary(&fixture("compute-sanitizer-synccheck-divergent.txt")).unwrap().errors, 16);
    }

    #[test]
    fn clean_runs_and_missing_summary() {
        for name in [
            "compute-sanitizer-memcheck-clean.xml",
            "compute-sanitizer-racecheck-clean.xml",
            "compute-sanitizer-memcheck-leakcheck-clean.xml",
        ] {
            assert!(parse_xml(&fixture(name)).unwrap().is_empty(), "{name}");
        }
        assert_eq!(
            parse_summary("========= ERROR SUMMARY: 0 errors\n"),
            Some(Summary { errors: 0, warnings: 0, leaked_bytes: 0 })
        );
        assert_eq!(parse_summary("program output only\n"), None);
    }

    fn project(name: &str) -> String {
        std::fs::read_to_string(format!("{}/tests/data/project/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn our_planted_race_with_many_destinations() {
        // FA_DEFECT_RACE on flash_fwd: one write conflicting with several reads per record.
        let f = parse_xml(&project("racecheck-FA_DEFECT_RACE.xml")).unwrap();
        assert_eq!(f.len(), 32);
        assert!(f.iter().all(|r| r.kind == "Analysis" && r.other.is_some()));
        // Writes by the V tile's cp.async against ldmatrix.trans reads of the same tile.
        assert!(f.iter().any(|r| r.location.kernel == "cp_async_16"));
        assert!(f.iter().any(|r| r.other.as_ref().is_some_and(|o| o.kernel == "ldmatrix_x4_trans")));
        assert!(f[0].count > 5072, "counts of all destinations add up: {}", f[0].count);
        assert_eq!(f[0].location.source(), "flash_fwd_f16_d64+0x32a0");
        let s = parse_summary(&project("racecheck-FA_DEFECT_RACE.txt")).unwrap();
        assert_eq!(s.errors, 32);
    }

    #[test]
    fn our_planted_tail_overflow_and_leaks() {
        let f = parse_xml(&project("memcheck-FA_DEFECT_OOB_TAIL.xml")).unwrap();
        assert_eq!(f.len(), 5, "trimmed capture");
        assert!(f[0].what.starts_with("Invalid __global__ write of size 4 bytes is out of bounds"));
        assert_eq!(f[0].location.kernel, "flash_fwd_f16_d64");
        let s = parse_summary(&project("memcheck-FA_DEFECT_OOB_TAIL.summary.txt")).unwrap();
        assert_eq!((s.errors, s.leaked_bytes), (121, 100_360));
    }

    #[test]
    fn a_summary_cut_short_is_none_never_fewer_errors() {
        for text in [
            project("racecheck-FA_DEFECT_RACE.txt"),
            fixture("compute-sanitizer-racecheck-hazard.txt"),
            fixture("compute-sanitizer-memcheck-oob.txt"),
            project("memcheck-FA_DEFECT_OOB_TAIL.summary.txt"),
        ] {
            let full = parse_summary(&text).unwrap();
            let line = text.find("SUMMARY:").unwrap();
            let line = text[..line].rfind('\n').map_or(0, |n| n + 1);
            for cut in (line..text.len()).filter(|&c| text.is_char_boundary(c)) {
                let read = parse_summary(&text[..cut]);
                assert!(read.is_none() || read == Some(full), "{:?} read as {read:?}", &text[line..cut]);
            }
        }
        // Every word of a racecheck summary is there, or it does not count.
        let race = "========= RACECHECK SUMMARY: 32 hazards displayed (32 errors, 0 warnings)";
        for cut in race.find("(3").unwrap()..race.len() {
            assert_eq!(parse_summary(&race[..cut]), None, "{}", &race[..cut]);
        }
        let leak = "========= LEAK SUMMARY: lots\n========= ERROR SUMMARY: 0 errors\n";
        assert_eq!(parse_summary(leak), None, "an unreadable leak line is not 0 bytes leaked");
    }

    #[test]
    fn xml_that_is_absent_cut_short_or_foreign_is_an_error() {
        for xml in ["", "========= ERROR SUMMARY: 0 errors\n", "<?xml version=\"1.0\"?>\n<nvidia_smi_log/>"] {
            assert!(parse_xml(xml).is_err(), "{xml:?}");
        }
        for text in [project("racecheck-FA_DEFECT_RACE.xml"), fixture("compute-sanitizer-memcheck-oob.xml")] {
            let end = text.find("</ComputeSanitizerOutput>").unwrap();
            let cuts: Vec<usize> = text[..end].match_indices("</record>").map(|(i, _)| i + "</record>".len()).collect();
            for &cut in cuts.iter().step_by(cuts.len().div_ceil(40)) {
                assert!(parse_xml(&text[..cut]).is_err(), "cut after byte {cut} parsed");
            }
        }
    }

    #[test]
    fn unknown_elements_are_tolerated() {
        let xml = r#"<?xml version="1.0"?><ComputeSanitizerOutput><newThing>1</newThing>
            <record><kind>Precise</kind><level>Error</level><future><a/></future>
            <what><text>x</text><novel>y</novel></what></record></ComputeSanitizerOutput>"#;
        let f = parse_xml(xml).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].what, "x");
    }
}
