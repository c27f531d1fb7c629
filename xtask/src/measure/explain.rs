//! Why the gate called a shape a regression or an improvement: what differs
//! between the base's launch and the candidate's. The entry and plan each side
//! ran come from its fa-bench; that entry's ptxas resources and SASS opcode
//! counts from the side's kernel directory, where the build left each unit's
//! ptxas log (`<unit>.<arch>.log`) and cuobjdump listing (`<unit>.<arch>.sass`).
//! [`explain`] is pure; [`Facts::load`] reads. Nsight Compute's side, both
//! sides profiled on the shape in the same run, is compared by the pure
//! [`profile_lines`]; the gate runs ncu.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::measure::profile::Launch as Profiled;
use crate::parse::ptxas::{self, KernelResources};
use crate::parse::sass;
use fa_schema::manifest::Manifest;
use fa_schema::schema::EntryRecord;

/// A side's split plan for a shape, as its fa-bench reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub num_splits: u32,
    pub ctas: u64,
}

/// What one side ran for a shape, and its build's facts about that entry.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    pub entry: &'a EntryRecord,
    pub plan: Plan,
    pub facts: &'a Facts,
}

/// One side's build facts about the entry it launched, or why they are missing.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub resources: Result<KernelResources, String>,
    /// SASS opcode (before the first `.`) → count in the entry's function.
    pub opcodes: Result<BTreeMap<String, u32>, String>,
    /// The same counts over its key-tile loop (`sass::main_loop`).
    pub main_loop: Result<BTreeMap<String, u32>, String>,
}

/// ptxas logs are a few KB; a unit's SASS listing about 10 MB.
const MAX_LOG: u64 = 16 << 20;
const MAX_SASS: u64 = 128 << 20;

impl Facts {
    /// The facts about `kernel` as built in `kernels` for a GPU of
    /// `compute_capability` (`9.0`): the arch its manifest picks there, and the
    /// unit that defines the entry.
    pub fn load(kernels: &Path, compute_capability: &str, kernel: &str) -> Facts {
        match unit_files(kernels, compute_capability, kernel) {
            Err(e) => {
                let why = format!("{e:#}");
                Facts { resources: Err(why.clone()), opcodes: Err(why.clone()), main_loop: Err(why) }
            }
            Ok((arch, log, listing)) => {
                let code = read(&listing, MAX_SASS).and_then(|text| {
                    let mut all = sass::listing(&text).map_err(|e| format!("{}: {e:#}", listing.display()))?;
                    all.remove(kernel).ok_or_else(|| format!("{} lists no function {kernel}", listing.display()))
                });
                Facts {
                    resources: read(&log, MAX_LOG).and_then(|text| {
                        ptxas::parse(&text)
                            .kernels
                            .into_iter()
                            .find(|k| k.name == kernel && k.arch == arch)
                            .ok_or_else(|| format!("{} has no ptxas row of {kernel} for {arch}", log.display()))
                    }),
                    opcodes: code.as_ref().map(|c| sass::count(c)).map_err(Clone::clone),
                    main_loop: code.and_then(|c| {
                        sass::main_loop(&c)
                            .map(sass::count)
                            .ok_or_else(|| "no loop holds both an MMA and an exponential".to_string())
                    }),
                }
            }
        }
    }
}

/// (arch, ptxas log, SASS listing) of the unit defining `kernel`.
fn unit_files(
    kernels: &Path,
    compute_capability: &str,
    kernel: &str,
) -> Result<(String, std::path::PathBuf, std::path::PathBuf)> {
    if kernel.is_empty() {
        bail!("its fa-bench does not name the entry it launched (built before entries were recorded)");
    }
    let manifest_path = kernels.join("manifest.json");
    let manifest = Manifest::load(&manifest_path)?;
    let arch = manifest.arch_for(compute_capability).with_context(|| {
        format!("no arch of {} runs on compute capability {compute_capability}", manifest_path.display())
    })?;
    let source = manifest
        .sources
        .iter()
        .find(|s| s.kernels.iter().any(|k| k.entry == kernel))
        .with_context(|| format!("{} has no entry {kernel}", manifest_path.display()))?;
    let unit = source.file.strip_suffix(".cu").unwrap_or(&source.file);
    Ok((arch.clone(), kernels.join(format!("{unit}.{arch}.log")), kernels.join(format!("{unit}.{arch}.sass"))))
}

