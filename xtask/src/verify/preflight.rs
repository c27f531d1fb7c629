//! `cargo xtask preflight`: is this machine ready to build, test, sanitize,
//! profile and bench? One readiness table; warnings for a busy or throttled GPU.

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::errors::{CannotRun, CheckFailed};
use crate::parse::sanitizer;
use crate::parse::smi::{self, Smi};
use crate::report::{Device, Envelope, Toolchain};
use crate::run::Run;
use crate::table;
use crate::tools::drivers;
use crate::tools::process::Cmd;
use crate::tools::toolchain;
use fa_schema::manifest::Manifest;

/// What to do when ncu may not read the performance counters (profile and preflight).
pub const COUNTER_PERMISSION_HINT: &str = "ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM): \
    run as root, or set `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d and reload \
    the driver (https://developer.nvidia.com/ERR_NVGPUCTRPERM)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreflightPayload {
    pub smi: Smi,
    pub compute_capability: Option<String>,
    pub checks: Vec<Check>,
}

/// Clock-event reasons that mean the GPU is being held back (not merely idle).
const THROTTLING: &[&str] =
    &["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"];

/// Pure: checks derived from nvidia-smi, the compute capability, nvcc and the manifest.
pub fn static_checks(smi: &Smi, cc: Option<&str>, nvcc: Option<&str>, manifest: &Manifest) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |name: &str, status, detail: String| checks.push(Check { name: name.into(), status, detail });
    let Some(gpu) = smi.gpus.first() else {
        add("gpu", Status::Fail, "nvidia-smi lists no GPU".into());
        return checks;
    };
    add(
        "gpu",
        Status::Ok,
        format!(
            "{} ({}), driver {}, CUDA {}",
            gpu.name,
            gpu.bus_id,
            smi.driver_version.as_deref().unwrap_or("?"),
            smi.cuda_version.as_deref().unwrap_or("?")
        ),
    );
    match cc {
        Some(cc) => match manifest.arch_for(cc) {
            Some(arch) => add("arch", Status::Ok, format!("compute capability {cc} runs the {arch} build")),
            None => add(
                "arch",
                Status::Fail,
                format!(
                    "compute capability {cc} matches no manifest arch ({}); add one to kernels/manifest.json",
                    manifest.archs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ),
        },
        None => add("arch", Status::Fail, "nvidia-smi did not report a compute capability".into()),
    }
    match (nvcc, smi.cuda_version.as_deref()) {
        (Some(nvcc), Some(driver)) => {
            let mm = |v: &str| -> Option<(u32, u32)> {
                let mut it = v.split('.');
                Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
            };
            match (mm(nvcc), mm(driver)) {
                (Some(n), Some(d)) if n > d => add(
                    "nvcc vs driver",
                    Status::Fail,
                    format!(
                        "nvcc {nvcc} is newer than the driver's CUDA {driver}: PTX it emits cannot be JIT-compiled; use nvcc ≤ {driver} or update the driver"
                    ),
                ),
                (Some(_), Some(_)) => add("nvcc vs driver", Status::Ok, format!("nvcc {nvcc} ≤ driver CUDA {driver}")),
                _ => add("nvcc vs driver", Status::Warn, format!("cannot compare nvcc {nvcc} with CUDA {driver}")),
            }
        }
        _ => add("nvcc vs driver", Status::Warn, "nvcc or the driver's CUDA version unknown".into()),
    }
    let throttled: Vec<&String> =
        gpu.active_clock_reasons.iter().filter(|r| THROTTLING.contains(&r.as_str())).collect();
    let clocks = format!(
        "SM {} / {} MHz, memory {} / {} MHz",
        fmt(gpu.sm_clock_mhz),
        fmt(gpu.sm_clock_max_mhz),
        fmt(gpu.mem_clock_mhz),
        fmt(gpu.mem_clock_max_mhz)
    );
    if throttled.is_empty() {
        let why = if gpu.active_clock_reasons.is_empty() { "none".into() } else { gpu.active_clock_reasons.join(", ") };
        add("clocks", Status::Ok, format!("{clocks}; active reasons: {why}"));
    } else {
        let list: Vec<&str> = throttled.iter().map(|s| s.as_str()).collect();
        add("clocks", Status::Warn, format!("{clocks}; THROTTLED by {}: timings will be low", list.join(", ")));
    }
    match gpu.persistence_mode {
        Some(true) => add("persistence", Status::Ok, "enabled".into()),
        Some(false) => add(
            "persistence",
            Status::Warn,
            "disabled: first launches pay driver start-up; benches warm up longer".into(),
        ),
        None => add("persistence", Status::Warn, "unknown".into()),
    }
    if gpu.processes.is_empty() {
        add("other processes", Status::Ok, "none".into());
    } else {
        let procs: Vec<String> = gpu
            .processes
            .iter()
            .map(|p| {
                format!(
                    "{} (pid {}, {} MiB)",
                    p.name,
                    p.pid.map_or("?".into(), |x| x.to_string()),
                    fmt(p.used_memory_mib)
                )
            })
            .collect();
        add("other processes", Status::Warn, format!("GPU busy: {}; timings will be noisy", procs.join(", ")));
    }
    checks
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("N/A".into(), |x| format!("{x:.0}"))
}

