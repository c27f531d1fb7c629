//! JSON the kernel-ffi binaries write and xtask reads: writer and reader share
//! one definition. Pure serde.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: String,
    pub sm_count: u32,
    pub driver: Option<String>,
    /// NVML's form, `GPU-xxxxxxxx-…`: what monitoring looks the device up by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// The problem a case ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ShapeRecord {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// FlashAttention's `window_size` (−1: unbounded), where the case had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<[i64; 2]>,
    /// The logit softcap, where the case had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
}

/// The kernel entry that ran a case; every field is absent (its default) where
/// nothing was launched, in other implementations' reports and in older ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryRecord {
    /// The `extern "C"` entry launched (empty where nothing was, and in
    /// reports from before it was recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel: String,
    /// `portable` or `hopper`.
    #[serde(default)]
    pub variant: String,
    /// Query rows per CTA.
    #[serde(default)]
    pub block_m: u32,
    /// Key groups per CTA.
    #[serde(default)]
    pub key_groups: u32,
    /// Whether its CTAs were persistent.
    #[serde(default)]
    pub persistent: bool,
}

/// `fa-bench --serve`: one JSON request a line on stdin, one reply a line on
/// stdout. The paired gate drives a base and a candidate server turn by turn.
pub const SERVE_PROTOCOL: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ServeRequest {
    /// Allocate and warm one case (replacing the last). `method` forces the
    /// timing method (the gate gives the candidate the base's); else it is
    /// chosen from the estimated call time and whether the data fits in L2.
    Setup {
        shape: String,
        dtype: String,
        method: Option<String>,
    },
    /// One half of a quad: `launches` calls with L2 flushed before each (events)
    /// or before the graph of them (graph replay); `probe` also reads the SM clock after.
    Time {
        launches: usize,
        probe: bool,
    },
    Quit,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServeReply {
    /// First line, before any request.
    Hello {
        protocol: u32,
        device: DeviceInfo,
        default_shapes: Vec<String>,
    },
    /// `estimate_us`: one call's time by the chosen method, from a short calibration.
    Ready {
        name: String,
        method: String,
        estimate_us: f64,
        flops: f64,
        entry: EntryRecord,
        num_splits: u32,
        ctas: u64,
    },
    /// Mean µs per call over the half, and the SM clock right after it when probed.
    Timed {
        us: f64,
        sm_mhz: Option<f64>,
    },
    Error {
        message: String,
    },
}

/// Output of `fa-test`: one correctness case each.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRun {
    pub device: DeviceInfo,
    /// Seed of the run's random inputs, to reproduce it (`fa-test --seed`).
    pub seed: u64,
    /// Seconds from the process's start to its first case: opening the GPU and
    /// loading the kernels.
    #[serde(default)]
    pub setup_s: f64,
    pub cases: Vec<TestCase>,
    /// Cases asked for that this GPU's kernel set does not run, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedCase>,
}

/// `fa-test --worker`: after its set-up, one line saying it is ready; then, for
/// each case name read on stdin (one a line), one reply a line on stdout; it
/// ends at the end of its input, or after a case whose CUDA error lost its
/// context (`last`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum WorkerReply {
    Ready {
        device: DeviceInfo,
        seed: u64,
        setup_s: f64,
    },
    Ran {
        case: Box<TestCase>,
        last: bool,
    },
    Skipped {
        case: SkippedCase,
    },
    /// A name the matrix does not have.
    Unknown {
        name: String,
    },
}

/// A case fa-test was asked for but does not run here (an entry this kernel
/// set lacks, a Hopper case off sm_90), and why: neither passed nor failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedCase {
    pub name: String,
    pub why: String,
}

/// A case as `fa-test --list --json` names it, with its work (batch × heads ×
/// query rows × keys × head dim) to deal cases out longest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedCase {
    pub name: String,
    pub work: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TestCase {
    pub name: String,
    /// UUID of the GPU that ran the case, where a run spread cases over several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    pub dtype: String,
    #[serde(flatten)]
    pub shape: ShapeRecord,
    pub layout: String,
    #[serde(flatten)]
    pub entry: EntryRecord,
    /// Requested: `auto` or a fixed count.
    pub splits: String,
    /// Launched.
    pub num_splits: u32,
    pub lse: bool,
    /// `cpu-f64` or `gpu-f32`.
    pub reference: String,
    /// Relative L2 error of the output. NaN (JSON null) when the case could
    /// not run, infinite when the output was not finite.
    #[serde(with = "non_finite_as_null")]
    pub rel_l2: f64,
    #[serde(with = "non_finite_as_null")]
    pub max_abs: f64,
    /// Largest LSE difference over rows with a finite reference LSE.
    #[serde(with = "non_finite_as_null")]
    pub lse_max_abs: f64,
    pub tol_rel_l2: f64,
    /// The bounds of max_abs and lse_max_abs: the dtype's, or for e4m3 inputs
    /// the widest row's, which adds the error of its scores (fa-test: a row's
    /// bound grows with its largest scale·Σ|q·k|).
    pub tol_max_abs: f64,
    pub tol_lse: f64,
    /// Elements that came back NaN/Inf (poison not overwritten, or a blow-up).
    pub non_finite: usize,
    pub passed: bool,
    /// Set when the case could not run at all (launch or validation error).
    pub error: Option<String>,
    /// Wall seconds of the case: inputs, launch, reference and comparison.
    #[serde(default)]
    pub seconds: f64,
}