fn read(path: &Path, limit: u64) -> Result<String, String> {
    fa_schema::file::read_bounded(path, limit)
        .and_then(|b| String::from_utf8(b).with_context(|| format!("{} is not UTF-8", path.display())))
        .map_err(|e| format!("{e:#}"))
}

/// The explanation's lines: the entry, the plan, the entry's ptxas resources
/// and SASS (largest relative changes first), then what changed.
pub fn explain(base: Launch, cand: Launch) -> Vec<String> {
    let (bf, cf) = (base.facts, cand.facts);
    let mut lines = Vec::new();
    let entry_changed = base.entry != cand.entry;
    let name = |e: &EntryRecord| if e.kernel.is_empty() { describe(e) } else { e.kernel.clone() };
    lines.push(if entry_changed {
        format!("entry: {} → {}", name(base.entry), name(cand.entry))
    } else {
        format!("entry: {} on both", name(cand.entry))
    });
    let (bp, cp) = (base.plan, cand.plan);
    let plan_changed = bp != cp;
    lines.push(if plan_changed {
        format!("plan: splits {} → {}, CTAs {} → {}", bp.num_splits, cp.num_splits, bp.ctas, cp.ctas)
    } else {
        format!("plan: {} split(s), {} CTAs on both", cp.num_splits, cp.ctas)
    });
    let resources = match (&bf.resources, &cf.resources) {
        (Ok(b), Ok(c)) => {
            let changes = resource_changes(b, c);
            lines.push(if changes.is_empty() {
                format!(
                    "ptxas ({}): the same; registers {}, spilled {} B, barriers {}",
                    c.arch,
                    c.registers,
                    c.spill_bytes(),
                    c.barriers
                )
            } else {
                format!("ptxas ({}): {}", c.arch, changes.join(", "))
            });
            Some(!changes.is_empty())
        }
        (b, c) => {
            lines.push(format!("ptxas: not compared ({})", missing(b, c)));
            None
        }
    };
    let code = match (&bf.opcodes, &cf.opcodes) {
        (Ok(b), Ok(c)) => {
            let (line, changed) = sass_line("SASS (static counts)", b, c);
            lines.push(line);
            match (&bf.main_loop, &cf.main_loop) {
                (Ok(b), Ok(c)) => lines.push(sass_line("SASS key-tile loop", b, c).0),
                (b, c) => lines.push(format!("SASS key-tile loop: not compared ({})", missing(b, c))),
            }
            Some(changed)
        }
        (b, c) => {
            lines.push(format!("SASS: not compared ({})", missing(b, c)));
            None
        }
    };
    lines.push(
        match (entry_changed, plan_changed, resources, code) {
            (true, ..) => "what changed: the entry (another kernel ran)",
            (false, true, ..) => "what changed: the plan (the same entry, another split or grid)",
            (false, false, Some(true), _) | (false, false, _, Some(true)) => "what changed: the entry's code",
            (false, false, Some(false), Some(false)) => {
                "what changed: nothing the builds show (same entry, plan, resources and opcode counts); \
                 profile both sides"
            }
            _ => "what changed: not known (one side's build facts are missing)",
        }
        .to_string(),
    );
    lines
}

/// How many moved metrics the profile line names.
const PROFILE_MOVES: usize = 4;
/// An SM clock change (fraction) between the two launches past which their
/// durations are not comparable and the profile says to compare cycles.
const CLOCK_MOVED: f64 = 0.02;

