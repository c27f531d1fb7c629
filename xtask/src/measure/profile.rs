//! `cargo xtask profile`: Nsight Compute on the bench driver with a minimal
//! metric set, one profiled launch per shape, and the flags a kernel engineer acts on.
//! With `--gpus`, the shapes are dealt out in batches to one ncu per GPU, and each
//! shape records the GPU it ran on.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::errors::CannotRun;
use crate::parse::ncu::{self, Row};
use crate::report::{Device, Envelope, Toolchain};
use crate::run::Run;
use crate::table;
use crate::tools::deal::deal;
use crate::tools::drivers;
use crate::tools::gpu::GpuSpec;
use crate::tools::gpu::ListedGpu;
use crate::tools::process::Cmd;
use crate::tools::toolchain;
use crate::verify::preflight;
use crate::verify::spread;
use fa_schema::schema::ListedCase;

/// Metrics every sm_80+ chip has (checked against `ncu --query-metrics` for gh100 and ad104).
pub const METRICS: &[&str] = &[
    "gpu__time_duration.sum",
    // The SM clock's cycles over the launch: a duration that moves without them
    // moved with the clock (Launch::clock_ghz), not with the kernel's work.
    "sm__cycles_elapsed.avg",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__inst_issued.avg.pct_of_peak_sustained_active",
    // Every tensor op (mma.sync and wgmma alike).
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__waves_per_multiprocessor",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__sm_count",
    // Warps waiting per issued instruction, by reason (Nsight Compute's warp state statistics).
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_misc_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
];
/// Hopper only: warpgroup MMA instructions, and warps waiting on them.
pub const HOPPER_METRICS: &[&str] =
    &["sm__inst_executed_pipe_tensor_op_gmma.sum", "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio"];

/// A stall metric's reason: `smsp__average_warps_issue_stalled_wait_per_issue_active.ratio` → `wait`.
fn stall_reason(metric: &str) -> Option<&str> {
    metric.strip_prefix("smsp__average_warps_issue_stalled_")?.strip_suffix("_per_issue_active.ratio")
}

/// The metrics to ask for on a chip of compute capability `cc`.
pub fn metrics_for(cc: &str) -> Vec<&'static str> {
    let mut m = METRICS.to_vec();
    if cc.starts_with("9.") {
        m.extend(HOPPER_METRICS);
    }
    m
}

/// The seed shapes and one compute-bound shape.
pub const DEFAULT_SHAPES: &[&str] = &["1,1,128,64", "1,1,512,64", "2,8,512,64", "4,16,2048,64"];

pub struct Options {
    pub shapes: Vec<String>,
    /// `--gpus all|N|LIST`: one ncu per GPU.
    pub gpus: Option<GpuSpec>,
    /// `--clock-control base` instead of `none` (none matches the bench's clocks).
    pub base_clocks: bool,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    pub kernel: String,
    pub duration_us: Option<f64>,
    /// SM cycles elapsed over the launch (the average SM's).
    #[serde(default)]
    pub sm_cycles: Option<f64>,
    pub sm_throughput_pct: Option<f64>,
    pub dram_throughput_pct: Option<f64>,
    #[serde(default)]
    pub l2_throughput_pct: Option<f64>,
    pub achieved_occupancy_pct: Option<f64>,
    /// Cycles an instruction issued, % of the active cycles.
    #[serde(default)]
    pub issue_active_pct: Option<f64>,
    pub tensor_active_pct: Option<f64>,
    pub gmma_instructions: Option<f64>,
    pub grid: Option<f64>,
    pub block: Option<f64>,
    pub registers: Option<f64>,
    pub smem_bytes: Option<f64>,
    pub waves_per_sm: Option<f64>,
    /// Blocks per SM allowed by each limiter.
    pub limit_registers: Option<f64>,
    pub limit_smem: Option<f64>,
    pub limit_warps: Option<f64>,
    pub sm_count: Option<f64>,
    /// Warps waiting per issued instruction, by reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stalls: BTreeMap<String, f64>,
    /// Metrics requested but absent for this arch.
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShapeProfile {
    pub shape: String,
    pub launches: Vec<Launch>,
    pub flags: Vec<String>,
    /// UUID of the GPU it was profiled on, where `--gpus` named GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
}

impl Launch {
    /// The stall reasons, most warps waiting per issued instruction first (ties
    /// by name); `selected` is issuing, not stalled, and is left out.
    pub fn stalls_ranked(&self) -> Vec<(&str, f64)> {
        let mut ranked: Vec<(&str, f64)> =
            self.stalls.iter().filter(|(r, _)| r.as_str() != "selected").map(|(r, v)| (r.as_str(), *v)).collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked
    }

