//! `cargo xtask tune`: sweep tile configurations (warps per CTA, keys per tile) of
//! the forward kernel per head dim. Each config is compiled with its defines and
//! matching launch geometry; configs over the resource budgets are rejected from
//! the ptxas report without running; the rest must pass the covering correctness
//! set, then are timed. A config that hangs is killed at its timeout, recorded,
//! and the sweep goes on. `--apply` writes the winners into kernels/manifest.json,
//! where the build and the launcher pick them up.
//!
//! With `--gpus`, the builds and correctness runs are dealt out to one worker per
//! GPU; the timings then run one config after another on the first of those
//! GPUs, with nothing else running, because the ranking compares configs and
//! timings from two GPUs (or taken beside a build) are not comparable.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::compile;
use crate::errors::CheckFailed;
use crate::report::{Device, Envelope, Toolchain, read_json};
use crate::run::Run;
use crate::table;
use crate::tools::deal::deal;
use crate::tools::drivers;
use crate::tools::gpu::GpuSpec;
use crate::tools::gpu::ListedGpu;
use crate::tools::process::{Cmd, write_file};
use crate::tools::progress::Progress;
use fa_schema::manifest::{Launch, Manifest, is_hopper_entry};
use fa_schema::schema::{BenchRun, TestRun};

pub struct Options {
    pub apply: bool,
    pub build_timeout: Duration,
    pub jobs: usize,
    /// Per-config limit for the correctness run and for the bench run.
    pub config_timeout: Duration,
    pub budget_ms: u64,
    /// `--gpus all|N|LIST`: build and test on every GPU named, time on the first.
    pub gpus: Option<GpuSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub head_dim: u32,
    pub warps: u32,
    pub block_n: u32,
}

impl Config {
    pub fn name(&self) -> String {
        format!("d{}-w{}-n{}", self.head_dim, self.warps, self.block_n)
    }

    /// Query rows per CTA for an entry with `row_tiles` 16-row tiles per warp.
    fn block_m(&self, row_tiles: u32) -> u32 {
        16 * self.warps * row_tiles
    }

    /// Per key group a Q tile of `block_m` rows plus a K and a V tile, of 16-bit
    /// elements (FwdConfig::kSmemBytes).
    fn dynamic_smem(&self, block_m: u32, key_groups: u32) -> u32 {
        (block_m + 2 * self.block_n) * self.head_dim * 2 * key_groups
    }

    fn defines(&self) -> [String; 2] {
        [
            format!("FA_WARPS_D{}={}", self.head_dim, self.warps),
            format!("FA_BLOCK_N_D{}={}", self.head_dim, self.block_n),
        ]
    }

    /// The manifest with this configuration for its head dim: source defines and the
    /// launch geometry of every forward entry of that head dim. Row tiles per warp
    /// and key groups are the entry's own (fixed in its .cu
    /// instantiation): the old geometry's block_m / (16 × warps per group) and
    /// key_groups. Two-group entries keep their warps and rows (fixed in
    /// FwdConfig: two warps per group on 32 rows at D=64, four on 64 at D=128) and
    /// take only the key tile.
    pub fn apply_to(&self, manifest: &Manifest) -> Manifest {
        let mut m = manifest.clone();
        let prefixes = [format!("FA_WARPS_D{}=", self.head_dim), format!("FA_BLOCK_N_D{}=", self.head_dim)];
        let suffix = format!("_d{}", self.head_dim);
        // The portable kernel's 16-bit entries only: the Hopper kernel's tiles and
        // the e4m3 entries' are fixed in their headers (Fp8Config).
        let portable = |entry: &str| {
            entry.starts_with("flash_fwd_") && !is_hopper_entry(entry) && !entry.starts_with("flash_fwd_e4m3_")
        };
        for src in &mut m.sources {
            if !src.kernels.iter().any(|k| portable(&k.entry)) {
                continue;
            }
            src.defines.retain(|d| !prefixes.iter().any(|p| d.starts_with(p.as_str())));
            src.defines.extend(self.defines());
            for k in src.kernels.iter_mut().filter(|k| {
                portable(&k.entry) && (k.entry.ends_with(&suffix) || k.entry.contains(&format!("{suffix}_")))
            }) {
                let key_groups = k.launch.map_or(1, |l| l.key_groups.max(1));
                let (threads, block_m) = match k.launch {
                    Some(l) if key_groups > 1 => (l.threads, l.block_m),
                    _ => {
                        let group_warps = k.launch.map_or(1, |l| (l.threads / 32).max(1));
                        let row_tiles = k.launch.map_or(1, |l| (l.block_m / (16 * group_warps)).max(1));
                        (32 * self.warps, self.block_m(row_tiles))
                    }
                };
                k.launch = Some(Launch { threads, block_m, block_n: self.block_n, persistent: false, key_groups });
                k.dynamic_smem = self.dynamic_smem(block_m, key_groups);
            }
        }
        m
    }
}

