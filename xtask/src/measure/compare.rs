//! Named baselines and `cargo xtask bench compare A B`, as criterion and
//! nvbench_compare have them. A baseline is a saved `bench.json`
//! (`--save-baseline NAME` → `target/xtask/baselines/NAME.json`). Two saved
//! runs were timed at different times, so their difference is information, not
//! a verdict: the table says so, and shows the gate's paired interval only for
//! a run that holds a gate (its own base against its candidate).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::measure::gate::sequence::median;
use crate::measure::gate::verdict_word;
use crate::measure::payload::{BenchPayload, Comparison, GateCell, Row, side_medians, side_methods};
use crate::report::{Device, Envelope, KernelSetRecord};
use crate::run::Run;
use crate::table;
use crate::tools::process::write_file;

/// A saved run: `NAME` (under `target/xtask/baselines/`) or a path to a bench.json.
pub fn locate(cx: &Run, name: &str) -> PathBuf {
    let p = Path::new(name);
    if name.contains('/') || p.extension().is_some_and(|e| e == "json") {
        p.to_path_buf()
    } else {
        cx.reports().join("baselines").join(format!("{name}.json"))
    }
}

/// Checks a baseline name: a file name, no folders.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.');
    if !ok {
        bail!("baseline name `{name}`: use letters, digits, `-`, `_` and `.` (it names a file)");
    }
    if name.len() > 100 {
        bail!("baseline name of {} characters: at most 100 (it names a file)", name.len());
    }
    if let Some(stem) = name.strip_suffix(".json") {
        bail!(
            "baseline name `{name}`: a name, not a file (`--baseline {name}` would read ./{name}); \
             `--save-baseline {stem}` saves target/xtask/baselines/{stem}.json"
        );
    }
    Ok(())
}

pub fn load(cx: &Run, name: &str) -> Result<Envelope<BenchPayload>> {
    let path = locate(cx, name);
    if !path.is_file() {
        let dir = cx.reports().join("baselines");
        let saved: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json").map(String::from)).collect())
            .unwrap_or_default();
        bail!(
            "no saved run `{name}` ({} does not exist); saved: [{}]; save one with `cargo xtask bench --save-baseline NAME`",
            path.display(),
            saved.join(", ")
        );
    }
    let text = fa_schema::file::read_text(&path)?;
    parse_bench(&text).with_context(|| format!("reading {}", path.display()))
}

/// A saved bench report, or an error that says what the file is instead.
fn parse_bench(text: &str) -> Result<Envelope<BenchPayload>> {
    let value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    match value.get("kind").and_then(|k| k.as_str()) {
        Some("bench") => serde_json::from_value(value).context("a bench report of another schema"),
        Some(kind) => bail!(
            "a `{kind}` report, not a bench one: compare takes what `cargo xtask bench` writes \
             (target/xtask/bench.json, or a baseline NAME)"
        ),
        None => bail!("not an xtask report (no `kind`): compare takes target/xtask/bench.json or a baseline NAME"),
    }
}

/// Median of process medians per case (plain runs), or the gate's candidate
/// medians where the run holds only a gate.
fn medians(p: &BenchPayload) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let mut us: BTreeMap<String, f64> =
        side_medians(&p.runs, "candidate").iter().map(|(k, v)| (k.clone(), median(v))).collect();
    let mut methods = side_methods(&p.runs, "candidate");
    for g in p.gate.iter().flat_map(|g| &g.shapes) {
        us.entry(g.name.clone()).or_insert(g.cand_us);
        methods.entry(g.name.clone()).or_insert_with(|| g.method.clone());
    }
    (us, methods)
}

fn clock(p: &BenchPayload) -> Option<f64> {
    let c: Vec<f64> = p.runs.iter().filter_map(|r| r.sm_clock_mhz).collect();
    (!c.is_empty()).then(|| median(&c))
}

/// One side of a comparison: a saved run or this one.
pub struct Side<'a> {
    pub name: &'a str,
    pub payload: &'a BenchPayload,
    pub device: Option<&'a Device>,
    pub kernel_set: Option<&'a KernelSetRecord>,
}

impl<'a> Side<'a> {
    pub fn of(name: &'a str, e: &'a Envelope<BenchPayload>) -> Side<'a> {
        Side { name, payload: &e.payload, device: e.device.as_ref(), kernel_set: e.kernel_set.as_ref() }
    }
}

