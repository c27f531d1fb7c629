//! `cargo xtask summary`: the iteration history from the ledger as a table, a
//! Markdown summary and an SVG chart of TFLOP/s per shape over iterations.

use std::collections::BTreeSet;
use std::fmt::Write;

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::ledger::{self, Record};
use crate::run::Run;
use crate::table;
use crate::tools::process::write_file;

pub fn run(cx: &Run) -> Result<()> {
    let entries = ledger::read(&cx.root.join("perf/ledger.jsonl"))?;
    if entries.is_empty() {
        println!("perf/ledger.jsonl is empty: run `cargo xtask iterate \"hypothesis\"` first");
        return Ok(());
    }
    println!("{}", history_table(&entries));
    let (md, svg) = (cx.reports().join("summary.md"), cx.reports().join("summary.svg"));
    write_file(&md, markdown(&entries))?;
    write_file(&svg, chart(&entries))?;
    println!("summary: {}\nchart:   {}", md.display(), svg.display());
    Ok(())
}

fn headline(e: &Record) -> String {
    let best = e.bench.iter().max_by(|a, b| a.tflops.total_cmp(&b.tflops));
    best.map_or("-".into(), |b| format!("{} {:.1} TFLOP/s", b.case, b.tflops))
}

pub fn history_table(entries: &[Record]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let changes: Vec<f64> = e.bench.iter().filter_map(|b| b.change).collect();
            let geo = (!changes.is_empty())
                .then(|| (changes.iter().map(|c| (1.0 + c).ln()).sum::<f64>() / changes.len() as f64).exp() - 1.0);
            let torch: Vec<f64> = e.bench.iter().filter_map(|b| b.speedup_vs_torch).collect();
            vec![
                e.iteration.to_string(),
                e.verdict.clone(),
                e.hypothesis.chars().take(48).collect(),
                geo.map_or("-".into(), |g| format!("{:+.2}%", g * 100.0)),
                headline(e),
                if torch.is_empty() {
                    // Why, where the run recorded it (no PyTorch, other timing methods).
                    e.bench.iter().find_map(|b| b.vs_torch_note.as_deref()).map_or("-".into(), |_| "n/a".into())
                } else {
                    format!(
                        "{:.2}x-{:.2}x",
                        torch.iter().cloned().fold(f64::MAX, f64::min),
                        torch.iter().cloned().fold(0.0, f64::max)
                    )
                },
            ]
        })
        .collect();
    table::render(&["#", "verdict", "hypothesis", "geo-mean change", "best case", "vs torch"], &rows)
}

pub fn markdown(entries: &[Record]) -> String {
    let mut md = String::from(
        "| # | verdict | device | hypothesis | prediction | cases (µs, change) |\n|---|---|---|---|---|---|\n",
    );
    for e in entries {
        let cases: Vec<String> = e
            .bench
            .iter()
            .map(|b| {
                let change = b.change.map_or(String::new(), |c| format!(" ({:+.1}%)", c * 100.0));
                let torch = b.speedup_vs_torch.map_or(String::new(), |x| format!(", {x:.2}x torch"));
                format!("{} {:.1}{change}{torch}", b.case, b.cand_us)
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            e.iteration,
            e.verdict,
            cell(e.device.as_deref().unwrap_or("")),
            cell(&e.hypothesis),
            cell(e.prediction.as_deref().unwrap_or("")),
            cases.join("<br>")
        );
    }
    md
}

/// Free text as one Markdown table cell: no column breaks, and no HTML (a
/// hypothesis is whatever someone typed; a renderer would run `<img onerror>`).
fn cell(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('|', "/").replace('\n', " ")
}

/// Panels at most (a 4 x 4 grid); the footnote counts the shapes beyond.
const MAX_PANELS: usize = 16;
const COLUMNS: usize = 4;
/// The highest attempts ringed and numbered in each panel.
const BEST: usize = 3;
/// Most x tick labels in a panel: plotters picks round steps up to this many.
const X_TICKS: usize = 6;
/// One panel's size in pixels.
const PANEL: (u32, u32) = (300, 220);
/// Title and legend.
const HEAD: u32 = 58;
const MIN_WIDTH: u32 = 720;
/// Colours of the accepted lines, one per precision in the order first seen;
/// precisions past these share `OTHER`.
const PALETTE: [RGBColor; 3] = [RGBColor(31, 119, 180), RGBColor(230, 110, 20), RGBColor(44, 150, 44)];
const OTHER: RGBColor = RGBColor(140, 140, 140);
const INK: RGBColor = RGBColor(34, 34, 34);
const MUTED: RGBColor = RGBColor(105, 105, 105);
const GRID: RGBColor = RGBColor(230, 230, 230);
/// The line where the device changed. No other element strokes in this colour:
/// `chart` dashes every stroke of it (plotters writes no `stroke-dasharray`).
const DEVICE_CHANGE: RGBColor = RGBColor(150, 150, 150);
const DASHES: &str = "3 3";
/// Shading of the iterations each device measured, one per device in the order
/// first measured (the first unshaded); devices past these share the last.
const DEVICE_SHADES: [Option<RGBColor>; 4] =
    [None, Some(RGBColor(120, 120, 120)), Some(RGBColor(148, 103, 189)), Some(RGBColor(140, 86, 75))];
const SHADE_ALPHA: f64 = 0.16;
/// Longest device name drawn (after the `NVIDIA ` prefix is dropped).
const DEVICE_CHARS: usize = 24;
/// One legend row's height in pixels.
const LEGEND_ROW: u32 = 20;
const MAX_WIDTH: u32 = 1200;
/// Estimated width of a character in font sizes (a sans-serif digit is 0.56):
/// what keeps labels apart without measuring fonts.
const CHAR_W: f64 = 0.6;
/// TFLOP/s beyond this are a broken measurement, left out like NaN.
const ABSURD: f64 = 1e9;

/// A case name's precision prefix and the shape after it: `bf16-b4h16s2048d64`
/// is (`bf16`, `b4h16s2048d64`); a name with no such prefix is all shape.
fn split_case(case: &str) -> (&str, &str) {
    match case.split_once('-') {
        Some((d, shape))
            if !shape.is_empty()
                && d.len() <= 5
                && d.starts_with(|c: char| c.is_ascii_alphabetic())
                && d.contains(|c: char| c.is_ascii_digit())
                && d.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            (d, shape)
        }
        _ => ("", case),
    }
}