pub fn sweep() -> Vec<Config> {
    let mut v = Vec::new();
    for head_dim in [64, 128] {
        for warps in [4, 8] {
            for block_n in [32, 64, 128] {
                v.push(Config { head_dim, warps, block_n });
            }
        }
    }
    v
}

/// Shapes each head dim is ranked on: the default bench set's shapes of that dim.
fn shapes(head_dim: u32) -> Vec<&'static str> {
    match head_dim {
        64 => vec!["1,1,128,64", "1,1,512,64", "2,8,512,64", "4,16,2048,64", "8,32,1024,64,causal"],
        _ => vec!["1,16,512,128", "4,16,2048,128", "2,16,8192,128,causal"],
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigResult {
    pub config: Config,
    /// `ok`, `over budget`, `build failed`, `incorrect`, `hung` or `failed`.
    pub status: String,
    pub detail: Option<String>,
    /// Shape → median µs.
    pub medians_us: BTreeMap<String, f64>,
    pub geomean_us: Option<f64>,
    /// UUID of the GPU its correctness run used, where `--gpus` named GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tested_on: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TunePayload {
    #[serde(alias = "variants")]
    pub configs: Vec<ConfigResult>,
    /// Head dim → winning configuration.
    pub winners: BTreeMap<u32, Config>,
    pub applied: bool,
}

fn geomean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = xs.collect();
    (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// Per head dim, the passing config with the lowest geometric-mean time.
pub fn winners(results: &[ConfigResult]) -> BTreeMap<u32, Config> {
    let mut best: BTreeMap<u32, (f64, Config)> = BTreeMap::new();
    for r in results.iter().filter(|r| r.status == "ok") {
        let Some(g) = r.geomean_us else { continue };
        let d = r.config.head_dim;
        if best.get(&d).is_none_or(|(b, _)| g < *b) {
            best.insert(d, (g, r.config));
        }
    }
    best.into_iter().map(|(d, (_, c))| (d, c)).collect()
}

pub fn run(cx: &Run, opts: &Options) -> Result<()> {
    crate::tools::gpu::require("tune")?;
    let manifest = Manifest::load(&cx.manifest())?;
    let fa_test = drivers::binary(cx, "fa-test")?;
    let fa_bench = drivers::binary(cx, "fa-bench")?;
    let gpus = crate::tools::gpu::workers(opts.gpus.as_ref(), cx.device.as_deref(), "tune")?;
    // The timing GPU (the first named), whose device the report records.
    let info = drivers::device_info(&fa_test, &cx.kernels, cx.device.as_deref(), gpus[0].as_ref())?;
    let arch = manifest
        .arch_for(&info.compute_capability)
        .with_context(|| format!("no manifest arch runs on compute capability {}", info.compute_capability))?;
    let dir = cx.reports().join("tune");
    let configs = sweep();
    let total = configs.len();
    let jobs = (opts.jobs / gpus.len()).max(1);
    let progress = Progress::bar("tune: build and test", total as u64);
    let dealt = deal(
        "config",
        &gpus,
        configs,
        |g| drivers::start_check(&fa_test, &cx.kernels, g),
        |_, i, &config, gpu| {
            progress.message(&config.name());
            let r = prepare(cx, opts, jobs, &manifest, &arch, config, &dir.join(config.name()), &fa_test, gpu);
            progress.report(&format!("tune [{}/{total}] {}: {}", i + 1, config.name(), r.status));
            Ok(r)
        },
        |what| progress.println(&format!("tune: {what}")),
    );
    drop(progress);
    let mut results: Vec<ConfigResult> = dealt.done.into_iter().map(|(_, r)| r).collect();
    for l in dealt.lost {
        results.push(ConfigResult { status: "failed".into(), detail: Some(l.why), ..ConfigResult::new(l.item) });
    }
    results.sort_by_key(|r| (r.config.head_dim, r.config.warps, r.config.block_n));
    let passing = results.iter().filter(|r| r.status == "ok").count() as u64;
    let progress = Progress::bar("tune: time", passing);
    for r in results.iter_mut().filter(|r| r.status == "ok") {
        progress.message(&r.config.name());
        time(cx, opts, r, &dir.join(r.config.name()), &fa_bench, gpus[0].as_ref());
        let geomean = r.geomean_us.map_or(String::new(), |g| format!(", geomean {g:.2} us"));
        progress.report(&format!("tune: {}: {}{geomean}", r.config.name(), r.status));
    }
    drop(progress);
    let winners = winners(&results);
    print_table(&results, &winners);
    if opts.apply && !winners.is_empty() {
        let mut m = manifest.clone();
        for c in winners.values() {
            m = c.apply_to(&m);
        }
        write_file(&cx.manifest(), serde_json::to_string_pretty(&m)? + "\n")?;
        println!("wrote the winners into {}", cx.manifest().display());
    }
    let payload = TunePayload { configs: results, winners, applied: opts.apply };
    let device = Device::from(&info);
    let report = cx.report("tune");
    Envelope::new(
        "tune",
        crate::tools::process::git_state(&cx.root),
        Toolchain { driver: info.driver.clone(), ..Toolchain::default() },
        Some(device),
        &payload,
    )
    .kernels(crate::compile::kernel_set::reported(&cx.kernels))
    .write(&report)?;
    println!("report: {}", report.display());
    if payload.winners.is_empty() {
        return Err(CheckFailed("no config passed".into()).into());
    }
    Ok(())
}

impl ConfigResult {
    fn new(config: Config) -> ConfigResult {
        ConfigResult {
            config,
            status: String::new(),
            detail: None,
            medians_us: BTreeMap::new(),
            geomean_us: None,
            tested_on: None,
        }
    }

    fn fail(&mut self, status: &str, e: anyhow::Error) {
        self.status = status.into();
        self.detail = Some(format!("{e:#}"));
    }

    /// A driver run that did not finish: hung at its timeout, or failed.
    fn fail_run(&mut self, e: anyhow::Error) {
        let status = if format!("{e:#}").contains("timed out") { "hung" } else { "failed" };
        self.fail(status, e);
    }
}

/// A config's build (for `arch` only, `jobs` nvcc at a time) and its
/// correctness run on `gpu`: status `ok` when both passed.
#[allow(clippy::too_many_arguments)]
fn prepare(
    cx: &Run,
    opts: &Options,
    jobs: usize,
    manifest: &Manifest,
    arch: &str,
    config: Config,
    dir: &Path,
    fa_test: &Path,
    gpu: Option<&ListedGpu>,
) -> ConfigResult {
    let mut result = ConfigResult { tested_on: gpu.map(|g| g.uuid.clone()), ..ConfigResult::new(config) };
    let config_manifest = dir.join("manifest.json");
    let written = serde_json::to_string_pretty(&config.apply_to(manifest))
        .map_err(anyhow::Error::from)
        .and_then(|t| write_file(&config_manifest, t));
    if let Err(e) = written {
        result.fail("failed", e);
        return result;
    }
    let built = compile::run(
        cx,
        &compile::Options {
            manifest: Some(config_manifest),
            src_dir: Some(cx.root.join("kernels")),
            archs: Some(vec![arch.to_string()]),
            out_dir: Some(dir.join("kernels")),
            report: format!("tune/{}/build", config.name()),
            ..compile::Options::new(opts.build_timeout, jobs)
        },
    );
    if let Err(e) = built {
        result.fail(if compile::over_budget(&e) { "over budget" } else { "build failed" }, e);
        return result;
    }
    // Correctness on the covering set, this head dim only.
    let test_json = dir.join("fa-test.json");
    let cmd = Cmd::new(fa_test)
        // `--filter=…`: the value starts with '-'.
        .args(["--set", "sanitize", "--variant", "portable", &format!("--filter=-d{}-", config.head_dim), "--json"])
        .arg(test_json.display().to_string())
        .timeout(opts.config_timeout)
        .log(dir.join("fa-test.log"))
        .quiet();
    match drivers::on_gpu(drivers::aim(cmd, &dir.join("kernels"), cx.device.as_deref()), gpu).run() {
        Err(e) => result.fail_run(e),
        Ok(_) => match read_json::<TestRun>(&test_json) {
            Ok(run) if !run.cases.is_empty() && run.cases.iter().all(|c| c.passed) => result.status = "ok".into(),
            Ok(run) => {
                let bad = run.cases.iter().filter(|c| !c.passed).count();
                result.fail("incorrect", anyhow::anyhow!("{bad} of {} cases failed", run.cases.len()));
            }
            Err(e) => result.fail("failed", e),
        },
    }
    result
}

/// Times a prepared config on `gpu`: its medians per shape and their geometric mean.
fn time(cx: &Run, opts: &Options, result: &mut ConfigResult, dir: &Path, fa_bench: &Path, gpu: Option<&ListedGpu>) {
    let bench_json = dir.join("fa-bench.json");
    let cmd = Cmd::new(fa_bench)
        .args(["--variant", "portable", "--budget-ms", &opts.budget_ms.to_string(), "--json"])
        .arg(bench_json.display().to_string())
        .timeout(opts.config_timeout)
        .log(dir.join("fa-bench.log"))
        .quiet();
    let mut cmd = drivers::aim(cmd, &dir.join("kernels"), cx.device.as_deref());
    for s in shapes(result.config.head_dim) {
        cmd = cmd.arg("--shape").arg(s);
    }
    match drivers::on_gpu(cmd, gpu).run() {
        Err(e) => result.fail_run(e),
        Ok(out) if !out.success() => result.fail("failed", anyhow::anyhow!("{}", out.tail())),
        Ok(_) => match read_json::<BenchRun>(&bench_json) {
            Ok(b) => {
                result.medians_us = b.cases.iter().map(|c| (c.name.clone(), c.median_us)).collect();
                result.geomean_us = geomean(result.medians_us.values().copied());
            }
            Err(e) => result.fail("failed", e),
        },
    }
}

fn print_table(results: &[ConfigResult], winners: &BTreeMap<u32, Config>) {
    let shapes: Vec<String> = {
        let mut s: Vec<String> = results.iter().flat_map(|r| r.medians_us.keys().cloned()).collect();
        s.sort();
        s.dedup();
        s
    };
    let mut header = vec!["config".to_string(), "status".to_string(), "geomean us".to_string()];
    header.extend(shapes.iter().cloned());
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let win = winners.get(&r.config.head_dim) == Some(&r.config);
            let mut row = vec![
                format!("{}{}", r.config.name(), if win { " *" } else { "" }),
                r.status.clone(),
                r.geomean_us.map_or("-".into(), |g| format!("{g:.2}")),
            ];
            row.extend(shapes.iter().map(|s| r.medians_us.get(s).map_or("-".into(), |m| format!("{m:.2}"))));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    println!("{}", table::render(&header, &rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_rewrites_only_its_head_dim() {
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let c = Config { head_dim: 128, warps: 8, block_n: 32 };
        let t = c.apply_to(&m);
        let fwd = t.sources.iter().find(|s| s.file == "flash_fwd_f16.cu").unwrap();
        assert!(fwd.defines.contains(&"FA_WARPS_D128=8".to_string()));
        assert!(fwd.defines.contains(&"FA_BLOCK_N_D128=32".to_string()));
        for k in &fwd.kernels {
            let l = k.launch.unwrap();
            if !k.entry.starts_with("flash_fwd_") {
                assert_eq!(l.block_n, 0, "{} is not a tiled kernel", k.entry);
            } else if k.entry.contains("_d128") {
                if k.entry.ends_with("_kg2") {
                    // Two groups of four warps on 64 rows whatever the warps.
                    assert_eq!(
                        (l.threads, l.block_m, l.block_n, l.key_groups, k.dynamic_smem),
                        (256, 64, 32, 2, 2 * (64 + 64) * 128 * 2)
                    );
                    continue;
                }
                // 16 rows × 8 warps × the entry's row tiles (two, but one in the _m64, _varlen and _local entries).
                let one = k.entry.ends_with("_m64") || k.entry.contains("_varlen_") || k.entry.contains("_local");
                let rows = if one { 128 } else { 256 };
                assert_eq!((l.threads, l.block_m, l.block_n, k.dynamic_smem), (256, rows, 32, (rows + 64) * 128 * 2));
            } else if k.entry.ends_with("_d64_kg2") {
                assert_eq!((l.threads, l.block_m, l.block_n), (128, 32, 64), "{} untouched", k.entry);
            } else {
                assert_eq!((l.threads, l.block_n), (128, 64), "{} untouched", k.entry);
            }
        }
        let reference = t.sources.iter().find(|s| s.file == "reference.cu").unwrap();
        assert!(reference.defines.is_empty(), "only forward sources get tile defines");
        // Applying again replaces, never duplicates.
        let again = Config { warps: 4, ..c }.apply_to(&t);
        let fwd = again.sources.iter().find(|s| s.file == "flash_fwd_f16.cu").unwrap();
        assert_eq!(fwd.defines.iter().filter(|d| d.starts_with("FA_WARPS_D128=")).count(), 1);
    }

    #[test]
    fn applying_the_shipped_configuration_changes_nothing() {
        // The committed manifest is what `tune --apply` wrote for its winners (4 warps,
        // 64 keys for both head dims): re-applying them must reproduce every entry's
        // geometry and shared memory, key groups included.
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let mut t = m.clone();
        for head_dim in [64, 128] {
            t = Config { head_dim, warps: 4, block_n: 64 }.apply_to(&t);
        }
        for (a, b) in m.sources.iter().zip(&t.sources) {
            let sorted = |d: &[String]| {
                let mut d = d.to_vec();
                d.sort();
                d
            };
            assert_eq!(sorted(&a.defines), sorted(&b.defines), "{}", a.file);
            for (x, y) in a.kernels.iter().zip(&b.kernels) {
                assert_eq!(serde_json::to_value(x).unwrap(), serde_json::to_value(y).unwrap(), "{}", x.entry);
            }
        }
    }

    #[test]
    fn entries_keep_their_row_tiles() {
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let t = Config { head_dim: 64, warps: 8, block_n: 32 }.apply_to(&m);
        let fwd = t.sources.iter().find(|s| s.file == "flash_fwd_f16.cu").unwrap();
        let geometry = |entry: &str| {
            let k = fwd.kernels.iter().find(|k| k.entry == entry).unwrap();
            (k.launch.unwrap().block_m, k.dynamic_smem)
        };
        // Two 16-row tiles per warp in the D=64 non-causal entry, one in its _m64 twin.
        assert_eq!(geometry("flash_fwd_f16_d64"), (256, (256 + 64) * 64 * 2));
        assert_eq!(geometry("flash_fwd_f16_d64_m64"), (128, (128 + 64) * 64 * 2));
        assert_eq!(geometry("flash_fwd_f16_d64_causal"), (128, (128 + 64) * 64 * 2));
        // The two-group entry keeps its 32 rows: (32 + 2 × 32) × 2 groups.
        assert_eq!(geometry("flash_fwd_f16_d64_kg2"), (32, 2 * (32 + 2 * 32) * 64 * 2));
    }

    #[test]
    fn winners_per_head_dim_skip_failed_configs() {
        let r = |d, w, status: &str, g| ConfigResult {
            status: status.into(),
            geomean_us: g,
            ..ConfigResult::new(Config { head_dim: d, warps: w, block_n: 64 })
        };
        let w = winners(&[
            r(64, 4, "ok", Some(10.0)),
            r(64, 8, "ok", Some(9.0)),
            r(128, 4, "ok", Some(20.0)),
            r(128, 8, "hung", None),
            r(64, 8, "incorrect", Some(1.0)),
        ]);
        assert_eq!(w[&64].warps, 8);
        assert_eq!(w[&128].warps, 4);
        assert_eq!(sweep().len(), 12);
    }
}
