//! Which kernel headers a unit can read: its `#include` closure within the
//! source folder, so that a unit's cache key covers those headers and no
//! others. Pure: the headers come in as (path relative to the folder, bytes).
//!
//! Conservative by construction: every `#include` line counts, whatever `#if`
//! surrounds it (in a block comment too), and a quoted name resolves both beside
//! its includer and at the folder's root (nvcc's `-I`). Where a line cannot be
//! read as `#include "…"` or `#include <…>` (a macro, a line continuation),
//! or a quoted name matches no header, the closure is unknown and the unit
//! takes every header.

use std::collections::{BTreeMap, BTreeSet};

/// The unit's headers: `Some(paths)` (relative to the source folder, `/`
/// separated), or `None` where some include cannot be followed.
pub fn closure(unit: &[u8], headers: &BTreeMap<String, Vec<u8>>) -> Option<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<(String, Vec<Include>)> = vec![(String::new(), includes(unit)?)];
    while let Some((dir, found)) = todo.pop() {
        for inc in found {
            let beside = if dir.is_empty() { inc.name.clone() } else { format!("{dir}/{}", inc.name) };
            let candidates: Vec<String> =
                [beside, inc.name.clone()].into_iter().filter(|c| headers.contains_key(c)).collect();
            if candidates.is_empty() && inc.quoted {
                return None;
            }
            for c in candidates {
                if seen.insert(c.clone()) {
                    let parent = c.rsplit_once('/').map_or(String::new(), |(d, _)| d.to_string());
                    todo.push((parent, includes(&headers[&c])?));
                }
            }
        }
    }
    Some(seen)
}

/// One `#include` line's target: `"name"` (quoted) or `<name>`.
#[derive(Debug, PartialEq, Eq)]
struct Include {
    name: String,
    quoted: bool,
}

/// Every `#include` in `text`, or `None` where one is not a plain quoted or
/// angle-bracket name.
fn includes(text: &[u8]) -> Option<Vec<Include>> {
    let text = String::from_utf8_lossy(text);
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix('#') else { continue };
        let Some(target) = rest.trim_start().strip_prefix("include") else { continue };
        let target = target.trim();
        let (close, quoted) = match target.chars().next() {
            Some('"') => ('"', true),
            Some('<') => ('>', false),
            _ => return None,
        };
        let name = target[1..].split_once(close)?.0;
        if name.is_empty() {
            return None;
        }
        out.push(Include { name: name.to_string(), quoted });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(files: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        files.iter().map(|(n, t)| (n.to_string(), t.as_bytes().to_vec())).collect()
    }

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn the_closure_follows_quoted_includes_through_headers() {
        let h = headers(&[
            ("a.cuh", "#pragma once\n#include \"common.cuh\"\n"),
            ("b.cuh", "#include \"common.cuh\"\n"),
            ("common.cuh", "#include <cuda_fp16.h>\n#  include \"a.cuh\"  // a cycle\n"),
            ("unused.cuh", ""),
        ]);
        assert_eq!(closure(b"#include \"a.cuh\"\nint x;\n", &h), set(&["a.cuh", "common.cuh"]));
        assert_eq!(closure(b"#include \"b.cuh\"\n", &h), set(&["a.cuh", "b.cuh", "common.cuh"]));
        assert_eq!(closure(b"int x;\n", &h), set(&[]));
    }

    #[test]
    fn every_include_counts_whatever_guards_it() {
        let h = headers(&[("a.cuh", ""), ("b.cuh", "")]);
        let unit = b"#ifdef NEVER\n#include \"a.cuh\"\n#endif\n/*\n#include \"b.cuh\"\n*/\n";
        assert_eq!(closure(unit, &h), set(&["a.cuh", "b.cuh"]));
        // Not a directive: a line comment.
        assert_eq!(closure(b"// #include \"b.cuh\"\n", &h), set(&[]));
    }

    #[test]
    fn names_resolve_beside_their_includer_and_at_the_root() {
        let h = headers(&[("sub/x.cuh", "#include \"y.cuh\"\n"), ("sub/y.cuh", ""), ("y.cuh", "")]);
        assert_eq!(closure(b"#include \"sub/x.cuh\"\n", &h), set(&["sub/x.cuh", "sub/y.cuh", "y.cuh"]));
        // An angle-bracket name takes a header of the folder where one matches (nvcc's -I).
        assert_eq!(closure(b"#include <y.cuh>\n#include <cuda.h>\n", &h), set(&["y.cuh"]));
    }

    #[test]
    fn an_include_that_cannot_be_followed_leaves_the_closure_unknown() {
        let h = headers(&[("a.cuh", ""), ("m.cuh", "#include HEADER\n")]);
        for unit in [
            &b"#include HEADER\n"[..],
            b"#include \"missing.cuh\"\n",
            b"#include \\\n\"a.cuh\"\n",
            b"#include \"\"\n",
            b"#include \"a.cuh\n",
            b"#include \"m.cuh\"\n",
        ] {
            assert_eq!(closure(unit, &h), None, "{}", String::from_utf8_lossy(unit));
        }
    }
}