/// A against B, case by case. Pure.
pub fn compare(a: Side, b: Side) -> Comparison {
    let (a_name, b_name) = (a.name, b.name);
    let (a_us, a_method) = medians(a.payload);
    let (b_us, b_method) = medians(b.payload);
    let gate: BTreeMap<&str, GateCell> = b
        .payload
        .gate
        .iter()
        .flat_map(|g| &g.shapes)
        .map(|s| {
            let cell = GateCell {
                change: s.change,
                low: s.ci_low,
                high: s.ci_high,
                verdict: verdict_word(s.verdict).to_string(),
            };
            (s.name.as_str(), cell)
        })
        .collect();
    let names: BTreeSet<&String> = a_us.keys().chain(b_us.keys()).collect();
    let mut warnings = vec![format!(
        "{a_name} and {b_name} were timed at different times: plain differences, not verdicts \
         (a verdict needs the paired gate: `bench --against REV` or `--base-dir DIR`)"
    )];
    let mut mixed = Vec::new();
    let rows = names
        .into_iter()
        .map(|name| {
            let (ma, mb) = (a_method.get(name), b_method.get(name));
            let method = match (ma, mb) {
                (Some(x), Some(y)) if x != y => {
                    mixed.push(name.clone());
                    format!("{x}→{y}")
                }
                (x, y) => x.or(y).cloned().unwrap_or_default(),
            };
            let (ua, ub) = (a_us.get(name).copied(), b_us.get(name).copied());
            Row {
                name: name.clone(),
                method,
                a_us: ua,
                b_us: ub,
                change: ua.zip(ub).map(|(x, y)| y / x - 1.0),
                gate: gate.get(name.as_str()).cloned(),
            }
        })
        .collect();
    if !mixed.is_empty() {
        warnings.push(format!("timed by different methods, not comparable: {}", mixed.join(", ")));
    }
    if let (Some(da), Some(db)) = (a.device, b.device)
        && (da.name != db.name || (da.uuid.is_some() && db.uuid.is_some() && da.uuid != db.uuid))
    {
        warnings.push(format!(
            "different GPUs: {} ({}) and {} ({})",
            da.name,
            da.uuid.as_deref().unwrap_or("?"),
            db.name,
            db.uuid.as_deref().unwrap_or("?")
        ));
    }
    if let (Some(ca), Some(cb)) = (clock(a.payload), clock(b.payload))
        && (cb / ca - 1.0).abs() > 0.02
    {
        warnings.push(format!("SM clock differed: {ca:.0} MHz in {a_name}, {cb:.0} MHz in {b_name}"));
    }
    if let (Some(ka), Some(kb)) = (a.kernel_set, b.kernel_set)
        && ka.sources.is_some()
        && ka.sources == kb.sources
    {
        warnings.push("both runs timed kernels built from the same sources: any difference is noise".into());
    }
    Comparison { a: a_name.into(), b: b_name.into(), rows, warnings }
}

fn us(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.2}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:+.2}%", x * 100.0))
}

fn gate_text(g: &Option<GateCell>) -> String {
    g.as_ref().map_or("-".into(), |g| {
        format!("{:+.2}% [{:+.2}%, {:+.2}%] {}", g.change * 100.0, g.low * 100.0, g.high * 100.0, g.verdict)
    })
}

const HEADER: [&str; 6] = ["case", "method", "A µs", "B µs", "B vs A (not a verdict)", "gate in B (paired)"];

fn cells(r: &Row) -> Vec<String> {
    vec![r.name.clone(), r.method.clone(), us(r.a_us), us(r.b_us), pct(r.change), gate_text(&r.gate)]
}

pub fn render(c: &Comparison) -> String {
    let rows: Vec<Vec<String>> = c.rows.iter().map(cells).collect();
    let mut out = format!("A = {}, B = {}\n{}", c.a, c.b, table::render(&HEADER, &rows));
    for w in &c.warnings {
        out.push_str(&format!("\nnote: {w}"));
    }
    out
}

pub fn markdown(c: &Comparison) -> String {
    let mut md = format!("### {} vs {}\n\n| {} |\n|---|---|---:|---:|---:|---|\n", c.b, c.a, HEADER.join(" | "));
    for r in &c.rows {
        md.push_str(&format!("| {} |\n", cells(r).join(" | ")));
    }
    for w in &c.warnings {
        md.push_str(&format!("\n- {w}"));
    }
    md + "\n"
}

/// One row per case; empty cells where a side lacks it. Fields never hold commas.
pub fn csv(c: &Comparison) -> String {
    let mut out = String::from("case,method,a_us,b_us,change,gate_change,gate_low,gate_high,gate_verdict\n");
    let num = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
    for r in &c.rows {
        let g = r.gate.as_ref();
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.name,
            r.method,
            num(r.a_us),
            num(r.b_us),
            num(r.change),
            num(g.map(|g| g.change)),
            num(g.map(|g| g.low)),
            num(g.map(|g| g.high)),
            g.map_or("", |g| g.verdict.as_str())
        ));
    }
    out
}

/// Writes `stem.{json,md,csv}` and prints the table.
pub fn report(c: &Comparison, stem: &Path) -> Result<()> {
    println!("{}", render(c));
    write_file(&stem.with_extension("json"), serde_json::to_string_pretty(c)? + "\n")?;
    write_file(&stem.with_extension("md"), markdown(c))?;
    write_file(&stem.with_extension("csv"), csv(c))?;
    println!("report: {}.{{json,md,csv}}", stem.display());
    Ok(())
}