/// One case measured in one record.
#[derive(Debug, Clone, Copy)]
struct Point {
    iteration: i64,
    tflops: f64,
    accepted: bool,
}

/// One precision of a shape: its accepted line and its other attempts.
#[derive(Debug)]
struct Series<'a> {
    dtype: &'a str,
    points: Vec<Point>,
    /// Measured in the state the panels show: its accepted line runs on to the last iteration.
    current: bool,
}

#[derive(Debug)]
struct Panel<'a> {
    shape: &'a str,
    series: Vec<Series<'a>>,
}

/// What the chart draws, decided before any drawing.
#[derive(Debug)]
struct Plan<'a> {
    panels: Vec<Panel<'a>>,
    /// Precisions in colour order.
    dtypes: Vec<&'a str>,
    /// The record whose shapes get panels: the latest accepted one that measured
    /// anything, else the latest that did; with whether it was accepted.
    latest: Option<(u32, bool)>,
    /// Its shapes past `MAX_PANELS`.
    over_cap: usize,
    /// Shapes only earlier records measured.
    older: usize,
    /// Measurements in the drawn panels that are NaN, infinite or absurd.
    unplottable: usize,
    records: usize,
    /// The x axis: one iteration either side of the ledger's.
    x: (i64, i64),
    /// The devices that measured, in the order first measured, as drawn (`device_label`).
    devices: Vec<String>,
    /// Runs of records on one device in iteration order: the first iteration of
    /// each and its index in `devices`. Every one after the first is a device change.
    segments: Vec<(i64, usize)>,
}

impl Plan<'_> {
    fn color(&self, dtype: &str) -> RGBColor {
        let k = self.dtypes.iter().position(|d| *d == dtype).unwrap_or(usize::MAX);
        PALETTE.get(k).copied().unwrap_or(OTHER)
    }

    /// Whether the records measured on more than one device: only then are the
    /// devices shaded, their changes marked and named.
    fn device_changed(&self) -> bool {
        self.segments.len() > 1
    }
}

/// The shading of device `k` (none for the first device).
fn shade(k: usize) -> Option<RGBAColor> {
    DEVICE_SHADES[k.min(DEVICE_SHADES.len() - 1)].map(|c| c.mix(SHADE_ALPHA))
}

/// A device's name as the chart draws it: `NVIDIA H100 80GB HBM3` is `H100 80GB HBM3`.
fn device_label(name: &str) -> String {
    let name = name.trim();
    shorten(name.strip_prefix("NVIDIA ").unwrap_or(name), DEVICE_CHARS)
}

/// The devices of the records that measured, in iteration order (a stable sort,
/// so records of one iteration keep their ledger order), as `Plan::devices` and
/// `Plan::segments`. A record that names no device continues the run before it.
fn device_runs(entries: &[Record]) -> (Vec<String>, Vec<(i64, usize)>) {
    let mut timeline: Vec<(i64, &str)> = entries
        .iter()
        .filter(|e| !e.bench.is_empty())
        .filter_map(|e| Some((i64::from(e.iteration), e.device.as_deref().filter(|d| !d.trim().is_empty())?)))
        .collect();
    timeline.sort_by_key(|t| t.0);
    let mut names: Vec<&str> = Vec::new();
    let mut segments: Vec<(i64, usize)> = Vec::new();
    for (iteration, device) in timeline {
        let k = names.iter().position(|n| *n == device).unwrap_or_else(|| {
            names.push(device);
            names.len() - 1
        });
        if segments.last().is_none_or(|s| s.1 != k) {
            segments.push((iteration, k));
        }
    }
    (names.iter().map(|n| device_label(n)).collect(), segments)
}

fn plan(entries: &[Record]) -> Plan<'_> {
    let measured = |e: &&Record| !e.bench.is_empty();
    let latest = entries
        .iter()
        .rev()
        .filter(measured)
        .find(|e| e.verdict == "accepted")
        .or_else(|| entries.iter().rev().find(measured));
    let mut shapes: Vec<&str> = Vec::new();
    let mut seen = BTreeSet::new();
    for b in latest.iter().flat_map(|e| &e.bench) {
        let shape = split_case(&b.case).1;
        if seen.insert(shape) {
            shapes.push(shape);
        }
    }
    let all: BTreeSet<&str> = entries.iter().flat_map(|e| &e.bench).map(|b| split_case(&b.case).1).collect();
    let older = all.len().saturating_sub(seen.len());
    let over_cap = shapes.len().saturating_sub(MAX_PANELS);
    shapes.truncate(MAX_PANELS);
    let current: BTreeSet<&str> = latest.iter().flat_map(|e| &e.bench).map(|b| b.case.as_str()).collect();
    let mut unplottable = 0;
    let mut dtypes: Vec<&str> = Vec::new();
    let panels: Vec<Panel> = shapes
        .into_iter()
        .map(|shape| {
            let mut series: Vec<Series> = Vec::new();
            for e in entries {
                for b in &e.bench {
                    let (dtype, s) = split_case(&b.case);
                    if s != shape {
                        continue;
                    }
                    let k = match series.iter().position(|s| s.dtype == dtype) {
                        Some(k) => k,
                        None => {
                            let current = current.contains(b.case.as_str());
                            series.push(Series { dtype, points: vec![], current });
                            if !dtypes.contains(&dtype) {
                                dtypes.push(dtype);
                            }
                            series.len() - 1
                        }
                    };
                    if b.tflops.is_finite() && b.tflops.abs() < ABSURD {
                        let accepted = e.verdict == "accepted";
                        series[k].points.push(Point { iteration: e.iteration.into(), tflops: b.tflops, accepted });
                    } else {
                        unplottable += 1;
                    }
                }
            }
            Panel { shape, series }
        })
        .collect();
    let iterations = || entries.iter().map(|e| i64::from(e.iteration));
    let x = match (iterations().min(), iterations().max()) {
        (Some(lo), Some(hi)) => (lo - 1, hi + 1),
        _ => (0, 2),
    };
    let (devices, segments) = device_runs(entries);
    Plan {
        panels,
        dtypes,
        latest: latest.map(|e| (e.iteration, e.verdict == "accepted")),
        over_cap,
        older,
        unplottable,
        records: entries.len(),
        x,
        devices,
        segments,
    }
}

