//! nvcc's output → the first error of a failed compilation. Pure: the build
//! captures the output, this only reads it.
//!
//! nvcc runs the host preprocessor (`file.cu:12:3: error: …`, `fatal error`), the
//! CUDA front end (`file.cu(12): error: …`, `catastrophic error`), ptxas
//! (`ptxas error   : …`, `ptxas x.ptx, line 29; error   : …`, `ptxas fatal   : …`)
//! and reports its own failures (`nvcc fatal   : …`). An error line starts at the
//! left margin; the indented lines after it (the source line, a caret, the
//! template instantiation it came from) belong to it.

/// Tools whose own error lines start with their name.
const TOOLS: [&str; 6] = ["nvcc", "ptxas", "cicc", "cudafe++", "nvlink", "fatbinary"];

/// Severities of a located error (`file(12): SEVERITY: …`, `file:12:3: SEVERITY: …`).
const SEVERITIES: [&str; 4] = ["error", "catastrophic error", "fatal error", "internal error"];

/// Indented lines kept after the first error line.
const MAX_CONTEXT: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstError {
    /// The first error line and its indented context, as printed.
    pub lines: Vec<String>,
    /// Error lines in the whole output (the first included).
    pub errors: usize,
}

/// The first error in `output` with its context; `None` when no line is an
/// error (a crash, a truncated capture, or only warnings).
pub fn first_error(output: &str) -> Option<FirstError> {
    let lines: Vec<&str> = output.lines().map(str::trim_end).collect();
    let start = lines.iter().position(|l| is_error(l))?;
    let context = lines[start + 1..]
        .iter()
        .take_while(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty())
        .take(MAX_CONTEXT);
    Some(FirstError {
        lines: std::iter::once(&lines[start]).chain(context).map(|l| l.to_string()).collect(),
        errors: lines.iter().filter(|l| is_error(l)).count(),
    })
}

fn is_error(line: &str) -> bool {
    !line.starts_with(char::is_whitespace) && (tool_error(line) || located_error(line))
}

/// `ptxas error   : …`, `ptxas x.ptx, line 29; error   : …`, `nvcc fatal   : …`.
fn tool_error(line: &str) -> bool {
    let Some((head, _)) = line.split_once(':') else { return false };
    let mut words = head.split_whitespace();
    let Some(tool) = words.next() else { return false };
    TOOLS.contains(&tool) && matches!(words.next_back(), Some("error" | "fatal"))
}

/// `file.cu(12): error: …`, `file.cu(12): error #20-D: …`, `file.cu:12:3: fatal error: …`.
fn located_error(line: &str) -> bool {
    SEVERITIES.iter().any(|severity| {
        let marker = format!(": {severity}");
        line.match_indices(&marker).any(|(at, _)| {
            let after = &line[at + marker.len()..];
            (after.starts_with(':') || after.starts_with(" #")) && is_location(&line[..at])
        })
    })
}

/// `path(12)`, `path:12` or `path:12:3`.
fn is_location(text: &str) -> bool {
    if let Some(inner) = text.strip_suffix(')') {
        return inner.rsplit_once('(').is_some_and(|(path, line)| !path.is_empty() && is_number(line));
    }
    let Some((rest, last)) = text.rsplit_once(':') else { return false };
    if !is_number(last) {
        return false;
    }
    match rest.rsplit_once(':') {
        Some((path, line)) if is_number(line) => !path.is_empty(),
        _ => !rest.is_empty(),
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(text: &str) -> (Vec<String>, usize) {
        let e = first_error(text).expect("an error");
        (e.lines, e.errors)
    }

    #[test]
    fn front_end_error_with_its_source_line_and_caret() {
        let (lines, errors) = first(include_str!("../../tests/data/build/nvcc-bad-define-sm89.txt"));
        assert_eq!(
            lines,
            [
                "/work/main/kernels/flash_fwd.cuh(338): error: expected an expression",
                "        for (int i = 0; i < (; ++i) chain = fmaf(chain, 0.999f, 1e-7f);",
                "                             ^",
            ]
        );
        assert_eq!(errors, 2);
    }

    /// 258 lines of output: the last 20 hold neither the first error nor its cause.
    #[test]
    fn the_first_of_thirty_errors_not_the_last() {
        let (lines, errors) = first(include_str!("../../tests/data/build/nvcc-undefined-identifier-sm89.txt"));
        assert_eq!(lines[0], "/work/main/kernels/flash_fwd.cuh(61): error: identifier \"x\" is undefined");
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(errors, 30);
    }

    #[test]
    fn ptxas_errors() {
        let (lines, errors) = first(include_str!("../../tests/data/build/ptxas-too-much-smem-sm89.txt"));
        assert_eq!(
            lines,
            ["ptxas error   : Entry function 'too_much_smem' uses too much shared data (0x13880 bytes, 0xc000 max)"]
        );
        assert_eq!(errors, 1);
        let (lines, errors) = first(include_str!("../../tests/data/build/ptxas-bad-asm-sm89.txt"));
        assert!(lines[0].ends_with("line 29; error   : Unknown modifier '.op'"), "{lines:?}");
        assert_eq!((lines.len(), errors), (1, 3));
    }

    #[test]
    fn host_preprocessor_and_nvcc_errors() {
        let (lines, errors) = first(include_str!("../../tests/data/build/host-missing-include-sm89.txt"));
        assert_eq!(lines[0], "inc.cu:1:10: fatal error: missing.cuh: No such file or directory");
        assert_eq!((lines.len(), errors), (3, 1));
        let (lines, errors) = first(include_str!("../../tests/data/build/nvcc-unsupported-arch.txt"));
        assert_eq!(lines, ["nvcc fatal   : Unsupported gpu architecture 'compute_12'"]);
        assert_eq!(errors, 1);
    }

    #[test]
    fn warnings_info_and_truncated_output_hold_no_error() {
        assert_eq!(first_error(include_str!("../../tests/data/build/nvcc-warnings-only-sm89.txt")), None);
        assert_eq!(first_error(""), None);
        assert_eq!(first_error("/work/main/kernels/flash_fwd.cuh(338): err"), None);
        for line in [
            "x.cu(3): warning #177-D: a note: error: not this",
            "x.cu(): error: no line number",
            "(12): error: no path",
            "x.cu:abc: error: not a line",
            "  x.cu(3): error: indented context, not an error line",
            "ptxas info    : error in the message only",
            "error: no location",
            "ptxas",
            ":",
        ] {
            assert_eq!(first_error(line), None, "{line}");
        }
    }

    #[test]
    fn numbered_severities_and_a_capped_context() {
        let text = "k.cu(7): error #20-D: identifier \"y\" is undefined\n  a\n  b\n  c\n  d\n  e\n\nk.cu:9: error: x\n";
        let (lines, errors) = first(text);
        assert_eq!(lines.len(), 1 + MAX_CONTEXT);
        assert_eq!(errors, 2);
        assert_eq!(first("nvcc error   : 'cicc' died due to signal 9 (Kill signal)").1, 1);
    }
}