/// Nsight Compute's side of an explanation: each side's kernel launch on the
/// shape, profiled in the same run. The duration; the metrics that moved most
/// (throughputs, issue, tensor pipe and occupancy by their relative change; a
/// stall reason by its change as a share of the base's stalls, so a rare reason
/// that doubles does not outrank a common one that grows); and the candidate's
/// top stall reasons. ncu leaves the clocks alone: where the SM clock moved
/// between the launches, a line says so and gives the change in cycles, the
/// launch's work at any clock.
pub fn profile_lines(base: &Profiled, cand: &Profiled) -> Vec<String> {
    let mut lines = Vec::new();
    let change = |b: Option<f64>, c: Option<f64>| match (b, c) {
        (Some(b), Some(c)) if b > 0.0 => Some((b, c, c / b - 1.0)),
        _ => None,
    };
    let dur = change(base.duration_us, cand.duration_us);
    let cycles = change(base.sm_cycles, cand.sm_cycles);
    let mut head = format!(
        "ncu: {} → {}: duration {}",
        base.kernel,
        cand.kernel,
        dur.map_or("n/a".into(), |(b, c, d)| format!("{b:.1} → {c:.1} µs ({:+.1}%)", d * 100.0))
    );
    if let Some((b, c, d)) = cycles {
        // In the base's scale: thousands below a million, with a digit that moves.
        let (unit, div, digits) = if b < 1e6 { ("K", 1e3, 1) } else { ("M", 1e6, 3) };
        head += &format!("; SM cycles {:.digits$} → {:.digits$} {unit} ({:+.1}%)", b / div, c / div, d * 100.0);
    }
    let clocks = change(base.clock_ghz(), cand.clock_ghz());
    if let Some((b, c, _)) = clocks {
        head += &format!(" at {b:.2} → {c:.2} GHz");
    }
    lines.push(head);
    if let (Some((.., d)), Some((.., k)), Some((b, c, g))) = (dur, cycles, clocks)
        && g.abs() >= CLOCK_MOVED
    {
        lines.push(format!(
            "ncu: the SM clock moved {b:.2} → {c:.2} GHz ({:+.1}%): compare the SM cycles ({:+.1}%), not the \
             durations ({:+.1}%)",
            g * 100.0,
            k * 100.0,
            d * 100.0
        ));
    }
    let pct = |name: &str, b: Option<f64>, c: Option<f64>| -> Option<(f64, String)> {
        let (b, c) = (b?, c?);
        let moved = (c - b) / b.max(1.0);
        Some((moved.abs(), format!("{name} {b:.1}% → {c:.1}% ({:+.0}%)", moved * 100.0)))
    };
    let mut moves: Vec<(f64, String)> = [
        pct("tensor pipe", base.tensor_active_pct, cand.tensor_active_pct),
        pct("issue active", base.issue_active_pct, cand.issue_active_pct),
        pct("occupancy", base.achieved_occupancy_pct, cand.achieved_occupancy_pct),
        pct("DRAM", base.dram_throughput_pct, cand.dram_throughput_pct),
        pct("L2", base.l2_throughput_pct, cand.l2_throughput_pct),
        pct("SM", base.sm_throughput_pct, cand.sm_throughput_pct),
    ]
    .into_iter()
    .flatten()
    .collect();
    let total = base.stalls_ranked().iter().map(|(_, v)| v).sum::<f64>().max(1e-9);
    for (reason, &c) in &cand.stalls {
        let Some(&b) = base.stalls.get(reason) else { continue };
        let moved = (c - b) / total;
        moves.push((
            moved.abs(),
            format!("stall {reason} {b:.2} → {c:.2} warps/issue ({:+.0}% of the base's stalls)", moved * 100.0),
        ));
    }
    moves.sort_by(|a, b| b.0.total_cmp(&a.0));
    let named: Vec<String> =
        moves.into_iter().take(PROFILE_MOVES).filter(|(m, _)| *m >= 0.01).map(|(_, s)| s).collect();
    lines.push(if named.is_empty() {
        "ncu: no metric moved by 1% or more".into()
    } else {
        format!("ncu moved most: {}", named.join("; "))
    });
    let top: Vec<String> = cand.stalls_ranked().iter().take(3).map(|(r, v)| format!("{r} {v:.2}")).collect();
    if !top.is_empty() {
        lines.push(format!("ncu top stalls (candidate, warps/issue): {}", top.join(", ")));
    }
    lines
}