/// Plotters' font sizes are 1.24 times the SVG's: this takes the SVG's.
fn font(px: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", plotters_size(px)).into_font())
}

/// The size plotters writes back as `px` (`size / 1.24`); some sizes, 13 and 15
/// among them, come back as 13.000000000000002.
fn plotters_size(px: f64) -> f64 {
    px * 1.24
}

fn text_width(text: &str, px: f64) -> i32 {
    (text.chars().count() as f64 * px * CHAR_W).ceil() as i32
}

/// `v` to at most `decimals` places, without trailing zeros or a negative zero.
fn number(v: f64, decimals: usize) -> String {
    let text = format!("{v:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    if text.parse::<f64>() == Ok(0.0) { "0".into() } else { text.into() }
}

/// `text` in at most `max` characters, the middle given up for an ellipsis.
fn shorten(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.into();
    }
    let keep = max.saturating_sub(1);
    let head: String = text.chars().take(keep - keep / 2).collect();
    let tail: String = text.chars().skip(n - keep / 2).collect();
    format!("{head}…{tail}")
}

enum Mark {
    Line(RGBColor),
    Hollow,
    Ring,
    /// A device's shading (none for the first device).
    Shade(Option<RGBAColor>),
    /// The dashed line where the device changed.
    Change,
}

fn legend(plan: &Plan) -> Vec<(Mark, String)> {
    let mut items: Vec<(Mark, String)> = plan
        .dtypes
        .iter()
        .take(PALETTE.len())
        .map(|d| (Mark::Line(plan.color(d)), if d.is_empty() { "accepted".into() } else { format!("{d} accepted") }))
        .collect();
    if plan.dtypes.len() > PALETTE.len() {
        items.push((Mark::Line(OTHER), "other precisions accepted".into()));
    }
    items.push((Mark::Hollow, "attempt not kept".into()));
    items.push((Mark::Ring, format!("{BEST} best, #iteration")));
    if plan.device_changed() {
        let named = plan.devices.len().min(DEVICE_SHADES.len());
        for (k, d) in plan.devices.iter().enumerate().take(named) {
            let last = k + 1 == named && plan.devices.len() > named;
            items.push((Mark::Shade(shade(k)), if last { "other devices".into() } else { d.clone() }));
        }
        items.push((Mark::Change, "device changed".into()));
    }
    items
}

const LEGEND_PX: f64 = 12.0;

fn item_width(text: &str) -> i32 {
    30 + text_width(text, LEGEND_PX) + 22
}

fn legend_width(items: &[(Mark, String)]) -> i32 {
    items.iter().map(|(_, t)| item_width(t)).sum()
}

/// The legend in rows that fit `width`, each item whole: where the row is.
fn legend_rows(items: &[(Mark, String)], width: u32) -> Vec<usize> {
    let (mut row, mut x) = (0, 12);
    items
        .iter()
        .map(|(_, t)| {
            let w = item_width(t);
            if x > 12 && x + w - 22 > width as i32 - 12 {
                (row, x) = (row + 1, 12);
            }
            x += w;
            row
        })
        .collect()
}

/// The footnote: which shapes have panels and what was left out, in lines that fit `width`.
fn footnote(plan: &Plan, width: u32) -> Vec<String> {
    let mut parts = vec![match plan.latest {
        Some((i, true)) => format!("One panel per shape measured in iteration {i}, the latest accepted."),
        Some((i, false)) => {
            format!("One panel per shape measured in iteration {i} (no accepted iteration measured any).")
        }
        None => "No record measured TFLOP/s.".into(),
    }];
    if plan.over_cap > 0 {
        parts.push(format!("{} more of its shapes not drawn (at most {MAX_PANELS} panels).", plan.over_cap));
    }
    if plan.older > 0 {
        parts.push(format!("{} shapes measured only in earlier iterations not drawn.", plan.older));
    }
    if plan.unplottable > 0 {
        parts.push(format!("{} measurements NaN, infinite or absurd, left out.", plan.unplottable));
    }
    // One device: named here; several: in the legend, their runs shaded.
    if let [one] = plan.devices.as_slice() {
        parts.push(format!("All measured on {one}."));
    }
    let mut lines: Vec<String> = vec![];
    for p in parts {
        match lines.last_mut() {
            Some(l) if text_width(&format!("{l} {p}"), 11.0) < width as i32 - 24 => *l = format!("{l} {p}"),
            _ => lines.push(p),
        }
    }
    lines
}

