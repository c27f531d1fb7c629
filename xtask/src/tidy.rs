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
    assert_eq!(items, ["fn main() -> ExitCode {"]);
    assert!(main.lines().count() <= 80, "main.rs is {} lines; commands belong in commands/", main.lines().count());
    // One line per command: `Command::X(c) => c.run(&cx),`.
    let commands = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands/mod.rs")).unwrap();
    let variants = commands.split("pub enum Command {").nth(1).unwrap().split("\n}").next().unwrap();
    let names = variants.lines().map(str::trim).filter(|l| !l.starts_with("//") && !l.starts_with('#'));
    for v in names.filter_map(|l| l.split_once('(')).map(|(name, _)| name) {
        assert!(main.contains(&format!("Command::{v}(c) => c.run(&cx),")), "main does not dispatch {v} in one line");
    }
}

#[test]
fn no_process_global_environment_and_every_binary_variable_named_once() {
    for (path, text) in files_under("xtask/src", &["rs"]).into_iter().filter(|(p, _)| !p.ends_with("tidy.rs")) {
        let code = code(&text);
        assert!(!code.contains("set_var(") && !code.contains("remove_var("), "{}: process-global env", path.display());
        for name in ["\"FA_DEVICE\"", "\"FA_KERNEL_DIR\""] {
            assert!(!code.contains(name), "{}: {name} spelled out; use fa_schema::env", path.display());
        }
    }
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

/// The modules each layer may not import, lowest layer first: data and errors,
/// the process layer and its tools, then the stages, then the commands.
const LAYERS: &[(&str, &[&str])] = &[
    ("parse/", &["tools", "compile", "verify", "measure", "optimise", "ci", "commands", "ledger", "run", "report"]),
    ("errors.rs", &["tools", "compile", "verify", "measure", "optimise", "ci", "commands", "ledger", "run", "report"]),
    ("report.rs", &["tools", "compile", "verify", "measure", "optimise", "ci", "commands", "ledger", "run"]),
    ("run.rs", &["tools", "compile", "verify", "measure", "optimise", "ci", "commands", "ledger"]),
    ("tools/", &["compile", "verify", "measure", "optimise", "ci", "commands", "ledger"]),
    ("ledger.rs", &["compile", "verify", "measure", "optimise", "ci", "commands"]),
    ("compile/", &["verify", "measure", "optimise", "ci", "commands"]),
    ("verify/", &["measure", "optimise", "ci", "commands"]),
    ("measure/", &["optimise", "ci", "commands"]),
    ("optimise/", &["ci", "commands"]),
    ("wheel.rs", &["verify", "measure", "optimise", "ci", "commands"]),
    ("ci.rs", &["commands"]),
    ("ci/", &["commands"]),
];

/// `…/xtask/src/a/b.rs` → `a/b.rs`.
fn rel_to_src(path: &Path) -> String {
    let p = path.to_string_lossy().replace('\\', "/");
    p.split_once("xtask/src/").map_or(p.clone(), |(_, r)| r.to_string())
}

/// The crate modules a file's code names (`crate::a::b`, `crate::a::{b, c}`),
/// as paths relative to src/ without extension: `a/b`.
fn crate_imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code(text).match_indices("crate::") {
        let rest = &code(text)[i + "crate::".len()..];
        let end = rest
            .find(|c: char| {
                !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{' || c == '}' || c == ',' || c.is_whitespace())
            })
            .unwrap_or(rest.len());
        let path = &rest[..end];
        match path.split_once("::{") {
            Some((head, group)) => {
                for item in group.split('}').next().unwrap_or("").split(',') {
                    let item = item.trim().split("::").next().unwrap_or("");
                    out.push(if item == "self" || item.is_empty() {
                        head.replace("::", "/")
                    } else {
                        format!("{}/{item}", head.replace("::", "/"))
                    });
                }
            }
            None => out.push(path.split([' ', ',', '}', '\n']).next().unwrap_or("").replace("::", "/")),
        }
    }
    out
}

#[test]
fn imports_flow_one_way() {
    for (path, text) in files_under("xtask/src", &["rs"]) {
        let rel = rel_to_src(&path);
        if rel == "main.rs" || rel == "tidy.rs" || rel.ends_with("parse/fuzz.rs") || rel.ends_with("/tests.rs") {
            continue; // the root, the tidy tests, and test modules that read fixtures
        }
        let imports = crate_imports(&text);
        for import in &imports {
            let top = import.split('/').next().unwrap_or("");
            assert!(
                !["main", "schema", "manifest", "check"].contains(&top),
                "{rel}: `crate::{import}`: import fa_schema directly; nothing imports main"
            );
            if !rel.starts_with("commands/") {
                assert_ne!(top, "commands", "{rel}: a stage imports a command");
            }
            if let Some((_, forbidden)) = LAYERS.iter().find(|(layer, _)| rel.starts_with(layer)) {
                assert!(!forbidden.contains(&top), "{rel}: `crate::{import}` runs against the layering");
            }
        }
    }
}