fn describe(e: &EntryRecord) -> String {
    format!(
        "{} m{} kg{}{}",
        if e.variant.is_empty() { "?" } else { &e.variant },
        e.block_m,
        e.key_groups,
        if e.persistent { " persistent" } else { "" }
    )
}

fn missing<T>(b: &Result<T, String>, c: &Result<T, String>) -> String {
    [("base", b), ("candidate", c)]
        .iter()
        .filter_map(|(side, r)| r.as_ref().err().map(|e| format!("{side}: {e}")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The ptxas fields that differ, `name base → cand`.
fn resource_changes(b: &KernelResources, c: &KernelResources) -> Vec<String> {
    let fields = [
        ("registers", b.registers, c.registers, ""),
        ("spilled", b.spill_bytes(), c.spill_bytes(), " B"),
        ("stack", b.stack_frame, c.stack_frame, " B"),
        ("static shared", b.smem_static, c.smem_static, " B"),
        ("barriers", b.barriers, c.barriers, ""),
    ];
    let mut out: Vec<String> =
        fields.iter().filter(|f| f.1 != f.2).map(|(n, x, y, unit)| format!("{n} {x}{unit} → {y}{unit}")).collect();
    if b.wgmma_serialized.is_empty() != c.wgmma_serialized.is_empty() {
        let said = |r: &KernelResources| {
            r.wgmma_serialized.first().map_or("not serialised".to_string(), |w| format!("serialised ({})", w.code))
        };
        out.push(format!("wgmma {} → {}", said(b), said(c)));
    }
    out
}

/// The SASS line: instruction totals, then the opcodes whose counts changed,
/// largest relative change first (an opcode one side lacks first of all).
/// Counts are of the listing, not of executed instructions: a path added but
/// rarely taken counts in full.
fn sass_line(what: &str, b: &BTreeMap<String, u32>, c: &BTreeMap<String, u32>) -> (String, bool) {
    let (tb, tc) = (b.values().sum::<u32>(), c.values().sum::<u32>());
    let mut changes: Vec<(&str, u32, u32)> = b
        .keys()
        .chain(c.keys())
        .map(String::as_str)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|op| (op, b.get(op).copied().unwrap_or(0), c.get(op).copied().unwrap_or(0)))
        .filter(|(_, x, y)| x != y)
        .collect();
    if changes.is_empty() {
        return (format!("{what}: the same, {tc} instructions"), false);
    }
    let rel = |x: u32, y: u32| if x == 0 { f64::INFINITY } else { (f64::from(y) - f64::from(x)).abs() / f64::from(x) };
    changes.sort_by(|p, q| rel(q.1, q.2).total_cmp(&rel(p.1, p.2)).then(p.0.cmp(q.0)));
    let shown: Vec<String> = changes.iter().take(6).map(|(op, x, y)| format!("{op} {x} → {y}")).collect();
    let more = if changes.len() > 6 { format!(" and {} more", changes.len() - 6) } else { String::new() };
    (format!("{what}: {tb} → {tc} instructions; {}{more}", shown.join(", ")), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kernel: &str) -> EntryRecord {
        EntryRecord { kernel: kernel.into(), variant: "hopper".into(), block_m: 128, key_groups: 1, persistent: true }
    }

    fn profiled(us: f64, issue: f64, stalls: &[(&str, f64)]) -> Profiled {
        let json = serde_json::json!({
            "kernel": "flash_fwd_hopper_f16_d128_causal", "duration_us": us, "sm_throughput_pct": 60.0,
            "dram_throughput_pct": 10.0, "achieved_occupancy_pct": 18.0, "issue_active_pct": issue,
            "tensor_active_pct": 70.0, "gmma_instructions": null, "grid": 264.0, "block": 384.0,
            "registers": 168.0, "smem_bytes": 164936.0, "waves_per_sm": 1.0, "limit_registers": 1.0,
            "limit_smem": 1.0, "limit_warps": 5.0, "sm_count": 132.0,
            "stalls": stalls.iter().map(|(r, v)| (r.to_string(), *v)).collect::<BTreeMap<_, _>>(), "missing": []
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_planted_slowdown_is_explained_from_both_sides_real_profiles() {
        // The same 16 shapes profiled on the clean tree and with 64 dependent
        // FMAs per key tile: every shape is slower, and the explanation names
        // the `wait` stall (the FMA chain's fixed latency) as the candidate's top one.
        let base = crate::measure::profile::tests::gate_profiles("base");
        let cand = crate::measure::profile::tests::gate_profiles("planted");
        for (b, c) in base.iter().zip(&cand) {
            let (b, c) = (&b.launches[0], &c.launches[0]);
            assert_eq!(b.kernel, c.kernel);
            let lines = profile_lines(b, c);
            assert!(c.duration_us > b.duration_us, "{lines:?}");
            assert!(lines[0].contains("duration") && lines[0].contains("(+"), "{lines:?}");
            assert!(lines[1].starts_with("ncu moved most: "), "{lines:?}");
            assert!(lines[2].starts_with("ncu top stalls (candidate, warps/issue): wait "), "{lines:?}");
        }
    }

    #[test]
    fn a_profile_names_the_metrics_that_moved_most_and_the_top_stalls() {
        // A fixed delay per tile in the consumer: the wait stall grows by half
        // the base's stalls; the rare membar stall doubles but moves little.
        let base = profiled(800.0, 40.0, &[("wait", 1.0), ("gmma", 2.0), ("membar", 0.01), ("selected", 1.0)]);
        let cand = profiled(920.0, 41.0, &[("wait", 2.5), ("gmma", 2.0), ("membar", 0.02), ("selected", 1.0)]);
        let lines = profile_lines(&base, &cand);
        assert_eq!(
            lines[0],
            "ncu: flash_fwd_hopper_f16_d128_causal → flash_fwd_hopper_f16_d128_causal: duration 800.0 → 920.0 µs (+15.0%)"
        );
        assert!(
            lines[1].starts_with(
                "ncu moved most: stall wait 1.00 → 2.50 warps/issue (+50% of the base's stalls); issue active"
            ),
            "{lines:?}"
        );
        assert!(!lines[1].contains("membar"), "{lines:?}");
        assert_eq!(lines[2], "ncu top stalls (candidate, warps/issue): wait 2.50, gmma 2.00, membar 0.02");
        // Identical profiles: nothing moved.
        assert_eq!(profile_lines(&base, &base)[1], "ncu: no metric moved by 1% or more");
    }

    #[test]
    fn a_clock_that_moved_between_the_launches_is_said_to() {
        // ncu leaves the clocks alone: the same launch's cycles at two clocks
        // (the 192-row e4m3 entry at B2 H16 S8192 runs 1.89 M cycles a launch).
        let at = |us: f64, cycles: f64| Profiled { sm_cycles: Some(cycles), ..profiled(us, 40.0, &[("wait", 1.7)]) };
        let base = at(1056.9, 1.896e6);
        let lines = profile_lines(&base, &at(1140.0, 1.900e6));
        assert!(lines[0].ends_with("; SM cycles 1.896 → 1.900 M (+0.2%) at 1.79 → 1.67 GHz"), "{lines:?}");
        assert_eq!(
            lines[1],
            "ncu: the SM clock moved 1.79 → 1.67 GHz (-7.1%): compare the SM cycles (+0.2%), not the durations (+7.9%)"
        );
        // Work and clock both moved: the cycles carry the work's share.
        let lines = profile_lines(&base, &at(1141.5, 1.970e6));
        assert!(lines[1].contains("(-3.8%): compare the SM cycles (+3.9%), not the durations (+8.0%)"), "{lines:?}");
        // Cycles that moved with the duration at one clock: no clock line.
        let lines = profile_lines(&base, &at(1140.0, 2.045e6));
        assert!(lines[0].contains("(+7.9%) at 1.79 → 1.79 GHz"), "{lines:?}");
        assert_eq!(lines[1], "ncu: no metric moved by 1% or more", "{lines:?}");
        // A clock within 2%: not said.
        assert!(!profile_lines(&base, &at(1070.0, 1.896e6)).iter().any(|l| l.contains("clock moved")));
        // No cycles (an older report): neither cycles nor clock.
        let lines = profile_lines(&profiled(1056.9, 40.0, &[]), &at(1140.0, 1.9e6));
        assert!(lines[0].ends_with("(+7.9%)") && !lines[1].contains("clock"), "{lines:?}");
        // A short launch's cycles in thousands (a gate run's causal 8k-key e4m3 shape).
        let lines = profile_lines(&at(29.0, 52_140.0), &at(28.4, 51_000.0));
        assert!(lines[0].ends_with("; SM cycles 52.1 → 51.0 K (-2.2%) at 1.80 → 1.80 GHz"), "{lines:?}");
    }

    #[test]
    fn real_launches_at_two_clocks_are_told_apart_from_a_change_in_work() {
        // The same kernels profiled at base clocks and at the bench's: the two
        // large shapes' launches took longer at base clocks in about the same
        // cycles (+0.9% and +1.8% at the bench's).
        let base = crate::measure::profile::tests::clock_profiles("base");
        let bench = crate::measure::profile::tests::clock_profiles("none");
        for (b, c) in base.iter().zip(&bench).take(2) {
            let lines = profile_lines(&b.launches[0], &c.launches[0]);
            assert!(lines[1].starts_with("ncu: the SM clock moved 1.3"), "{lines:?}");
            assert!(lines[1].contains("compare the SM cycles (+"), "{lines:?}");
            assert!(lines[1].ends_with("not the durations (-14.0%)") || b.shape != "2,16,8192,128", "{lines:?}");
        }
    }

    fn launch<'a>(entry: &'a EntryRecord, num_splits: u32, ctas: u64, facts: &'a Facts) -> Launch<'a> {
        Launch { entry, plan: Plan { num_splits, ctas }, facts }
    }

    fn facts(registers: u32, spills: u32, ops: &[(&str, u32)]) -> Facts {
        Facts {
            resources: Ok(KernelResources {
                name: "k".into(),
                arch: "sm_90a".into(),
                registers,
                spill_stores: spills,
                barriers: 16,
                ..KernelResources::default()
            }),
            opcodes: Ok(ops.iter().map(|&(o, n)| (o.to_string(), n)).collect()),
            // The key-tile loop: the first two opcodes' counts.
            main_loop: Ok(ops.iter().take(2).map(|&(o, n)| (o.to_string(), n)).collect()),
        }
    }

    #[test]
    fn a_planner_only_change_is_explained_as_a_plan_change() {
        let (f, k) = (facts(168, 0, &[("HGMMA", 64), ("FFMA", 100)]), entry("k"));
        let lines = explain(launch(&k, 1, 132, &f), launch(&k, 3, 396, &f));
        assert_eq!(lines[1], "plan: splits 1 → 3, CTAs 132 → 396");
        assert!(lines[2].contains("the same") && lines[3].contains("the same, 164 instructions"), "{lines:?}");
        assert_eq!(lines[4], "SASS key-tile loop: the same, 164 instructions");
        assert!(lines.last().unwrap().contains("the plan"), "{lines:?}");
    }

    #[test]
    fn a_code_change_names_the_resources_and_opcodes_that_moved_largest_first() {
        let base = facts(128, 0, &[("HGMMA", 64), ("FFMA", 100), ("IMAD", 1000)]);
        let cand = facts(160, 96, &[("HGMMA", 64), ("FFMA", 300), ("IMAD", 1010), ("STL", 12)]);
        let k = entry("k");
        let lines = explain(launch(&k, 1, 132, &base), launch(&k, 1, 132, &cand));
        assert_eq!(lines[0], "entry: k on both");
        assert_eq!(lines[2], "ptxas (sm_90a): registers 128 → 160, spilled 0 B → 96 B");
        assert_eq!(
            lines[3],
            "SASS (static counts): 1164 → 1386 instructions; STL 0 → 12, FFMA 100 → 300, IMAD 1000 → 1010"
        );
        assert_eq!(lines[4], "SASS key-tile loop: 164 → 364 instructions; FFMA 100 → 300");
        assert_eq!(lines[5], "what changed: the entry's code");
    }

    #[test]
    fn another_entry_and_missing_facts_are_said_as_such() {
        let f = facts(168, 0, &[("HGMMA", 64)]);
        let gone = Facts {
            resources: Err("no log".into()),
            opcodes: Err("no listing".into()),
            main_loop: Err("no listing".into()),
        };
        let (a, b) = (entry("a"), entry("b"));
        let lines = explain(launch(&a, 1, 132, &gone), launch(&b, 1, 132, &f));
        assert_eq!(lines[0], "entry: a → b");
        assert!(lines[2].contains("base: no log") && lines[3].contains("base: no listing"), "{lines:?}");
        assert!(lines.last().unwrap().contains("the entry (another kernel ran)"));
        let same = explain(launch(&a, 1, 132, &gone), launch(&a, 1, 132, &f));
        assert!(same.last().unwrap().contains("not known"), "{same:?}");
        let quiet = explain(launch(&a, 1, 132, &f), launch(&a, 1, 132, &f));
        assert!(quiet.last().unwrap().contains("nothing the builds show"), "{quiet:?}");
    }

    #[test]
    fn facts_come_from_a_kernel_directorys_logs_and_listings() {
        let dir = std::env::temp_dir().join(format!("explain-facts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = r#"{"static_smem_limit": 49152,
            "archs": {"sm_90a": {"gencode": "arch=compute_90a,code=sm_90a", "smem_optin_limit": 232448}},
            "sources": [{"file": "flash_fwd_hopper_f16.cu", "archs": ["sm_90a"],
                         "kernels": [{"entry": "flash_fwd_hopper_f16_d64", "max_registers": 168}]}]}"#;
        std::fs::write(dir.join("manifest.json"), manifest).unwrap();
        std::fs::write(
            dir.join("flash_fwd_hopper_f16.sm_90a.log"),
            include_str!("../../tests/data/ptxas-c7515-wgmma-accumulator-sm90a.txt"),
        )
        .unwrap();
        std::fs::write(
            dir.join("flash_fwd_hopper_f16.sm_90a.sass"),
            include_str!("../../tests/data/sass/flash-fwd-sm90a-excerpt.sass"),
        )
        .unwrap();
        let f = Facts::load(&dir, "9.0", "flash_fwd_hopper_f16_d64");
        let ops = f.opcodes.unwrap();
        assert_eq!(ops["HGMMA"], 4);
        // The excerpt holds no whole key-tile loop: said, not guessed.
        assert!(f.main_loop.unwrap_err().contains("no loop holds both"));
        assert_eq!(f.resources.unwrap().arch, "sm_90a");
        let unknown = Facts::load(&dir, "9.0", "flash_fwd_nope");
        assert!(unknown.opcodes.unwrap_err().contains("has no entry flash_fwd_nope"));
        let old = Facts::load(&dir, "9.0", "");
        assert!(old.resources.unwrap_err().contains("does not name the entry"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