pub fn run(cx: &Run) -> Result<()> {
    let smi_out = Cmd::new("nvidia-smi")
        .args(["-q", "-x"])
        .quiet()
        .timeout(Duration::from_secs(60))
        .log(cx.reports().join("preflight/nvidia-smi.xml"))
        .run()
        .map_err(|_| {
            CannotRun("no GPU here: nvidia-smi not found (no NVIDIA driver); run preflight on the GPU machine".into())
        })?;
    if !smi_out.success() {
        return Err(CannotRun(format!("nvidia-smi -q -x failed: {}", smi_out.tail())).into());
    }
    // The GPU CUDA opens (FA_DEVICE, CUDA_VISIBLE_DEVICES) is the one every reading describes.
    let driver = drivers::binary(cx, "fa-test");
    let info = driver
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|d| drivers::device_info(d, &cx.kernels, cx.device.as_deref(), None));
    let mut smi = smi::parse(&smi_out.stdout)?;
    let uuid = info.as_ref().ok().and_then(|d| d.uuid.clone());
    if let Some(uuid) = &uuid {
        smi = smi.only(uuid)?;
    }
    let cc = Cmd::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .args(uuid.iter().map(|u| format!("--id={u}")))
        .quiet()
        .timeout(Duration::from_secs(60))
        .run()
        .ok()
        .filter(|o| o.success())
        .and_then(|o| o.stdout.lines().next().map(|l| l.trim().to_string()));
    let manifest = Manifest::load(&cx.manifest())?;
    let nvcc = toolchain::nvcc(&cx.cuda_wheels).ok();
    let mut checks = static_checks(&smi, cc.as_deref(), nvcc.as_ref().map(|n| n.version.as_str()), &manifest);

    // Dynamic checks: the fatbins load, ncu reads counters, compute-sanitizer runs.
    // ncu only matters to `profile`, so a problem there warns rather than fails.
    let mut add = |name: &str, status, detail: String| checks.push(Check { name: name.into(), status, detail });
    match (&driver, &info) {
        (Ok(_), Ok(d)) => {
            add("kernels load", Status::Ok, format!("{} SMs, fatbins from {}", d.sm_count, cx.kernels.display()))
        }
        (Ok(_), Err(e)) => add("kernels load", Status::Fail, format!("{e:#}; run `cargo xtask build`")),
        (Err(e), _) => add("kernels load", Status::Fail, format!("{e:#}")),
    }
    let smoke = |tool: &std::path::Path, pre: &[&str]| {
        let d = driver.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        smoke_command(cx, tool, pre, d).run()
    };
    match toolchain::cuda_tool("ncu") {
        Ok(ncu) => match smoke(&ncu, &["--csv", "--metrics", "gpu__time_duration.sum", "-c", "1"]) {
            Ok(out) => {
                let text = format!("{}{}", out.stdout, out.stderr);
                if text.contains("ERR_NVGPUCTRPERM") {
                    add("ncu counters", Status::Warn, COUNTER_PERMISSION_HINT.into());
                } else if text.contains("gpu__time_duration.sum") && out.success() {
                    add("ncu counters", Status::Ok, ncu.display().to_string());
                } else {
                    add("ncu counters", Status::Warn, format!("ncu ran but profiled nothing: {}", out.tail()));
                }
            }
            Err(e) => add("ncu counters", Status::Warn, format!("{e:#}")),
        },
        Err(e) => add("ncu counters", Status::Warn, format!("{e:#}")),
    }
    match toolchain::cuda_tool("compute-sanitizer") {
        Ok(cs) => match smoke(&cs, &["--tool", "memcheck"]) {
            Ok(out) => match sanitizer::parse_summary(&format!("{}{}", out.stdout, out.stderr)) {
                Some(s) if s.errors == 0 => add("compute-sanitizer", Status::Ok, cs.display().to_string()),
                Some(s) => {
                    add("compute-sanitizer", Status::Fail, format!("memcheck smoke run found {} error(s)", s.errors))
                }
                None => add("compute-sanitizer", Status::Fail, format!("no summary: {}", out.tail())),
            },
            Err(e) => add("compute-sanitizer", Status::Fail, format!("{e:#}")),
        },
        Err(e) => add("compute-sanitizer", Status::Fail, format!("{e:#}")),
    }

    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| vec![c.name.clone(), format!("{:?}", c.status).to_uppercase(), c.detail.clone()])
        .collect();
    let text = table::render(&["check", "status", "detail"], &rows);
    crate::tools::process::table(&cx.reports().join("preflight.txt"), &text)?;
    if !crate::tools::process::detail() {
        // Inside `check`: only what is not OK, in full.
        for c in checks.iter().filter(|c| c.status != Status::Ok) {
            println!("preflight: {:?} {}: {}", c.status, c.name, c.detail);
        }
    }
    let device = info.as_ref().ok().map(Device::from);
    let toolchain = Toolchain {
        nvcc: nvcc.as_ref().map(|n| n.version.clone()),
        nvcc_path: nvcc.as_ref().map(|n| n.path.display().to_string()),
        driver: smi.driver_version.clone(),
    };
    let failed: Vec<String> = checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.clone()).collect();
    let report = cx.report("preflight");
    Envelope::new(
        "preflight",
        crate::tools::process::git_state(&cx.root),
        toolchain,
        device,
        &PreflightPayload { smi, compute_capability: cc, checks },
    )
    .kernels(crate::compile::kernel_set::reported(&cx.kernels))
    .write(&report)?;
    println!("report: {}", report.display());
    if !failed.is_empty() {
        return Err(CheckFailed(format!("not ready: {}", failed.join(", "))).into());
    }
    Ok(())
}