#[test]
fn imports_are_read_in_every_form() {
    let text = "use crate::a::b;\nuse crate::c::{self, d::E,\n    f};\nlet x = crate::g::h(1);\n";
    assert_eq!(crate_imports(text), ["a/b", "c", "c/d", "c/f", "g/h"]);
}

#[test]
fn no_two_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let module = |rel: &str| rel.trim_end_matches(".rs").trim_end_matches("/mod").to_string();
    let mut edges = std::collections::BTreeSet::new();
    for (path, text) in files_under("xtask/src", &["rs"]) {
        let rel = rel_to_src(&path);
        if rel == "tidy.rs" || rel.ends_with("/tests.rs") {
            continue;
        }
        let from = module(&rel);
        for to in crate_imports(&text) {
            // `a/b/item` names module a/b where a/b is a file; keep the longest module that exists.
            let mut to = to;
            while !to.is_empty() && !src.join(format!("{to}.rs")).is_file() && !src.join(&to).join("mod.rs").is_file() {
                to = to.rsplit_once('/').map_or(String::new(), |(h, _)| h.to_string());
            }
            if !to.is_empty() && to != from && !from.starts_with(&format!("{to}/")) {
                edges.insert((from.clone(), to));
            }
        }
    }
    let cycles: Vec<_> = edges.iter().filter(|(a, b)| edges.contains(&(b.clone(), a.clone()))).collect();
    assert!(cycles.is_empty(), "modules that import each other: {cycles:?}");
}

#[test]
fn kernel_ffi_never_spawns_and_every_unsafe_says_why() {
    let ffi = files_under("kernel-ffi/src", &["rs"]);
    for (path, text) in &ffi {
        assert!(!text.contains("Command::new") && !text.contains("process::Command"), "{} spawns", path.display());
    }
    let xtask = files_under("xtask/src", &["rs"]).into_iter().filter(|(p, _)| !p.ends_with("tidy.rs"));
    for (path, text) in ffi.into_iter().chain(xtask).chain(files_under("python/src", &["rs"])) {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "unsafe") {
                // An `unsafe fn` states its contract in its docs' `# Safety` section.
                let docs = lines[..i].iter().rev().take_while(|l| l.trim_start().starts_with("///"));
                let documented = code.contains("unsafe fn") && docs.into_iter().any(|l| l.contains("# Safety"));
                let before = lines[i.saturating_sub(8)..=i].join("\n");
                assert!(
                    documented || before.contains("SAFETY:"),
                    "{}:{}: `unsafe` without a SAFETY comment (or, for an unsafe fn, a `# Safety` doc section)",
                    path.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn forward_checks_every_rule_before_it_allocates_or_launches() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-ffi/src/attention/mod.rs"))
            .unwrap();
    let body =
        text.split("pub fn forward_descaled_on(").nth(1).expect("Attention::forward_descaled_on in attention/mod.rs");
    let at = |what: &str| body.find(what).unwrap_or_else(|| panic!("forward no longer calls {what}"));
    let first_cuda = at("self.alloc_partials(").min(at("self.launch_"));
    for check in ["validate::forward(", "validate::descales(", "validate::aligned(", "Grid::new("] {
        assert!(at(check) < first_cuda, "forward calls {check} after its first allocation or launch");
    }
    // e4m3 inputs on the Hopper kernel: its entry and the pointers checked before any dequantisation.
    let body = text.split("fn forward_dequantised(").nth(1).expect("forward_dequantised in attention/mod.rs");
    let at = |what: &str| body.find(what).unwrap_or_else(|| panic!("forward_dequantised no longer calls {what}"));
    for check in ["self.choose_entry(", "Grid::new(", "validate::aligned("] {
        assert!(at(check) < at("self.dequantise("), "forward_dequantised calls {check} after it allocates");
    }
}

#[test]
fn forward_varlen_checks_every_rule_before_it_allocates_or_launches() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-ffi/src/attention/varlen.rs"))
            .unwrap();
    let body = text.split("pub fn forward_varlen_on(").nth(1).expect("forward_varlen_on in attention/varlen.rs");
    let at = |what: &str| body.find(what).unwrap_or_else(|| panic!("forward_varlen no longer calls {what}"));
    let first_cuda = at("self.alloc_partials(").min(at("launch_builder("));
    for check in ["sequences::validate(", "validate::aligned(", "self.check_indices("] {
        assert!(at(check) < first_cuda, "forward_varlen calls {check} after its first allocation or launch");
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
