//! What a reviewer sees of the CPU job on GitHub: budget breaches and the
//! resource table in the job summary (`$GITHUB_STEP_SUMMARY`), and each breach as
//! an `::error` annotation on the line of kernels/manifest.json that holds the
//! entry's budget. Pure functions of the build report and the manifest's text.

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{Context, Result, bail};

use crate::compile::BuildPayload;
use fa_schema::manifest::Manifest;

/// One workflow command, `::error file=…,line=…,title=…::message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotation {
    pub file: String,
    pub line: usize,
    pub title: String,
    pub message: String,
}

impl std::fmt::Display for Annotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "::error file={},line={},title={}::{}",
            escape_property(&self.file),
            self.line,
            escape_property(&self.title),
            escape_data(&self.message)
        )
    }
}

/// GitHub's escaping for a workflow command's message.
fn escape_data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// GitHub's escaping for a workflow command's property values.
fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// Where things are in the manifest's text: the line of each entry's `"entry"`
/// key, and of the top-level keys.
#[derive(Debug, Default)]
pub struct ManifestLines {
    entries: HashMap<String, usize>,
    keys: HashMap<String, usize>,
}

impl ManifestLines {
    /// Reads the JSON text's string tokens with their lines. The text must be
    /// valid JSON (the manifest parser has read it already; this is for lines only).
    pub fn parse(text: &str) -> Result<ManifestLines> {
        serde_json::from_str::<serde_json::Value>(text).context("the manifest is not valid JSON")?;
        // (value, line, whether a ':' follows: a key)
        let mut tokens: Vec<(String, usize, bool)> = Vec::new();
        let bytes = text.as_bytes();
        let (mut i, mut line) = (0, 1);
        while i < bytes.len() {
            match bytes[i] {
                b'\n' => line += 1,
                b'"' => {
                    let start = i;
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'"' {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    let raw = text.get(start..=i).context("a string runs past the end of the manifest")?;
                    let value: String = serde_json::from_str(raw).with_context(|| format!("reading {raw}"))?;
                    let rest = text[i + 1..].trim_start();
                    tokens.push((value, line, rest.starts_with(':')));
                }
                _ => {}
            }
            i += 1;
        }
        let mut out = ManifestLines::default();
        for pair in tokens.windows(2) {
            let [(key, line, true), (value, _, false)] = pair else { continue };
            if key == "entry" {
                out.entries.entry(value.clone()).or_insert(*line);
            }
        }
        for (key, line, is_key) in tokens {
            if is_key {
                out.keys.entry(key).or_insert(line);
            }
        }
        if out.entries.is_empty() {
            bail!("no \"entry\" keys in the manifest");
        }
        Ok(out)
    }
}

/// One annotation per budget breach: on the entry's `"entry"` line where the
/// manifest has it; an arch it lacks on `"archs"`; an entry it lacks on `"sources"`.
pub fn annotations(payload: &BuildPayload, manifest_file: &str, lines: &ManifestLines) -> Vec<Annotation> {
    payload
        .breaches
        .iter()
        .map(|b| {
            let line = lines
                .entries
                .get(&b.kernel)
                .or_else(|| lines.keys.get(if b.what == "arch not in manifest" { "archs" } else { "sources" }))
                .copied()
                .unwrap_or(1);
            Annotation {
                file: manifest_file.to_string(),
                line,
                title: format!("budget breach: {}", b.what),
                message: format!(
                    "{} on {}: {} is {}, budget {}. {}",
                    b.kernel, b.arch, b.what, b.value, b.budget, b.hint
                ),
            }
        })
        .collect()
}

/// The job summary: breaches first, then the resource table of every entry.
pub fn summary(payload: &BuildPayload, manifest: &Manifest) -> String {
    let mut md = format!("## Kernel resources (nvcc {})\n\n", payload.nvcc_version);
    if payload.breaches.is_empty() {
        md.push_str("No budget breaches.\n\n");
    } else {
        let _ = writeln!(md, "### {} budget breach(es)\n", payload.breaches.len());
        let rows: Vec<Vec<String>> = payload
            .breaches
            .iter()
            .map(|b| {
                vec![
                    format!("`{}`", b.kernel),
                    b.arch.clone(),
                    b.what.clone(),
                    b.value.to_string(),
                    b.budget.to_string(),
                    b.hint.clone(),
                ]
            })
            .collect();
        md.push_str(&markdown_table(&["kernel", "arch", "breach", "value", "budget", "fix"], &rows));
        md.push('\n');
    }
    let rows: Vec<Vec<String>> = payload
        .kernels
        .iter()
        .map(|k| {
            let budget = manifest.kernel(&k.name);
            let ops = payload.sass.iter().find(|s| s.kernel == k.name && s.arch == k.arch).map(|s| &s.opcodes);
            let count = |op: &str| ops.and_then(|o| o.get(op)).copied().unwrap_or(0);
            vec![
                format!("`{}`", k.name),
                k.arch.clone(),
                budget.map_or_else(|| k.registers.to_string(), |b| format!("{}/{}", k.registers, b.max_registers)),
                k.smem_static.to_string(),
                budget.map_or(0, |b| b.dynamic_smem).to_string(),
                k.stack_frame.to_string(),
                format!("{}/{}", k.spill_stores, k.spill_loads),
                format!("{}/{}", count("HMMA"), count("HGMMA")),
                (count("LDL") + count("STL")).to_string(),
            ]
        })
        .collect();
    let _ = writeln!(md, "<details><summary>{} entry × arch rows</summary>\n", rows.len());
    md.push_str(&markdown_table(
        &["kernel", "arch", "regs/budget", "smem", "dyn smem", "stack", "spill st/ld", "HMMA/HGMMA", "LDL+STL"],
        &rows,
    ));
    md.push_str("\n</details>\n");
    md
}

fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), " --- |".repeat(header.len()));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Envelope;

    fn fixture() -> (BuildPayload, Manifest, ManifestLines) {
        let report: Envelope<BuildPayload> =
            serde_json::from_str(include_str!("../../tests/data/ci/build-breaches.json")).unwrap();
        let text = include_str!("../../tests/data/ci/manifest.json");
        (report.payload, Manifest::parse(text).unwrap(), ManifestLines::parse(text).unwrap())
    }

    /// build-breaches.json is a build report with a register and a spill breach of
    /// flash_fwd_f16_d64_kg2 on sm_89 and an entry the manifest lacks.
    #[test]
    fn breaches_annotate_their_manifest_lines() {
        let (payload, _, lines) = fixture();
        let got: Vec<String> =
            annotations(&payload, "kernels/manifest.json", &lines).iter().map(|a| a.to_string()).collect();
        assert_eq!(
            got,
            [
                "::error file=kernels/manifest.json,line=63,title=budget breach%3A spill bytes::\
                 flash_fwd_f16_d64_kg2 on sm_89: spill bytes is 32, budget 0. cut live registers \
                 (smaller tiles, fewer accumulators) or set allow_spills",
                "::error file=kernels/manifest.json,line=63,title=budget breach%3A registers/thread::\
                 flash_fwd_f16_d64_kg2 on sm_89: registers/thread is 192, budget 184. lower register \
                 pressure or raise max_registers (check occupancy first)",
                "::error file=kernels/manifest.json,line=17,title=budget breach%3A entry without a budget::\
                 flash_fwd_planted on sm_90a: entry without a budget is 0, budget 0. add it to \
                 kernels/manifest.json",
            ]
        );
        // Line 63 of the fixture is that entry's "entry" key.
        let line = include_str!("../../tests/data/ci/manifest.json").lines().nth(62).unwrap();
        assert_eq!(line.trim(), "\"entry\": \"flash_fwd_f16_d64_kg2\",");
    }

    #[test]
    fn summary_lists_breaches_and_every_row() {
        let (payload, manifest, _) = fixture();
        let md = summary(&payload, &manifest);
        assert!(md.contains("### 3 budget breach(es)"), "{md}");
        assert!(md.contains("| `flash_fwd_f16_d64_kg2` | sm_89 | registers/thread | 192 | 184 |"), "{md}");
        assert!(md.contains("| `flash_fwd_f16_d64_kg2` | sm_89 | 192/184 |"), "{md}");
        assert_eq!(md.lines().filter(|l| l.starts_with("| `flash_fwd_f16_d64")).count(), 2 + payload.kernels.len());
        assert!(md.contains("<summary>6 entry × arch rows</summary>"), "{md}");
        let clean = BuildPayload { breaches: Vec::new(), ..payload };
        assert!(summary(&clean, &manifest).contains("No budget breaches."));
    }

    #[test]
    fn messages_and_properties_are_escaped() {
        let a = Annotation { file: "a,b:c.json".into(), line: 2, title: "t".into(), message: "100%\nnext".into() };
        assert_eq!(a.to_string(), "::error file=a%2Cb%3Ac.json,line=2,title=t::100%25%0Anext");
    }

    #[test]
    fn lines_need_valid_json_with_entries() {
        assert!(ManifestLines::parse("{\"entry\": \"x\"").is_err());
        assert!(ManifestLines::parse("{\"sources\": []}").is_err());
        let lines = ManifestLines::parse("{\n\"sources\": [{\"kernels\": [\n{\"entry\": \"a\\\"b\"}]}]}").unwrap();
        assert_eq!(lines.entries.get("a\"b"), Some(&3));
        assert_eq!(lines.keys.get("sources"), Some(&2));
    }
}
