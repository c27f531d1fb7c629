//! Parser for `ncu --csv --page raw`. Pure. Columns are found by header name;
//! the second row holds units; values carry thousands separators or `n/a`;
//! program output and `==PROF==` lines may surround the CSV. Every row is quoted
//! field by field and as wide as the header, so a row cut short is an error, as
//! is a header with no kernel row after it.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

/// One profiled kernel launch: every column, by header name.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub kernel: String,
    pub values: BTreeMap<String, String>,
}

impl Row {
    /// A numeric column; `None` when absent, empty or `n/a` (an arch without the metric).
    pub fn num(&self, column: &str) -> Option<f64> {
        number(self.values.get(column)?)
    }
}

/// `"1,980,000"` → 1980000; `"n/a"`, `""` → None.
pub fn number(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("n/a") {
        return None;
    }
    t.replace(',', "").parse().ok()
}

pub struct Table {
    pub units: BTreeMap<String, String>,
    pub rows: Vec<Row>,
}

pub fn parse(output: &str) -> Result<Table> {
    // The CSV starts at the header row, which begins with "ID"; rows are quoted.
    let lines: Vec<&str> = output.lines().collect();
    let Some(start) = lines.iter().position(|l| l.starts_with("\"ID\",")) else {
        bail!("no ncu CSV header (\"ID\",…) in the output: did ncu profile any kernel?");
    };
    let rows: Vec<&str> = lines[start..].iter().copied().filter(|l| l.starts_with('"')).collect();
    // Outside a quoted field at the end (quotes balanced, doubled ones included)
    // and the last one closed: the row ends where a field ends.
    let whole = |l: &str| l.len() >= 2 && l.ends_with('"') && l.matches('"').count().is_multiple_of(2);
    if let Some(cut) = rows.iter().position(|l| !whole(l)) {
        bail!("ncu CSV row {} ends inside a field: the output was cut short", cut + 1);
    }
    let csv_text: String = rows.iter().map(|l| format!("{l}\n")).collect();
    let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(csv_text.as_bytes());
    let headers: Vec<String> =
        reader.headers().context("reading the ncu CSV header")?.iter().map(String::from).collect();
    let mut records = reader.records();
    let units_row = records.next().context("ncu CSV has no units row")?.context("reading the units row")?;
    let units = headers.iter().cloned().zip(units_row.iter().map(String::from)).collect();
    let kernel_col = headers.iter().position(|h| h == "Kernel Name").context("no `Kernel Name` column")?;
    let mut rows = Vec::new();
    for rec in records {
        let rec = rec.context("reading an ncu CSV row (cut short?)")?;
        rows.push(Row {
            kernel: rec.get(kernel_col).unwrap_or_default().to_string(),
            values: headers.iter().cloned().zip(rec.iter().map(String::from)).collect(),
        });
    }
    if rows.is_empty() {
        bail!("ncu CSV has a header but no kernel row: the output was cut short");
    }
    Ok(Table { units, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!("{}/tests/data/h200/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn raw_page_with_program_output() {
        let t = parse(&fixture("ncu-csv-page-raw.csv")).unwrap();
        assert_eq!(t.rows.len(), 1);
        let r = &t.rows[0];
        assert_eq!(r.kernel, "axpy");
        assert_eq!(r.num("launch__grid_size"), Some(1024.0));
        assert_eq!(r.num("device__attribute_max_gpu_frequency_khz"), Some(1_980_000.0));
        assert!(r.num("gpu__time_duration.sum").is_some());
        assert_eq!(t.units.get("gpu__time_duration.sum").map(String::as_str), Some("ns"));
        assert_eq!(r.num("no_such_metric"), None);
    }

    #[test]
    fn regex_expanded_names_and_na() {
        let t = parse(&fixture("ncu-csv-page-raw-tensor-regex.csv")).unwrap();
        assert!(!t.rows.is_empty());
        assert!(
            t.rows[0].values.keys().any(|k| k.starts_with("TPC.TriageCompute.") || k.starts_with("sm__pipe_tensor"))
        );
        assert_eq!(number("n/a"), None);
        assert_eq!(number("12,345.5"), Some(12345.5));
    }

    #[test]
    fn no_csv_is_an_error() {
        assert!(parse("==PROF== Disconnected\nno kernels were profiled\n").is_err());
    }

    #[test]
    fn a_csv_cut_short_is_an_error() {
        for name in ["ncu-csv-page-raw.csv", "ncu-csv-page-raw-tensor-regex.csv"] {
            let text = fixture(name);
            let rows = parse(&text).unwrap().rows;
            let header = text.find("\"ID\",").unwrap();
            let last = text.trim_end().len();
            for cut in (header..last).filter(|&c| text.is_char_boundary(c)) {
                // A cut at a row's end may drop later rows, never part of a row.
                if let Ok(t) = parse(&text[..cut]) {
                    assert!(text[cut..].starts_with('\n'), "{name} cut at byte {cut} parsed");
                    assert_eq!(t.rows[..], rows[..t.rows.len()], "{name} cut at byte {cut}");
                    assert!(t.rows.len() < rows.len());
                }
            }
        }
    }
}