/// `cargo xtask bench compare A B`.
pub fn run(cx: &Run, a: &str, b: &str) -> Result<()> {
    let (ea, eb) = (load(cx, a)?, load(cx, b)?);
    let c = compare(Side::of(a, &ea), Side::of(b, &eb));
    report(&c, &cx.reports().join("bench-compare"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn baseline_names_that_would_not_round_trip_are_refused_at_once() {
        assert!(check_name("before-tma.1").is_ok());
        assert!(format!("{:#}", check_name("x.json").unwrap_err()).contains("`--save-baseline x` saves"));
        assert!(format!("{:#}", check_name(&"a".repeat(300)).unwrap_err()).contains("at most 100"));
        assert!(check_name("../x").is_err());
    }

    use super::*;

    #[test]
    fn the_wrong_kind_of_report_is_named() {
        let e = parse_bench(r#"{"kind": "test", "payload": {}}"#).unwrap_err();
        assert!(format!("{e:#}").contains("a `test` report, not a bench one"), "{e:#}");
        let e = parse_bench(r#"{"cases": []}"#).unwrap_err();
        assert!(format!("{e:#}").contains("not an xtask report"), "{e:#}");
        assert!(format!("{:#}", parse_bench("nope").unwrap_err()).contains("not JSON"));
    }

    /// Captured on one H100: `bench --save-baseline a`, then `bench --baseline a`,
    /// then a gate of the build against itself (quad logs cut to eight).
    fn saved(name: &str) -> Envelope<BenchPayload> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/h100").join(format!("{name}.json"));
        crate::report::read_json(&path).unwrap()
    }

    #[test]
    fn two_plain_runs_compare_case_by_case_and_say_it_is_not_a_verdict() {
        let (a, b) = (saved("bench-a"), saved("bench-b"));
        let c = compare(Side::of("a", &a), Side::of("b", &b));
        let names: Vec<&str> = c.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["f16-b1h16s512d128", "f16-b4h16s2048d64-causal"]);
        let r = &c.rows[0];
        assert_eq!(r.method, "graph-replay");
        assert!((r.a_us.unwrap() - 7.6509).abs() < 1e-3 && (r.b_us.unwrap() - 7.584).abs() < 1e-3, "{r:?}");
        assert!((r.change.unwrap() + 0.00874).abs() < 1e-4, "{r:?}");
        assert!(r.gate.is_none());
        assert!(c.warnings[0].contains("not verdicts"), "{:?}", c.warnings);
        assert!(c.warnings.iter().any(|w| w.contains("same sources")), "{:?}", c.warnings);
        let table = render(&c);
        assert!(table.contains("-0.87%") && table.contains("B vs A (not a verdict)"), "{table}");
        let csv = csv(&c);
        assert_eq!(csv.lines().count(), 3, "{csv}");
        assert!(csv.lines().nth(1).unwrap().starts_with("f16-b1h16s512d128,graph-replay,7.65"), "{csv}");
        assert!(markdown(&c).contains("| f16-b4h16s2048d64-causal | events-cold-l2 | 92.10 | 91.17 | -1.02% | - |"));
    }

    #[test]
    fn a_gate_run_brings_its_paired_interval() {
        let (a, g) = (saved("bench-a"), saved("bench-gate"));
        let c = compare(Side::of("a", &a), Side::of("gate", &g));
        let gate = c.rows[0].gate.as_ref().expect("the gate's shape");
        assert_eq!(gate.verdict, "same");
        assert!(gate.low <= gate.change && gate.change <= gate.high);
        assert_eq!(c.rows[0].b_us, Some(g.payload.gate.as_ref().unwrap().shapes[0].cand_us));
        assert!(render(&c).contains(" same"), "{}", render(&c));
    }

    #[test]
    fn other_methods_gpus_and_clocks_are_named() {
        let (a, mut b) = (saved("bench-a"), saved("bench-b"));
        b.payload.runs.iter_mut().flat_map(|r| &mut r.run.cases).for_each(|c| c.method = "events-cold-l2".into());
        b.payload.runs.iter_mut().for_each(|r| r.sm_clock_mhz = Some(1755.0));
        let dev = b.device.as_mut().unwrap();
        dev.uuid = Some("GPU-11111111-2222-3333-4444-555555555555".into());
        let c = compare(Side::of("a", &a), Side::of("b", &b));
        assert_eq!(c.rows[0].method, "graph-replay→events-cold-l2");
        let all = c.warnings.join("\n");
        assert!(all.contains("different methods, not comparable: f16-b1h16s512d128"), "{all}");
        assert!(all.contains("different GPUs") && all.contains("GPU-11111111"), "{all}");
        assert!(all.contains("SM clock differed: 1980 MHz in a, 1755 MHz in b"), "{all}");
    }

    #[test]
    fn names_are_files_under_target_and_paths_are_paths() {
        let cx = Run::discover().unwrap();
        assert_eq!(locate(&cx, "main"), cx.reports().join("baselines/main.json"));
        assert_eq!(locate(&cx, "x/bench.json"), PathBuf::from("x/bench.json"));
        assert!(check_name("before-swizzle_2.1").is_ok());
        for bad in ["", "../up", "a/b", ".hidden", "sp ace"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let err = load(&cx, "no-such-baseline-here").unwrap_err().to_string();
        assert!(err.contains("--save-baseline NAME"), "{err}");
    }
}