    /// The stall reason with the most warps waiting per issued instruction.
    pub fn top_stall(&self) -> Option<(&str, f64)> {
        self.stalls_ranked().first().copied()
    }

    /// The SM clock over the launch, in GHz: its cycles over its duration.
    pub fn clock_ghz(&self) -> Option<f64> {
        match (self.sm_cycles, self.duration_us) {
            (Some(c), Some(us)) if us > 0.0 && c > 0.0 => Some(c / (us * 1e3)),
            _ => None,
        }
    }

    fn from_row(row: &Row, units: &BTreeMap<String, String>, requested: &[&str]) -> Launch {
        let duration = "gpu__time_duration.sum";
        let to_us = match units.get(duration).map(String::as_str) {
            Some("us" | "usecond") => 1.0,
            Some("ms" | "msecond") => 1e3,
            Some("s" | "second") => 1e6,
            _ => 1e-3, // ns, ncu's default
        };
        let cycles = "sm__cycles_elapsed.avg";
        let per_cycle = match units.get(cycles).map(String::as_str) {
            Some("cycle" | "") | None => Some(1.0),
            Some("Kcycle") => Some(1e3),
            Some("Mcycle") => Some(1e6),
            Some("Gcycle") => Some(1e9),
            Some(_) => None, // a unit not known to be cycles: absent, not misread
        };
        let smem =
            match (row.num("launch__shared_mem_per_block_static"), row.num("launch__shared_mem_per_block_dynamic")) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
            };
        Launch {
            kernel: row.kernel.clone(),
            duration_us: row.num(duration).map(|v| v * to_us),
            sm_cycles: per_cycle.and_then(|k| row.num(cycles).map(|v| v * k)),
            sm_throughput_pct: row.num("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            dram_throughput_pct: row.num("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            l2_throughput_pct: row.num("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
            achieved_occupancy_pct: row.num("sm__warps_active.avg.pct_of_peak_sustained_active"),
            issue_active_pct: row.num("sm__inst_issued.avg.pct_of_peak_sustained_active"),
            tensor_active_pct: row.num("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
            gmma_instructions: row.num("sm__inst_executed_pipe_tensor_op_gmma.sum"),
            grid: row.num("launch__grid_size"),
            block: row.num("launch__block_size"),
            registers: row.num("launch__registers_per_thread"),
            smem_bytes: smem,
            waves_per_sm: row.num("launch__waves_per_multiprocessor"),
            limit_registers: row.num("launch__occupancy_limit_registers"),
            limit_smem: row.num("launch__occupancy_limit_shared_mem"),
            limit_warps: row.num("launch__occupancy_limit_warps"),
            sm_count: row.num("launch__sm_count"),
            stalls: requested.iter().filter_map(|m| Some((stall_reason(m)?.to_string(), row.num(m)?))).collect(),
            missing: requested
                .iter()
                .filter(|m| row.num(m).is_none() || (**m == cycles && per_cycle.is_none()))
                .map(|m| m.to_string())
                .collect(),
        }
    }
}

/// The flags for one attention launch. `intensity` is FLOPs per byte of q, k, v, o.
pub fn flags(l: &Launch, intensity: f64) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(waves), Some(grid), Some(sms)) = (l.waves_per_sm, l.grid, l.sm_count)
        && waves < 1.0
    {
        out.push(format!("grid of {grid:.0} CTAs is under one full wave ({waves:.2} waves on {sms:.0} SMs): split keys or shrink tiles"));
    }
    if let Some(t) = l.tensor_active_pct
        && intensity > 300.0
        && t < 40.0
    {
        out.push(format!("tensor pipe active {t:.0}% on a compute-bound shape ({intensity:.0} FLOP/B)"));
    }
    let limits = [("registers", l.limit_registers), ("shared memory", l.limit_smem)];
    let warps = l.limit_warps.unwrap_or(f64::INFINITY);
    for (what, limit) in limits {
        if let Some(b) = limit
            && b < warps
            && limits.iter().all(|(_, other)| other.is_none_or(|o| b <= o))
        {
            out.push(format!("occupancy limited by {what}: {b:.0} CTA(s)/SM"));
        }
    }
    out
}

/// B, H, S, D of a `B,H,S,D[,causal]` shape.
fn dims(shape: &str) -> Option<[f64; 4]> {
    let n: Vec<f64> = shape.split(',').filter_map(|x| x.parse().ok()).collect();
    n.get(..4).map(|v| [v[0], v[1], v[2], v[3]])
}

/// Shapes as cases to deal out, each weighing B·H·S²·D.
fn listed(shapes: &[String]) -> Vec<ListedCase> {
    let work = |s: &str| dims(s).map_or(0.0, |[b, h, s, d]| b * h * s * s * d);
    shapes.iter().map(|s| ListedCase { name: s.clone(), work: work(s) }).collect()
}

fn intensity(shape: &str) -> f64 {
    let Some([b, h, s, d]) = dims(shape) else { return 0.0 };
    let flops = 4.0 * b * h * s * s * d;
    let bytes = 4.0 * b * h * s * d * 2.0;
    flops / bytes
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("profile")?;
    let ncu = toolchain::cuda_tool("ncu")?;
    let bench = drivers::binary(cx, "fa-bench")?;
    let fa_test = drivers::binary(cx, "fa-test")?;
    let gpus = crate::tools::gpu::workers(opts.gpus.as_ref(), cx.device.as_deref(), "profile")?;
    let info = drivers::device_info(&fa_test, &cx.kernels, cx.device.as_deref(), gpus[0].as_ref())?;
    let metrics = metrics_for(&info.compute_capability);
    // One part per GPU of near-equal work, so each ncu starts once.
    let mut batches = spread::partition(&listed(&opts.shapes), gpus.len() as u32);
    batches.retain(|b| !b.is_empty());
    let started = std::time::Instant::now();
    let dealt = deal(
        "batch",
        &gpus,
        batches,
        |g| drivers::start_check(&fa_test, &cx.kernels, g),
        |_, k, shapes, gpu| {
            profile_batch(cx, opts, &ncu, &bench, &metrics, k, shapes, gpu).map_err(|e| format!("{e:#}"))
        },
        |what| eprintln!("profile: {what}"),
    );
    let counter_hint = dealt.lost.iter().find(|l| l.why.contains(preflight::COUNTER_PERMISSION_HINT));
    if let Some(l) = counter_hint {
        return Err(CannotRun(l.why.clone()).into());
    }
    let mut shapes: Vec<ShapeProfile> = dealt.done.into_iter().flat_map(|(_, p)| p).collect();
    let order = |s: &ShapeProfile| opts.shapes.iter().position(|x| *x == s.shape).unwrap_or(usize::MAX);
    shapes.sort_by_key(order);
    let lost: Vec<String> = dealt.lost.iter().map(|l| format!("{} ({})", l.item.join(" "), l.why)).collect();
    let pct = |v: Option<f64>| v.map_or("n/a".into(), |x| format!("{x:.0}%"));
    let num = |v: Option<f64>| v.map_or("n/a".into(), |x| format!("{x:.0}"));
    let rows: Vec<Vec<String>> = shapes
        .iter()
        .flat_map(|s| {
            s.launches.iter().map(move |l| {
                vec![
                    s.shape.clone(),
                    l.kernel.clone(),
                    l.duration_us.map_or("n/a".into(), |x| format!("{x:.1}")),
                    l.clock_ghz().map_or("n/a".into(), |x| format!("{x:.2}")),
                    pct(l.sm_throughput_pct),
                    pct(l.dram_throughput_pct),
                    pct(l.achieved_occupancy_pct),
                    pct(l.tensor_active_pct),
                    pct(l.issue_active_pct),
                    pct(l.l2_throughput_pct),
                    l.top_stall().map_or("n/a".into(), |(r, v)| format!("{r} {v:.2}")),
                    num(l.grid),
                    num(l.block),
                    num(l.registers),
                    num(l.smem_bytes),
                    l.waves_per_sm.map_or("n/a".into(), |x| format!("{x:.2}")),
                ]
            })
        })
        .collect();
    println!(
        "{}",
        table::render(
            &[
                "shape",
                "kernel",
                "us",
                "GHz",
                "SM",
                "DRAM",
                "occ",
                "tensor",
                "issue",
                "L2",
                "top stall",
                "grid",
                "block",
                "regs",
                "smem",
                "waves"
            ],
            &rows
        )
    );
    for s in &shapes {
        for f in &s.flags {
            println!("FLAG {}: {f}", s.shape);
        }
    }
    let report = cx.report("profile");
    let device = Device::from(&info);
    let toolchain = Toolchain { driver: info.driver.clone(), ..Toolchain::default() };
    Envelope::new("profile", crate::tools::process::git_state(&cx.root), toolchain, Some(device), &shapes)
        .kernels(crate::compile::kernel_set::reported(&cx.kernels))
        .write(&report)?;
    println!("report: {} ({:.1} s under ncu)", report.display(), started.elapsed().as_secs_f64());
    if !lost.is_empty() {
        return Err(CannotRun(format!("shapes not profiled: {}", lost.join("; "))).into());
    }
    Ok(())
}

/// One ncu run over `shapes` on `gpu`: a profile per shape, or why there is none.
#[allow(clippy::too_many_arguments)]
fn profile_batch(
    cx: &Run,
    opts: &Options,
    ncu: &Path,
    bench: &Path,
    metrics: &[&str],
    k: usize,
    shapes: &[String],
    gpu: Option<&ListedGpu>,
) -> Result<Vec<ShapeProfile>> {
    let log = cx.reports().join(if k == 0 { "profile/ncu.log".into() } else { format!("profile/ncu-{k}.log") });
    let target = Target { bench, kernels: &cx.kernels, device: cx.device.as_deref(), args: &[] };
    profile_shapes(ncu, &target, metrics, shapes, opts.base_clocks, opts.timeout, &log, gpu)
}

/// What ncu profiles: a bench binary, the kernels it loads, its GPU and extra
/// arguments (`--dtype bf16`, `--variant hopper`).
pub struct Target<'a> {
    pub bench: &'a Path,
    pub kernels: &'a Path,
    pub device: Option<&'a str>,
    pub args: &'a [String],
}

