//! Invariants of the code's layout, checked as tests (ARCHITECTURE.md, Invariants).

use std::path::{Path, PathBuf};

fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
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
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|(p, _)| !p.ends_with("process.rs") && !p.ends_with("tidy.rs"))
        .filter(|(_, text)| code(text).contains("Command::new") || code(text).contains("process::Command"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "spawn through process::Cmd: {offenders:?}");
}