/// Small multiples of TFLOP/s over iterations, one panel per shape of the
/// latest accepted state: each precision's accepted state as a step line, the
/// attempts not kept as hollow points, the best few ringed and numbered. Where
/// the records measured on more than one device, each device's run of
/// iterations is shaded as the legend names it, a dashed line marks each change
/// and names the new device where its run is wide enough. Pure: the SVG text,
/// for `run` to write.
pub fn chart(entries: &[Record]) -> String {
    let plan = plan(entries);
    let mut svg = String::new();
    match draw(&plan, &mut svg) {
        Ok(()) => {
            let stroke = format!("stroke=\"{}\"", hex(DEVICE_CHANGE));
            svg.replace(&stroke, &format!("{stroke} stroke-dasharray=\"{DASHES}\""))
        }
        Err(e) => {
            let why = format!("{e:#}").replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
            format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{MIN_WIDTH}\" height=\"40\">\
                 <text x=\"10\" y=\"24\" font-family=\"sans-serif\" font-size=\"12\">chart failed: {why}</text></svg>\n"
            )
        }
    }
}

/// A colour as plotters writes it in SVG: `#55AA0F`.
fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

fn draw(plan: &Plan, svg: &mut String) -> Result<()> {
    let n = plan.panels.len();
    let cols = n.clamp(1, COLUMNS);
    let rows = n.div_ceil(cols).max(1);
    let items = legend(plan);
    let width = (cols as u32 * PANEL.0).max(MIN_WIDTH).max((legend_width(&items) as u32 + 24).min(MAX_WIDTH));
    let item_rows = legend_rows(&items, width);
    let head = HEAD + LEGEND_ROW * item_rows.iter().max().map_or(0, |&r| r as u32);
    let notes = footnote(plan, width);
    let foot = 12 + 16 * notes.len() as u32;
    let height = head + rows as u32 * PANEL.1 + foot;
    let root = SVGBackend::with_string(svg, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = (Pos::new(HPos::Left, VPos::Center), Pos::new(HPos::Right, VPos::Center));
    let title = TextStyle::from(("sans-serif", plotters_size(16.0)).into_font().style(FontStyle::Bold)).pos(left);
    root.draw(&Text::new("TFLOP/s per shape over iterations", (12, 16), title.color(&INK)))?;
    let span = match plan.x {
        (lo, hi) if plan.records > 0 => format!(", iterations {}-{}", lo + 1, hi - 1),
        _ => String::new(),
    };
    let source = format!("perf/ledger.jsonl: {} records{span}", plan.records);
    root.draw(&Text::new(source, (width as i32 - 12, 16), font(12.0).color(&MUTED).pos(right)))?;
    let (mut x, mut row) = (12, 0);
    for ((mark, text), &r) in items.iter().zip(&item_rows).filter(|_| n > 0) {
        if r != row {
            (x, row) = (12, r);
        }
        let y = 42 + (LEGEND_ROW * r as u32) as i32;
        match mark {
            Mark::Line(c) => {
                root.draw(&PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2)))?;
                root.draw(&Circle::new((x + 12, y), 2, c.filled()))?;
            }
            Mark::Hollow => root.draw(&Circle::new((x + 12, y), 3, MUTED.stroke_width(1)))?,
            Mark::Ring => root.draw(&Circle::new((x + 12, y), 6, INK.stroke_width(1)))?,
            Mark::Shade(tint) => {
                if let Some(tint) = tint {
                    root.draw(&Rectangle::new([(x + 3, y - 7), (x + 21, y + 7)], tint.filled()))?;
                }
                root.draw(&Rectangle::new([(x + 3, y - 7), (x + 21, y + 7)], MUTED.stroke_width(1)))?;
            }
            Mark::Change => root.draw(&PathElement::new(vec![(x + 12, y - 8), (x + 12, y + 8)], DEVICE_CHANGE))?,
        }
        root.draw(&Text::new(text.as_str(), (x + 30, y), font(LEGEND_PX).color(&INK).pos(left)))?;
        x += 30 + text_width(text, LEGEND_PX) + 22;
    }
    let grid = root.margin(head, foot, 0, 0);
    if n == 0 {
        let at = (width as i32 / 2, (head + PANEL.1 / 2) as i32);
        let centre = Pos::new(HPos::Center, VPos::Center);
        let text = "No TFLOP/s measured yet: `cargo xtask iterate \"hypothesis\"` adds some.";
        root.draw(&Text::new(text, at, font(14.0).color(&MUTED).pos(centre)))?;
    }
    for (k, (panel, cell)) in plan.panels.iter().zip(grid.split_evenly((rows, cols))).enumerate() {
        draw_panel(&root, &cell, plan, panel, k % cols == 0, k + cols >= n)?;
    }
    for (k, line) in notes.iter().enumerate() {
        let at = (12, (height - foot + 12 + 16 * k as u32) as i32);
        root.draw(&Text::new(line.as_str(), at, font(11.0).color(&MUTED).pos(left)))?;
    }
    root.present()?;
    Ok(())
}