/// JSON has no NaN or infinity: write them as null, read null back as NaN.
mod non_finite_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() { s.serialize_f64(*x) } else { s.serialize_none() }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// Output of `fa-bench` (and of `ci/bench_torch.py`, which writes the same schema).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRun {
    pub device: DeviceInfo,
    /// `fa` for this project's kernels, `torch-<backend>` for the PyTorch script.
    pub implementation: String,
    pub cases: Vec<BenchCase>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchCase {
    /// e.g. `f16-b4h16s2048d64-causal`; the key comparisons join on.
    pub name: String,
    pub dtype: String,
    #[serde(flatten)]
    pub shape: ShapeRecord,
    /// `events-cold-l2` (L2 flushed before each timed launch, flush queued ahead of
    /// the start event) or `graph-replay` (a CUDA graph of many calls, per-call time).
    pub method: String,
    pub samples: usize,
    pub median_us: f64,
    pub q1_us: f64,
    pub q3_us: f64,
    pub min_us: f64,
    pub mean_us: f64,
    /// Standard deviation over mean.
    pub rel_stdev: f64,
    pub tflops: f64,
    /// Serving shapes: bytes of K and V read per second, in TB/s (a decode
    /// call's roofline is the GPU's memory bandwidth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_tbps: Option<f64>,
    /// CTAs of the attention kernel per call (0 for other implementations).
    pub ctas: u64,
    pub num_splits: u32,
    #[serde(flatten)]
    pub entry: EntryRecord,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_case_round_trips_through_json() {
        let case = TestCase {
            name: "x".into(),
            gpu: None,
            dtype: "f16".into(),
            shape: ShapeRecord {
                batch: 1,
                heads: 1,
                kv_heads: 1,
                seqlen_q: 1,
                seqlen_k: 1,
                head_dim: 64,
                causal: false,
                window: Some([128, 0]),
                softcap: Some(50.0),
            },
            layout: "bhsd".into(),
            entry: EntryRecord {
                kernel: "flash_fwd_hopper_f16_d64_m64".into(),
                variant: "hopper".into(),
                block_m: 64,
                key_groups: 1,
                persistent: true,
            },
            splits: "1".into(),
            num_splits: 0,
            lse: false,
            reference: String::new(),
            rel_l2: f64::NAN,
            max_abs: f64::INFINITY,
            lse_max_abs: 0.5,
            tol_rel_l2: 0.0,
            tol_max_abs: 0.0,
            tol_lse: 0.0,
            non_finite: 0,
            passed: false,
            error: Some("CUDA error".into()),
            seconds: 0.25,
        };
        let text = serde_json::to_string(&case).unwrap();
        assert!(text.contains("\"rel_l2\":null"), "{text}");
        let back: TestCase = serde_json::from_str(&text).unwrap();
        assert!(back.rel_l2.is_nan() && back.max_abs.is_nan());
        assert_eq!(back.lse_max_abs, 0.5);
        // The entry's fields sit at the top level, as before they were grouped.
        assert!(text.contains("\"block_m\":64,\"key_groups\":1"), "{text}");
        assert_eq!(back.entry, case.entry);
        assert_eq!(back.seconds, 0.25);
        // A run written before cases were timed or skips recorded still reads.
        let old = serde_json::json!({"device": {"name": "g", "compute_capability": "9.0", "sm_count": 1,
            "driver": null}, "seed": 1, "cases": [serde_json::from_str::<serde_json::Value>(&text).unwrap()]});
        let mut old_case = old.clone();
        old_case["cases"][0].as_object_mut().unwrap().remove("seconds");
        let run: TestRun = serde_json::from_value(old_case).unwrap();
        assert_eq!((run.setup_s, run.cases[0].seconds, run.skipped.len()), (0.0, 0.0, 0));
    }

    #[test]
    fn bench_case_without_entry_fields_reads_with_defaults() {
        // What ci/bench_torch.py writes: no kernel entry.
        let text = r#"{"name": "f16-b1h1s128d64", "dtype": "f16", "batch": 1, "heads": 1, "kv_heads": 1,
            "seqlen_q": 128, "seqlen_k": 128, "head_dim": 64, "causal": false, "method": "graph-replay",
            "samples": 30, "median_us": 5.6, "q1_us": 5.5, "q3_us": 5.7, "min_us": 5.4, "mean_us": 5.6,
            "rel_stdev": 0.01, "tflops": 0.7, "ctas": 0, "num_splits": 1}"#;
        let case: BenchCase = serde_json::from_str(text).unwrap();
        assert_eq!(case.entry, EntryRecord::default());
        assert_eq!((case.shape.seqlen_k, case.shape.causal), (128, false));
        assert_eq!(case.median_us, 5.6);
    }
}
