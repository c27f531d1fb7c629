//! Invariants of the code's layout, checked as tests (ARCHITECTURE.md, Invariants).
//! Each reads the workspace's sources as text.

use std::path::{Path, PathBuf};

/// Files with these extensions under `dir` (relative to the workspace root), with their text.
fn files_under(dir: &str, exts: &[&str]) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, exts, out);
            } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)) {
                out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir), exts, &mut out);
    out
}

/// Code only, without its `#[cfg(test)]` module (tests may do what code may not).
fn code(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text)
}

#[test]
fn main_parses_and_dispatches_only() {
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).unwrap();
    let items: Vec<&str> = main
        .lines()
        .filter(|l| ["pub ", "struct ", "enum ", "fn ", "impl ", "const ", "static "].iter().any(|k| l.starts_with(k)))
        .collect();
    assert_eq!(items, ["fn main() -> ExitCode {", "fn dispatch(task: Task) -> anyhow::Result<()> {"]);
}

#[test]
fn error_kinds_import_nothing_from_the_crate() {
    let errors = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/errors.rs")).unwrap();
    assert!(!errors.contains("crate::"), "errors.rs must stand alone");
}

#[test]
fn only_the_process_layer_spawns_processes() {
    let offenders: Vec<String> = files_under("xtask/src", &["rs"])
        .into_iter()
        .filter(|(p, _)| !p.ends_with("tools/process.rs") && !p.ends_with("tidy.rs"))
        .filter(|(_, text)| code(text).contains("Command::new") || code(text).contains("process::Command"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "spawn through process::Cmd: {offenders:?}");
}

#[test]
fn parsers_do_no_io() {
    let parsers = files_under("xtask/src/parse", &["rs"]);
    assert!(parsers.len() >= 7, "the parsers live in xtask/src/parse");
    for (path, text) in parsers.iter().filter(|(p, _)| !p.ends_with("fuzz.rs")) {
        for io in ["std::fs::", "File::", "Cmd::", "std::env::", "std::io::stdin", "crate::tools"] {
            assert!(!code(text).contains(io), "{} does IO ({io}): parsers take text and return values", path.display());
        }
    }
}

#[test]
fn imports_flow_one_way() {
    // Parsers import only parsers and the shared schema; the tools layer imports no
    // stage; no module imports from `main`.
    for (path, text) in files_under("xtask/src", &["rs"]) {
        let imports: Vec<&str> = code(&text).lines().filter(|l| l.contains("crate::")).collect();
        let rel = path.to_string_lossy().replace('\\', "/");
        let forbidden: &[&str] = if rel.ends_with("parse/fuzz.rs") {
            &[] // a test module: it may read the captured fixtures
        } else if rel.contains("/src/parse/") {
            &["crate::tools", "crate::compile", "crate::verify", "crate::measure", "crate::optimise", "crate::ci"]
        } else if rel.contains("/src/tools/") {
            &["crate::compile", "crate::verify", "crate::measure", "crate::optimise", "crate::ci", "crate::check"]
        } else {
            &["crate::main", "crate::flags"]
        };
        for line in imports {
            if !rel.ends_with("main.rs") && !rel.ends_with("tidy.rs") {
                assert!(
                    !forbidden.iter().any(|f| line.contains(f)),
                    "{rel}: `{}` runs against the layering",
                    line.trim()
                );
            }
        }
    }
}

#[test]
fn kernel_ffi_never_spawns_and_every_unsafe_says_why() {
    let ffi = files_under("kernel-ffi/src", &["rs"]);
    for (path, text) in &ffi {
        assert!(!text.contains("Command::new") && !text.contains("process::Command"), "{} spawns", path.display());
    }
    let xtask = files_under("xtask/src", &["rs"]).into_iter().filter(|(p, _)| !p.ends_with("tidy.rs"));
    for (path, text) in ffi.into_iter().chain(xtask) {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "unsafe") {
                let before = lines[i.saturating_sub(8)..=i].join("\n");
                assert!(before.contains("SAFETY:"), "{}:{}: `unsafe` without a SAFETY comment", path.display(), i + 1);
            }
        }
    }
}

#[test]
fn forward_checks_every_rule_before_it_allocates_or_launches() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-ffi/src/attention/mod.rs"))
            .unwrap();
    let body = text.split("pub fn forward(").nth(1).expect("Attention::forward in attention/mod.rs");
    let at = |what: &str| body.find(what).unwrap_or_else(|| panic!("forward no longer calls {what}"));
    let first_cuda = at("self.alloc_partials(").min(at("self.launch_"));
    for check in ["validate::forward(", "validate::aligned(", "Grid::new("] {
        assert!(at(check) < first_cuda, "forward calls {check} after its first allocation or launch");
    }
}

#[test]
fn no_kernel_or_kernel_ffi_comment_cites_a_ledger_iteration() {
    let mut found = Vec::new();
    for (path, text) in
        files_under("kernels", &["cu", "cuh", "h"]).into_iter().chain(files_under("kernel-ffi/src", &["rs"]))
    {
        for (i, line) in text.lines().enumerate() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let cites = words.windows(2).any(|w| {
                w[0].trim_end_matches('s') == "iteration" && w[1].chars().next().is_some_and(|c| c.is_ascii_digit())
            });
            if cites {
                found.push(format!("{}:{}", path.display(), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "history belongs in perf/ (ledger, DECISIONS.md): {found:?}");
}
