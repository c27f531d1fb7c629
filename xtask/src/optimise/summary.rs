//! `cargo xtask summary`: the iteration history from the ledger as a table, a
//! Markdown summary and an SVG chart of TFLOP/s per case over iterations.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Result;

use crate::optimise::ledger::{self, Record};
use crate::paths::Paths;
use crate::table;
use crate::tools::process::write_file;

pub fn run(paths: &Paths) -> Result<()> {
    let entries = ledger::read(&paths.root.join("perf/ledger.jsonl"))?;
    if entries.is_empty() {
        println!("perf/ledger.jsonl is empty: run `cargo xtask iterate \"hypothesis\"` first");
        return Ok(());
    }
    println!("{}", history_table(&entries));
    let svg = chart(&entries);
    let md = markdown(&entries);
    write_file(&paths.reports().join("summary.svg"), &svg)?;
    write_file(&paths.reports().join("summary.md"), &md)?;
    println!("chart: {}", paths.reports().join("summary.svg").display());
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
    let mut md =
        String::from("| # | verdict | hypothesis | prediction | cases (µs, change) |\n|---|---|---|---|---|\n");
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
            "| {} | {} | {} | {} | {} |",
            e.iteration,
            e.verdict,
            e.hypothesis.replace('|', "/"),
            e.prediction.as_deref().unwrap_or("").replace('|', "/"),
            cases.join("<br>")
        );
    }
    md
}

/// Lines of TFLOP/s per case over iteration numbers; rejected points hollow.
pub fn chart(entries: &[Record]) -> String {
    let (w, h, pad) = (760.0, 360.0, 50.0);
    let mut series: BTreeMap<&str, Vec<(u32, f64, bool)>> = BTreeMap::new();
    for e in entries {
        for b in &e.bench {
            series.entry(&b.case).or_default().push((e.iteration, b.tflops, e.verdict == "accepted"));
        }
    }
    let max_y = series.values().flatten().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let (min_x, max_x) = (
        entries[0].iteration as f64,
        entries.last().map_or(1.0, |e| e.iteration as f64).max(entries[0].iteration as f64 + 1.0),
    );
    let x = |i: u32| pad + (i as f64 - min_x) / (max_x - min_x) * (w - 2.0 * pad);
    let y = |v: f64| h - pad - v / max_y * (h - 2.0 * pad);
    let colors =
        ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
    let (total_h, axis_y, axis_x_end, mid_x, label_y, mid_y) =
        (h + 20.0 * series.len() as f64, h - pad, w - pad, w / 2.0, h - 12.0, h / 2.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{total_h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{pad}\" y1=\"{axis_y}\" x2=\"{axis_x_end}\" y2=\"{axis_y}\" stroke=\"black\"/>\n\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{axis_y}\" stroke=\"black\"/>\n\
         <text x=\"{mid_x}\" y=\"{label_y}\" text-anchor=\"middle\">iteration</text>\n\
         <text x=\"12\" y=\"{mid_y}\" transform=\"rotate(-90 12 {mid_y})\" text-anchor=\"middle\">TFLOP/s</text>\n"
    );
    for t in 0..=4 {
        let v = max_y * t as f64 / 4.0;
        let _ = writeln!(svg, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>", pad - 4.0, y(v) + 4.0);
    }
    for e in entries {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(e.iteration),
            h - pad + 14.0,
            e.iteration
        );
    }
    for (k, (case, pts)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        let path: Vec<String> = pts.iter().map(|(i, v, _)| format!("{:.1},{:.1}", x(*i), y(*v))).collect();
        let _ = writeln!(svg, "<polyline fill=\"none\" stroke=\"{color}\" points=\"{}\"/>", path.join(" "));
        for (i, v, ok) in pts {
            let fill = if *ok { color } else { "white" };
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{fill}\" stroke=\"{color}\"/>",
                x(*i),
                y(*v)
            );
        }
        let ly = h + 14.0 + 20.0 * k as f64;
        let _ = writeln!(
            svg,
            "<rect x=\"{pad}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{color}\"/><text x=\"{}\" y=\"{ly}\">{case}</text>",
            ly - 4.0,
            pad + 18.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimise::ledger::BenchLine;

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
            md.contains("| 3 | accepted | step 3 | faster | f16-b4h16s2048d64 100.0 (-24.0%), 1.20x torch |"),
            "{md}"
        );
        let mut absent = entry(4, "accepted", 250.0, None);
        absent.bench[0].speedup_vs_torch = None;
        absent.bench[0].vs_torch_note = Some("PyTorch not timed: no torch".into());
        let t = history_table(&[absent]);
        assert!(t.lines().nth(2).is_some_and(|row| row.trim_end().ends_with("n/a")), "{t}");
        let svg = chart(&e);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("fill=\"white\" stroke").count(), 1, "the reverted point is hollow");
    }
}