/// One ncu run of `target` over `shapes` (each launched once) on `gpu`, its
/// output logged at `log`: a profile per shape, or why there is none.
#[allow(clippy::too_many_arguments)]
pub fn profile_shapes(
    ncu: &Path,
    target: &Target,
    metrics: &[&str],
    shapes: &[String],
    base_clocks: bool,
    timeout: Duration,
    log: &Path,
    gpu: Option<&ListedGpu>,
) -> Result<Vec<ShapeProfile>> {
    let mut cmd = Cmd::new(ncu)
        .args(["--csv", "--page", "raw", "--kernel-name", "regex:flash_", "--clock-control"])
        .arg(if base_clocks { "base" } else { "none" })
        .arg("--metrics")
        .arg(metrics.join(","))
        .arg(target.bench.display().to_string())
        .args(["--launches-only", "1"])
        .args(target.args.iter().cloned())
        .timeout(timeout)
        .log(log);
    for s in shapes {
        cmd = cmd.arg("--shape").arg(s.clone());
    }
    let out = drivers::on_gpu(drivers::aim(cmd, target.kernels, target.device), gpu).run()?;
    let text = format!("{}{}", out.stdout, out.stderr);
    if text.contains("ERR_NVGPUCTRPERM") {
        anyhow::bail!("{}", preflight::COUNTER_PERMISSION_HINT);
    }
    let table = ncu::parse(&out.stdout).with_context(|| format!("ncu exited with {}: {}", out.status, out.tail()))?;
    let profiles = shape_profiles(&table, metrics, shapes, gpu.map(|g| g.uuid.clone()));
    if profiles.len() != shapes.len() {
        anyhow::bail!(
            "ncu profiled {} flash_fwd launch(es) for {} shape(s); see {}",
            profiles.len(),
            shapes.len(),
            log.display()
        );
    }
    Ok(profiles)
}