/// fa-test's smoke set under `tool` (ncu, compute-sanitizer). Its JSON goes to
/// a file of the run's reports: fa-test replaces its output by rename, so it
/// refuses a device such as /dev/null.
fn smoke_command(cx: &Run, tool: &std::path::Path, pre: &[&str], driver: &std::path::Path) -> Cmd {
    let tool_name = tool.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let json = cx.reports().join(format!("preflight-{tool_name}-smoke.json"));
    let cmd = Cmd::new(tool)
        .args(pre.iter().copied())
        .arg(driver.display().to_string())
        .args(["--set", "smoke", "--json"])
        .arg(json.display().to_string())
        .quiet()
        .timeout(Duration::from_secs(180));
    drivers::aim(cmd, &cx.kernels, cx.device.as_deref())
}

#[cfg(test)]
mod tests {
    #[test]
    fn smoke_runs_write_their_json_to_a_regular_file_of_the_reports() {
        let cx = Run::discover().unwrap();
        let cmd = smoke_command(&cx, std::path::Path::new("/usr/bin/ncu"), &["--csv"], std::path::Path::new("fa-test"));
        let shown = cmd.display();
        let json = shown.split(" --json ").nth(1).and_then(|r| r.split(' ').next()).unwrap();
        assert_eq!(std::path::Path::new(json), cx.reports().join("preflight-ncu-smoke.json"), "{shown}");
    }

    use super::*;

    fn manifest() -> Manifest {
        Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap()
    }

    fn status(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|c| c.name == name).unwrap().status
    }

    #[test]
    fn h200_capture_is_ready() {
        let smi = smi::parse(include_str!("../../tests/data/h200/nvidia-smi-q-x.xml")).unwrap();
        let checks = static_checks(&smi, Some("9.0"), Some("13.0.88"), &manifest());
        assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:#?}");
        assert!(checks[1].detail.contains("sm_90a"));
    }

    #[test]
    fn newer_nvcc_unknown_arch_throttling_and_busy() {
        let mut smi = smi::parse(include_str!("../../tests/data/h200/nvidia-smi-q-x.xml")).unwrap();
        smi.gpus[0].active_clock_reasons = vec!["sw_thermal_slowdown".into()];
        smi.gpus[0].processes.push(smi::Process { pid: Some(7), name: "python3".into(), used_memory_mib: Some(512.0) });
        // Turing (7.5) is older than every build, sm_80's PTX included.
        let checks = static_checks(&smi, Some("7.5"), Some("13.1.20"), &manifest());
        assert_eq!(status(&checks, "arch"), Status::Fail);
        assert_eq!(status(&checks, "nvcc vs driver"), Status::Fail);
        assert_eq!(status(&checks, "clocks"), Status::Warn);
        assert_eq!(status(&checks, "other processes"), Status::Warn);
        assert!(checks.iter().find(|c| c.name == "nvcc vs driver").unwrap().detail.contains("13.1.20 is newer"));
    }
}