/// Where a best attempt's number may go, tried in order: beside its ring, nearest first.
const LABEL_SPOTS: [(i32, i32); 18] = [
    (0, -15),
    (0, 15),
    (-18, -14),
    (18, -14),
    (-18, 14),
    (18, 14),
    (0, -27),
    (0, 27),
    (-24, 0),
    (24, 0),
    (-20, -26),
    (20, -26),
    (-20, 26),
    (20, 26),
    (-38, -14),
    (-38, 14),
    (0, -39),
    (0, 39),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn draw_panel(root: &Area, cell: &Area, plan: &Plan, panel: &Panel, left: bool, bottom: bool) -> Result<()> {
    let values = || panel.series.iter().flat_map(|s| &s.points).map(|p| p.tflops);
    let lo = values().fold(0.0, f64::min);
    let mut hi = values().fold(0.0, f64::max);
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let span = hi - lo;
    // Room above the highest point for its number.
    let y = (if lo < 0.0 { lo - 0.05 * span } else { 0.0 }, hi + 0.2 * span);
    let step = span / 5.0;
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()).clamp(0.0, 6.0) as usize };
    let (cell_w, _) = cell.dim_in_pixel();
    let title = shorten(panel.shape, ((f64::from(cell_w) - 24.0) / (14.0 * CHAR_W)) as usize);
    let mut chart = ChartBuilder::on(cell)
        .caption(title, font(14.0).color(&INK))
        .margin(6)
        .margin_right(18)
        .x_label_area_size(34)
        .y_label_area_size(52)
        .build_cartesian_2d(plan.x.0..plan.x.1, y.0..y.1)?;
    let x_label = |v: &i64| v.to_string();
    let y_label = |v: &f64| number(*v, decimals);
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(X_TICKS)
        .y_labels(5)
        // Not 0: plotters 0.3.7 overflows finding 0 integer key points.
        .max_light_lines(1)
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID.stroke_width(1))
        .axis_style(MUTED.stroke_width(1))
        .label_style(font(10.0).color(&MUTED))
        .axis_desc_style(font(11.0).color(&INK))
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label);
    if left {
        mesh.y_desc("TFLOP/s");
    }
    if bottom {
        mesh.x_desc("iteration");
    }
    mesh.draw()?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    // Where each device's run of iterations starts and ends, in pixels: half way
    // between its first iteration and the one before it.
    let edges: Vec<i32> = if plan.device_changed() {
        let at = |i: i64| chart.backend_coord(&(i, y.0)).0;
        let mut edges: Vec<i32> = plan.segments.iter().map(|&(i, _)| (at(i - 1) + at(i)) / 2).collect();
        edges[0] = px.start;
        edges.push(px.end);
        edges
    } else {
        vec![]
    };
    for (k, &(_, device)) in plan.segments.iter().enumerate().filter(|_| !edges.is_empty()) {
        if let Some(tint) = shade(device).filter(|_| edges[k] < edges[k + 1]) {
            root.draw(&Rectangle::new([(edges[k], py.start), (edges[k + 1], py.end)], tint.filled()))?;
        }
    }
    for &x in edges.iter().skip(1).take(plan.segments.len().saturating_sub(1)) {
        root.draw(&PathElement::new(vec![(x, py.start), (x, py.end)], DEVICE_CHANGE))?;
    }
    let last = plan.x.1 - 1;
    for s in &panel.series {
        let color = plan.color(s.dtype);
        let mut kept: Vec<(i64, f64)> =
            s.points.iter().filter(|p| p.accepted).map(|p| (p.iteration, p.tflops)).collect();
        kept.sort_by_key(|p| p.0);
        // A step line: each accepted state holds until the next one.
        let mut path = Vec::with_capacity(2 * kept.len() + 1);
        for (k, &(x, v)) in kept.iter().enumerate() {
            if k > 0 {
                path.push((x, kept[k - 1].1));
            }
            path.push((x, v));
        }
        if let Some(&(_, v)) = kept.last().filter(|p| s.current && p.0 < last) {
            path.push((last, v));
        }
        if path.len() > 1 {
            chart.draw_series(std::iter::once(PathElement::new(path, color.stroke_width(2))))?;
        }
        chart.draw_series(kept.iter().map(|&p| Circle::new(p, 2, color.filled())))?;
        let others = s.points.iter().filter(|p| !p.accepted);
        chart.draw_series(others.map(|p| Circle::new((p.iteration, p.tflops), 3, color.stroke_width(1))))?;
    }
    // The latest accepted TFLOP/s of each precision still measured, top left.
    let mut taken: Vec<[i32; 4]> = vec![];
    let mut x = px.start + 6;
    for s in panel.series.iter().filter(|s| s.current) {
        let Some(now) = s.points.iter().filter(|p| p.accepted).max_by_key(|p| p.iteration) else { continue };
        let text = format!("{} {}", s.dtype, number(now.tflops, decimals)).trim_start().to_string();
        let w = text_width(&text, 10.0);
        if x + w > px.end - 4 {
            break;
        }
        let color = plan.color(s.dtype);
        root.draw(&Text::new(
            text,
            (x, py.start + 8),
            font(10.0).color(&color).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        taken.push([x - 2, py.start, x + w + 2, py.start + 16]);
        x += w + 10;
    }
    // Each device's name at the bottom of its run, where the run is wide enough.
    for (k, &(_, device)) in plan.segments.iter().enumerate().filter(|_| !edges.is_empty()) {
        let text = &plan.devices[device];
        let (x, y) = (edges[k] + 4, py.end - 9);
        let b = [x - 2, y - 7, x + text_width(text, 10.0) + 2, y + 7];
        if b[2] <= edges[k + 1].min(px.end) - 2
            && !taken.iter().any(|t| t[0] < b[2] && b[0] < t[2] && t[1] < b[3] && b[1] < t[3])
        {
            taken.push(b);
            let style = font(10.0).color(&MUTED).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(text.as_str(), (x, y), style))?;
        }
    }
    let mut best: Vec<Point> = panel.series.iter().flat_map(|s| s.points.iter().copied()).collect();
    best.sort_by(|a, b| b.tflops.total_cmp(&a.tflops));
    // The best attempts, each once: an iteration's best precision stands for it.
    let mut iterations = BTreeSet::new();
    best.retain(|p| iterations.insert(p.iteration));
    best.truncate(BEST);
    chart.draw_series(best.iter().map(|p| Circle::new((p.iteration, p.tflops), 6, INK.stroke_width(1))))?;
    // Numbers where they fit: inside the plot, clear of the rings and of each other.
    let centres: Vec<(i32, i32)> = best.iter().map(|p| chart.backend_coord(&(p.iteration, p.tflops))).collect();
    taken.extend(centres.iter().map(|&(x, y)| [x - 7, y - 7, x + 7, y + 7]));
    let style = font(10.0).color(&INK).pos(Pos::new(HPos::Center, VPos::Center));
    for (p, &(cx, cy)) in best.iter().zip(&centres) {
        let text = format!("#{}", p.iteration);
        let (hw, hh) = (text_width(&text, 10.0) / 2 + 2, 6);
        let spot = LABEL_SPOTS.iter().map(|&(dx, dy)| (cx + dx, cy + dy)).find(|&(x, y)| {
            let b = [x - hw, y - hh, x + hw, y + hh];
            b[0] >= px.start
                && b[2] <= px.end
                && b[1] >= py.start
                && b[3] <= py.end
                && !taken.iter().any(|t| t[0] < b[2] && b[0] < t[2] && t[1] < b[3] && b[1] < t[3])
        });
        if let Some((x, y)) = spot {
            taken.push([x - hw, y - hh, x + hw, y + hh]);
            root.draw(&Text::new(text, (x, y), style.clone()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn free_text_cannot_inject_html_or_columns() {
        assert_eq!(cell("<img src=x onerror=alert(1)> a|b & c\nd"), "&lt;img src=x onerror=alert(1)&gt; a/b &amp; c d");
    }

    use super::*;
    use crate::ledger::BenchLine;

    fn entry(i: u32, verdict: &str, tflops: f64, change: Option<f64>) -> Record {
        Record {
            iteration: i,
            timestamp: "t".into(),
            git_rev: "r".into(),
            device: Some("NVIDIA H200".into()),
            hypothesis: format!("step {i}"),
            prediction: Some("faster".into()),
            changed_files: vec![],
            verdict: verdict.into(),
            reason: None,
            build: vec![],
            test: None,
            sanitized: None,
            bench: vec![BenchLine {
                case: "f16-b4h16s2048d64".into(),
                base_us: None,
                cand_us: 100.0,
                tflops,
                change,
                ci_low: None,
                ci_high: None,
                verdict: None,
                speedup_vs_torch: Some(1.2),
                vs_torch_note: None,
                explanation: Vec::new(),
            }],
            patch: None,
            base_rev: None,
            tree: None,
        }
    }

    #[test]
    fn table_markdown_and_chart() {
        let e = vec![
            entry(1, "accepted", 190.0, None),
            entry(2, "reverted", 180.0, Some(0.05)),
            entry(3, "accepted", 250.0, Some(-0.24)),
        ];
        let t = history_table(&e);
        assert!(t.contains("reverted") && t.contains("+5.00%") && t.contains("1.20x"), "{t}");
        let md = markdown(&e);
        assert!(
            md.contains(
                "| 3 | accepted | NVIDIA H200 | step 3 | faster | f16-b4h16s2048d64 100.0 (-24.0%), 1.20x torch |"
            ),
            "{md}"
        );
        let mut absent = entry(4, "accepted", 250.0, None);
        absent.bench[0].speedup_vs_torch = None;
        absent.bench[0].vs_torch_note = Some("PyTorch not timed: no torch".into());
        let t = history_table(&[absent]);
        assert!(t.lines().nth(2).is_some_and(|row| row.trim_end().ends_with("n/a")), "{t}");
        let svg = chart(&e);
        well_formed(&svg);
        // In the series' colour: two accepted dots, the reverted point hollow.
        assert_eq!(svg.matches("fill=\"#1F77B4\" stroke=\"none\"").count(), 1 + 2, "legend and accepted dots");
        assert_eq!(svg.matches("fill=\"none\" stroke=\"#1F77B4\"").count(), 1, "the reverted point is hollow");
        let texts: Vec<String> = text_boxes(&svg).into_iter().map(|t| t.0).collect();
        for label in ["b4h16s2048d64", "#1", "#2", "#3", "f16 250", "f16 accepted", "3 best, #iteration"] {
            assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
        }
    }

    fn rec(i: u32, verdict: &str, bench: &[(&str, f64)]) -> Record {
        let mut r = entry(i, verdict, 0.0, None);
        let line = r.bench.pop().unwrap();
        r.bench = bench.iter().map(|&(case, tflops)| BenchLine { case: case.into(), tflops, ..line.clone() }).collect();
        r
    }

    fn real_ledger() -> Vec<Record> {
        let text = include_str!("../../../perf/ledger.jsonl");
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn well_formed(svg: &str) {
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        let mut reader = quick_xml::Reader::from_str(svg);
        loop {
            match reader.read_event() {
                Ok(quick_xml::events::Event::Eof) => break,
                Ok(_) => {}
                Err(e) => panic!("not XML at {}: {e}\n{svg}", reader.buffer_position()),
            }
        }
    }

    /// Each unrotated `<text>`: its content and a box around it, estimated as
    /// the SVG viewer will lay it out (anchor, baseline shift, 0.55 em a character).
    fn text_boxes(svg: &str) -> Vec<(String, [f64; 4])> {
        let attr = |tag: &str, name: &str| {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            tag[at..].split('"').next().map(str::to_string)
        };
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let (tag, rest) = t.split_once('>')?;
                if tag.contains("transform") {
                    return None;
                }
                let content = rest.split("</text>").next()?.trim().to_string();
                let num = |n| attr(tag, n).and_then(|v| v.parse::<f64>().ok());
                let (x, y, size) = (num("x")?, num("y")?, num("font-size")?);
                let w = content.chars().count() as f64 * size * 0.55;
                let x0 = match attr(tag, "text-anchor").as_deref() {
                    Some("middle") => x - w / 2.0,
                    Some("end") => x - w,
                    _ => x,
                };
                let y0 = match attr(tag, "dy").as_deref() {
                    Some("0.76em") => y,
                    Some("0.5ex") => y - size / 2.0,
                    _ => y - size,
                };
                Some((content, [x0, y0, x0 + w, y0 + size]))
            })
            .collect()
    }

    /// Pairs of texts whose boxes overlap.
    fn overlaps(svg: &str) -> Vec<(String, String)> {
        let boxes = text_boxes(svg);
        let mut out = vec![];
        for (i, (a, p)) in boxes.iter().enumerate() {
            for (b, q) in &boxes[i + 1..] {
                if p[0] < q[2] && q[0] < p[2] && p[1] < q[3] && q[1] < p[3] {
                    out.push((a.clone(), b.clone()));
                }
            }
        }
        out
    }

    fn size(svg: &str) -> (u32, u32) {
        let num = |name: &str| {
            let at = svg.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            svg[at..].split('"').next().unwrap().parse().unwrap()
        };
        (num("width"), num("height"))
    }

    #[test]
    fn chart_marks_each_device_change_and_markdown_names_the_device() {
        let on = |i: u32, device: &str| Record {
            device: Some(device.into()),
            ..entry(i, "accepted", 100.0 + f64::from(i), None)
        };
        let e = vec![
            on(1, "NVIDIA H200"),
            on(2, "NVIDIA H200"),
            on(3, "NVIDIA H100 80GB HBM3"),
            on(4, "NVIDIA H100 80GB HBM3"),
            on(5, "NVIDIA H100 80GB HBM3"),
            on(6, "NVIDIA H200"),
        ];
        let plan = plan(&e);
        assert_eq!(plan.devices, ["H200", "H100 80GB HBM3"]);
        assert_eq!(plan.segments, [(1, 0), (3, 1), (6, 0)]);
        let svg = chart(&e);
        well_formed(&svg);
        assert_eq!(overlaps(&svg), vec![], "texts overlap");
        // A dashed line at each of the two changes, and the legend's.
        let dashed = format!("stroke=\"{}\" stroke-dasharray=\"{DASHES}\"", hex(DEVICE_CHANGE));
        assert_eq!(svg.matches(&dashed).count(), 2 + 1, "{svg}");
        assert_eq!(svg.matches(&format!("stroke=\"{}\"", hex(DEVICE_CHANGE))).count(), 2 + 1, "every one dashed");
        let texts: Vec<String> = text_boxes(&svg).into_iter().map(|t| t.0).collect();
        let count = |label: &str| texts.iter().filter(|t| *t == label).count();
        // In the legend, and at the bottom of the run each names (wide enough here).
        assert_eq!(count("H100 80GB HBM3"), 1 + 1, "{texts:?}");
        assert_eq!(count("H200"), 1 + 2, "{texts:?}");
        assert_eq!(count("device changed"), 1, "{texts:?}");
        // The H100 run shaded, the H200 runs not.
        let shaded = format!("fill=\"{}\"", hex(DEVICE_SHADES[1].unwrap()));
        assert_eq!(svg.matches(&shaded).count(), 1 + 1, "one run and the legend's swatch");
        let md = markdown(&e);
        assert!(md.contains("| 3 | accepted | NVIDIA H100 80GB HBM3 | step 3 |"), "{md}");
        assert!(md.contains("| 6 | accepted | NVIDIA H200 | step 6 |"), "{md}");

        // One device: no marks, its name beside the record count.
        let svg = chart(&e[..2]);
        assert!(!svg.contains("stroke-dasharray") && !svg.contains("device changed"), "{svg}");
        assert!(svg.contains("All measured on H200."), "{svg}");
        // A record that names no device continues the run before it.
        let mut quiet = e.clone();
        quiet[3].device = None;
        assert_eq!(super::plan(&quiet).segments, [(1, 0), (3, 1), (6, 0)]);
    }

    #[test]
    fn cases_split_into_precision_and_shape() {
        assert_eq!(split_case("bf16-b4h16s2048d64-causal"), ("bf16", "b4h16s2048d64-causal"));
        assert_eq!(split_case("f16-b1h1s128d64"), ("f16", "b1h1s128d64"));
        assert_eq!(split_case("b4h16s2048d64-causal"), ("", "b4h16s2048d64-causal"));
        assert_eq!(split_case("f16-"), ("", "f16-"));
        assert_eq!(split_case(""), ("", ""));
        assert_eq!(shorten("b2h8s1024d128-causal", 40), "b2h8s1024d128-causal");
        assert_eq!(shorten("abcdefghij", 5), "ab…ij");
        assert_eq!(shorten("ééééé", 1), "…");
        assert_eq!(
            [number(1.5, 1), number(2.0, 1), number(-0.0, 0), number(-1e-300, 2), number(437.8, 0)],
            ["1.5", "2", "0", "0", "438"]
        );
    }

    #[test]
    fn the_real_ledger_charts_small_multiples_that_fit() {
        let entries = real_ledger();
        let last = entries.iter().rev().find(|e| e.verdict == "accepted" && !e.bench.is_empty()).unwrap();
        let shapes: BTreeSet<&str> = last.bench.iter().map(|b| split_case(&b.case).1).collect();
        let plan = plan(&entries);
        assert_eq!(plan.panels.len(), shapes.len().min(MAX_PANELS));
        assert!(plan.panels.iter().all(|p| shapes.contains(p.shape)));
        assert_eq!(plan.dtypes, ["f16", "bf16"]);
        let devices = plan.devices.len();
        assert!(devices >= 2 && plan.device_changed(), "the ledger has H100 and H200 records");
        assert!(legend(&plan).len() <= 5 + devices + 1, "one shared legend, not one entry per case");

        let svg = chart(&entries);
        well_formed(&svg);
        let (w, h) = size(&svg);
        assert!(w <= 1200 && h <= HEAD + 4 * PANEL.1 + 60, "{w}x{h}");
        let texts = text_boxes(&svg);
        for shape in &shapes {
            assert!(texts.iter().any(|t| t.0 == *shape), "a panel titled {shape}");
        }
        // Iteration ticks (top-anchored, centred, 10px): at most X_TICKS a panel.
        let x_axis = svg.split("<text").filter(|t| t.contains("dy=\"0.76em\"") && t.contains("font-size=\"10\""));
        let x_ticks = x_axis.count();
        assert!((2 * plan.panels.len()..=X_TICKS * plan.panels.len()).contains(&x_ticks), "{x_ticks} x tick labels");
        let best = texts.iter().filter(|t| t.0.starts_with('#')).count();
        assert!(best > plan.panels.len() && best <= BEST * plan.panels.len(), "{best} best attempts numbered");
        assert_eq!(overlaps(&svg), vec![], "texts overlap");
        assert!(svg.contains("shapes measured only in earlier iterations not drawn"));
    }

    #[test]
    fn odd_ledgers_chart_without_panicking() {
        let many: Vec<(String, f64)> = (0..500).map(|k| (format!("f16-b{k}h1s128d64"), k as f64)).collect();
        let many: Vec<(&str, f64)> = many.iter().map(|(c, v)| (c.as_str(), *v)).collect();
        let long = "x".repeat(300);
        let ledgers: Vec<(&str, Vec<Record>)> = vec![
            ("empty", vec![]),
            ("no bench lines", vec![rec(1, "accepted", &[])]),
            ("one record", vec![rec(1, "accepted", &[("f16-b1h1s64d64", 3.0)])]),
            (
                "NaN, inf, negative",
                vec![
                    rec(1, "accepted", &[("f16-a", f64::NAN), ("bf16-a", f64::INFINITY), ("f32-a", -5.0)]),
                    rec(2, "accepted", &[("f16-a", f64::NEG_INFINITY), ("bf16-a", 1e300), ("f32-a", -1e-300)]),
                    rec(3, "rejected", &[("f16-a", -0.0), ("bf16-a", f64::MIN), ("f32-a", f64::MIN_POSITIVE)]),
                ],
            ),
            ("all NaN", vec![rec(1, "accepted", &[("f16-a", f64::NAN)]), rec(2, "rejected", &[("f16-a", f64::NAN)])]),
            (
                "one case",
                (1..=30).map(|i| rec(i, ["accepted", "reverted"][i as usize % 2], &[("c", i.into())])).collect(),
            ),
            ("500 cases", vec![rec(1, "accepted", &many), rec(2, "reverted", &many)]),
            (
                "iterations not increasing",
                vec![
                    rec(5, "accepted", &[("f16-a", 10.0)]),
                    rec(3, "accepted", &[("f16-a", 20.0)]),
                    rec(3, "reverted", &[("f16-a", 30.0)]),
                    rec(9, "accepted", &[("f16-a", 15.0)]),
                    rec(1, "rejected", &[]),
                ],
            ),
            (
                "extreme iterations",
                vec![rec(0, "accepted", &[("f16-a", 1.0)]), rec(u32::MAX, "accepted", &[("f16-a", 2.0)])],
            ),
            ("nothing accepted", vec![rec(1, "rejected", &[("f16-a", 1.0)]), rec(2, "reverted", &[("bf16-a", 2.0)])]),
            (
                "odd names",
                vec![rec(
                    1,
                    "accepted",
                    &[("", 1.0), ("<&\"'>", 2.0), (&long, 3.0), ("f16-ü…", 4.0), ("a-b-c-d", 5.0)],
                )],
            ),
            (
                "a device a record",
                (1..=8)
                    .map(|i| Record {
                        device: Some(format!("NVIDIA Device {i} {}", "x".repeat(40))),
                        ..rec(i, "accepted", &[("f16-a", i.into())])
                    })
                    .collect(),
            ),
            (
                "many precisions",
                vec![rec(
                    1,
                    "accepted",
                    &[("f16-a", 1.0), ("bf16-a", 2.0), ("f32-a", 3.0), ("fp8-a", 4.0), ("e4m3-a", 5.0)],
                )],
            ),
        ];
        for (what, entries) in &ledgers {
            let svg = chart(entries);
            well_formed(&svg);
            assert!(!svg.contains("chart failed"), "{what}: {svg}");
            assert_eq!(overlaps(&svg), vec![], "{what}: texts overlap");
            let (w, h) = size(&svg);
            assert!(w <= 1200 && h <= HEAD + 4 * PANEL.1 + 60, "{what}: {w}x{h}");
            let plan = plan(entries);
            let most = PALETTE.len() + 3 + DEVICE_SHADES.len() + 1;
            assert!(plan.panels.len() <= MAX_PANELS && legend(&plan).len() <= most, "{what}");
        }
        let svg = chart(&[]);
        assert!(svg.contains("No TFLOP/s measured yet"), "{svg}");
        let odd = &ledgers[3].1;
        assert_eq!(plan(odd).unplottable, 5, "NaN, the infinities, 1e300 and f64::MIN");
        assert!(chart(odd).contains("5 measurements NaN, infinite or absurd, left out."));
        let plan500 = plan(&ledgers[6].1);
        assert_eq!((plan500.panels.len(), plan500.over_cap), (MAX_PANELS, 500 - MAX_PANELS));
        assert!(chart(&ledgers[6].1).contains(&format!("{} more of its shapes not drawn", 500 - MAX_PANELS)));
        let shuffled = plan(&ledgers[7].1);
        assert_eq!(shuffled.latest, Some((9, true)));
        assert_eq!(shuffled.x, (0, 10));
        assert_eq!(plan(&ledgers[9].1).latest, Some((2, false)), "the latest measured, when none was accepted");
        let eight = &ledgers[11].1;
        assert_eq!((plan(eight).devices.len(), plan(eight).segments.len()), (8, 8));
        let texts: Vec<String> = text_boxes(&chart(eight)).into_iter().map(|t| t.0).collect();
        assert!(texts.iter().any(|t| t == "other devices"), "devices past the shades share an entry: {texts:?}");
    }
}