/// ncu's rows of one fa-bench run, in launch order: per shape a flash_fwd row,
/// then its combine if split.
fn shape_profiles(table: &ncu::Table, metrics: &[&str], shapes: &[String], gpu: Option<String>) -> Vec<ShapeProfile> {
    let mut out: Vec<ShapeProfile> = Vec::new();
    let mut pending = shapes.iter();
    for row in &table.rows {
        let launch = Launch::from_row(row, &table.units, metrics);
        if row.kernel.starts_with("flash_fwd") {
            let shape = pending.next().cloned().unwrap_or_else(|| "?".into());
            let flags = flags(&launch, intensity(&shape));
            out.push(ShapeProfile { shape, launches: vec![launch], flags, gpu: gpu.clone() });
        } else if let Some(last) = out.last_mut() {
            last.launches.push(launch);
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            kernel: "flash_fwd_f16_d64".into(),
            duration_us: Some(10.0),
            sm_cycles: Some(17_800.0),
            sm_throughput_pct: None,
            dram_throughput_pct: None,
            l2_throughput_pct: None,
            achieved_occupancy_pct: None,
            issue_active_pct: None,
            tensor_active_pct: Some(80.0),
            gmma_instructions: None,
            grid: Some(264.0),
            block: Some(128.0),
            registers: Some(135.0),
            smem_bytes: Some(24576.0),
            waves_per_sm: Some(0.67),
            limit_registers: Some(3.0),
            limit_smem: Some(9.0),
            limit_warps: Some(16.0),
            sm_count: Some(132.0),
            stalls: BTreeMap::new(),
            missing: vec![],
        }
    }

    #[test]
    fn seed_problem_flags() {
        // The seed: 2 CTAs on a 58-SM L4.
        let l = Launch { grid: Some(2.0), waves_per_sm: Some(0.01), sm_count: Some(58.0), ..launch() };
        let f = flags(&l, intensity("1,1,128,64"));
        assert!(f[0].contains("2 CTAs is under one full wave"), "{f:?}");
        assert!(f.iter().any(|x| x.contains("limited by registers: 3")), "{f:?}");
    }

    #[test]
    fn compute_bound_low_tensor_activity() {
        let l = Launch {
            tensor_active_pct: Some(12.0),
            waves_per_sm: Some(5.0),
            limit_registers: Some(20.0),
            limit_smem: Some(32.0),
            ..launch()
        };
        let f = flags(&l, intensity("4,16,2048,64"));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("tensor pipe active 12%"));
        assert!(flags(&l, intensity("1,1,128,64")).is_empty(), "a small shape is not compute-bound");
    }

    #[test]
    fn rows_from_the_fixture() {
        let text =
            std::fs::read_to_string(format!("{}/tests/data/h200/ncu-csv-page-raw.csv", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        let t = ncu::parse(&text).unwrap();
        let l = Launch::from_row(&t.rows[0], &t.units, METRICS);
        assert!(l.duration_us.is_some_and(|us| us > 0.0 && us < 1e4), "{:?}", l.duration_us);
        assert_eq!(l.grid, Some(1024.0));
        assert!(l.missing.iter().any(|m| m == "launch__occupancy_limit_registers") || l.limit_registers.is_some());
    }

    /// A gate run's ncu log (H200, the 16 default f16 shapes, the split ones
    /// with their combine): `base` the clean tree, `planted` the same tree with
    /// FA_PLANT_SLOWDOWN=64.
    pub(crate) fn gate_profiles(side: &str) -> Vec<ShapeProfile> {
        let path = format!("{}/tests/data/h200/ncu-raw-gate-{side}.log", env!("CARGO_MANIFEST_DIR"));
        let t = ncu::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
        let shapes: Vec<String> = (0..16).map(|i| format!("shape-{i}")).collect();
        shape_profiles(&t, &metrics_for("9.0"), &shapes, None)
    }

    /// `xtask profile` on an H200 (the f16 Hopper entries) at the bench's
    /// clocks (`none`) and at base clocks (`base`): the same launches' shapes.
    pub(crate) fn clock_profiles(clocks: &str) -> Vec<ShapeProfile> {
        let path = format!("{}/tests/data/h200/ncu-raw-profile-clocks-{clocks}.log", env!("CARGO_MANIFEST_DIR"));
        let t = ncu::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
        let shapes = ["2,16,8192,128".to_string(), "4,16,2048,64".into(), "1,1,512,64".into()];
        shape_profiles(&t, &metrics_for("9.0"), &shapes, None)
    }

    #[test]
    fn cycles_are_read_in_their_unit_and_an_unknown_unit_is_missing() {
        let launch = |unit: &str| {
            let csv = format!(
                "\"ID\",\"Kernel Name\",\"gpu__time_duration.sum\",\"sm__cycles_elapsed.avg\"\n\
                 \"\",\"\",\"ns\",\"{unit}\"\n\"0\",\"flash_fwd_f16_d64\",\"1,000,000\",\"1.5\"\n"
            );
            let t = ncu::parse(&csv).unwrap();
            Launch::from_row(&t.rows[0], &t.units, &["gpu__time_duration.sum", "sm__cycles_elapsed.avg"])
        };
        let l = launch("Mcycle");
        assert_eq!((l.duration_us, l.sm_cycles, l.clock_ghz()), (Some(1000.0), Some(1.5e6), Some(1.5)));
        assert_eq!(launch("Kcycle").sm_cycles, Some(1500.0));
        let odd = launch("cycle/second");
        assert_eq!((odd.sm_cycles, odd.clock_ghz()), (None, None));
        assert_eq!(odd.missing, ["sm__cycles_elapsed.avg"]);
    }

    #[test]
    fn every_launch_has_its_cycles_and_clock() {
        for (clocks, ghz) in [("none", 1.5..2.0), ("base", 1.2..1.5)] {
            let p = clock_profiles(clocks);
            let big = &p[0].launches[0];
            assert_eq!(big.kernel, "flash_fwd_hopper_f16_d128");
            assert!(big.clock_ghz().is_some_and(|g| ghz.contains(&g)), "{clocks}: {:?}", big.clock_ghz());
            for l in p.iter().flat_map(|s| &s.launches) {
                assert!(l.missing.is_empty(), "{clocks} {}: {:?}", l.kernel, l.missing);
                assert!(l.sm_cycles.is_some_and(|c| c > 1e3), "{clocks} {}: {:?}", l.kernel, l.sm_cycles);
            }
        }
    }

    #[test]
    fn the_explanation_metrics_from_a_real_gate_run() {
        // Every shape's launch with its stalls, issue and tensor-pipe activity.
        let p = gate_profiles("planted");
        assert_eq!(p.len(), 16);
        assert!(p.iter().any(|s| s.launches.len() == 2 && s.launches[1].kernel.starts_with("flash_combine")));
        for s in &p {
            let l = &s.launches[0];
            assert!(l.kernel.starts_with("flash_fwd"), "{}", l.kernel);
            assert_eq!(l.stalls.len(), 18, "{}: {:?}", l.kernel, l.stalls.keys());
            // The run predates the cycles metric: its only absence.
            assert_eq!(l.missing, ["sm__cycles_elapsed.avg"], "{}", l.kernel);
            assert_eq!((l.sm_cycles, l.clock_ghz()), (None, None));
            assert!(l.issue_active_pct.is_some_and(|x| x > 0.0 && x <= 100.0));
            assert!(l.l2_throughput_pct.is_some());
        }
        // The Hopper kernel's wgmma counts as tensor-pipe activity.
        let hopper = p.iter().map(|s| &s.launches[0]).find(|l| l.kernel == "flash_fwd_hopper_f16_d128").unwrap();
        assert_eq!(hopper.top_stall().map(|(r, _)| r), Some("wait"));
        assert!(hopper.tensor_active_pct.is_some_and(|t| t > 40.0), "{:?}", hopper.tensor_active_pct);
        assert!(hopper.stalls["gmma"] >= 0.0 && hopper.stalls["wait"] > 1.0);
    }

    #[test]
    fn shapes_spread_over_gpus_keep_their_rows_and_gpu() {
        // Three flash launches (a split one with its combine): each row goes to the
        // shape of its batch, in launch order, and names the batch's GPU.
        let header = "\"ID\",\"Kernel Name\",\"gpu__time_duration.sum\"\n\"\",\"\",\"ns\"\n";
        let rows =
            ["flash_fwd_f16_d64_m64", "flash_fwd_f16_d64_m64", "flash_combine_f16_d64", "flash_fwd_hopper_f16_d64"];
        let body: String =
            rows.iter().enumerate().map(|(i, k)| format!("\"{i}\",\"{k}\",\"{}\"\n", 1000 * (i + 1))).collect();
        let t = ncu::parse(&format!("{header}{body}")).unwrap();
        let batch = ["1,1,128,64".to_string(), "1,1,512,64".into(), "4,16,2048,64".into()];
        let p = shape_profiles(&t, METRICS, &batch, Some("GPU-b".into()));
        let got: Vec<(&str, usize)> = p.iter().map(|s| (s.shape.as_str(), s.launches.len())).collect();
        assert_eq!(got, [("1,1,128,64", 1), ("1,1,512,64", 2), ("4,16,2048,64", 1)]);
        assert!(p.iter().all(|s| s.gpu.as_deref() == Some("GPU-b")));
        assert_eq!(p[1].launches[1].duration_us, Some(3.0));
        // One part per GPU, none empty, every shape once.
        let parts = spread::partition(&listed(&batch), 2);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 3);
        assert_eq!(parts[0], ["4,16,2048,64"], "the largest shape alone on one GPU");
    }
}
