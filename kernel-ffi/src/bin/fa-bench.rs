//! Times the attention kernels on a shape set and writes JSON for `cargo xtask bench`.
//!
//! Method per case: warm up; estimate one call's GPU time (batches of ten warm calls
//! queued behind memsets, so launch cost does not pick the method; ci/bench_torch.py
//! does the same for PyTorch); if it is short (< --graph-below-us),
//! capture a CUDA graph of many calls and time replays back to back (per-call time,
//! no launch gaps, L2-warm: such shapes fit in L2 anyway); otherwise flush L2 with a
//! memset before every timed call, queued ahead of the start event so the event is
//! not delayed by the CPU. Batches of samples until the median is pinned down
//! (--target-spread) or the per-case time budget runs out.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use kernel_ffi::bench::{self, Shape};
use kernel_ffi::rng::Rng;
use kernel_ffi::schema::{BenchCase, BenchRun, ShapeRecord};
use kernel_ffi::{Attention, Desc, Dtype, Entry, Layout, Options, Splits, Tensor};

#[derive(Parser)]
#[command(about = "Time the FlashAttention kernels")]
struct Args {
    /// Shapes B,H,S,D[,causal]; repeatable. Default: the default set.
    #[arg(long = "shape", value_parser = Shape::parse)]
    shapes: Vec<Shape>,
    /// f16, bf16 or both (comma-separated).
    #[arg(long, default_value = "f16", value_delimiter = ',')]
    dtype: Vec<String>,
    /// Key splits: auto or a count (1 = unsplit).
    #[arg(long, default_value = "auto")]
    splits: Splits,
    #[command(flatten)]
    entry: Entry,
    /// Time budget per case in milliseconds.
    #[arg(long, default_value_t = 3000)]
    budget_ms: u64,
    /// Stop when IQR/median/√n falls under this.
    #[arg(long, default_value_t = 0.001)]
    target_spread: f64,
    #[arg(long, default_value_t = 30)]
    min_samples: usize,
    /// Calls shorter than this are timed by CUDA-graph replay.
    #[arg(long, default_value_t = 30.0)]
    graph_below_us: f64,
    /// Run each case only this many times, untimed (for ncu: one profiled launch per case).
    #[arg(long)]
    launches_only: Option<usize>,
    /// Write JSON here (else stdout).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    kernel_ffi::cli::finish(run())
}

fn run() -> Result<()> {
    let args = Args::parse();
    let shapes = if args.shapes.is_empty() { bench::default_shapes() } else { args.shapes.clone() };
    let dtypes: Vec<Dtype> = args
        .dtype
        .iter()
        .map(|d| match d.as_str() {
            "f16" => Ok(Dtype::F16),
            "bf16" => Ok(Dtype::Bf16),
            other => bail!("unknown dtype `{other}`; use f16 or bf16"),
        })
        .collect::<Result<_>>()?;
    let att = Attention::new(0).context("setting up the kernels")?;
    let sm_count = att.device().sm_count;
    eprintln!("fa-bench: {} on {} ({sm_count} SMs)", shapes.len() * dtypes.len(), att.device().name);
    // 256 MiB: several times any L2 (50-60 MB on H100/H200, 48 MB on L4).
    let mut flush = att.stream().alloc_zeros::<u8>(256 << 20)?;
    let mut cases = Vec::new();
    for &dtype in &dtypes {
        for shape in &shapes {
            let case = bench_case(&att, &args, dtype, shape, &mut flush)
                .with_context(|| format!("benchmarking {}", shape.name(dtype)))?;
            if let Some(c) = case {
                eprintln!(
                    "{:<28} {:>10.2} us  [{:.2}, {:.2}]  {:>7.1} TFLOP/s  n={:<4} {} splits={} {} m{} kg{}{}",
                    c.name,
                    c.median_us,
                    c.q1_us,
                    c.q3_us,
                    c.tflops,
                    c.samples,
                    c.method,
                    c.num_splits,
                    c.entry.variant,
                    c.entry.block_m,
                    c.entry.key_groups,
                    if c.entry.persistent { " persistent" } else { "" }
                );
                cases.push(c);
            }
        }
    }
    if args.launches_only.is_some() {
        return Ok(());
    }
    let run = BenchRun { device: att.device().clone(), implementation: "fa".into(), cases };
    let text = serde_json::to_string_pretty(&run)?;
    match &args.json {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}

fn random_tensor(att: &Attention, dtype: Dtype, desc: Desc, seed: u64) -> Result<Tensor> {
    Ok(att.upload(dtype, desc, &Rng::new(seed).bits(dtype, desc.span(), -1.0, 1.0))?)
}

fn bench_case(
    att: &Attention,
    args: &Args,
    dtype: Dtype,
    shape: &Shape,
    flush: &mut CudaSlice<u8>,
) -> Result<Option<BenchCase>> {
    let desc = Desc::new([shape.batch, shape.heads, shape.seqlen, shape.head_dim], Layout::Bhsd);
    let q = random_tensor(att, dtype, desc, 1)?;
    let k = random_tensor(att, dtype, desc, 2)?;
    let v = random_tensor(att, dtype, desc, 3)?;
    let mut out = att.alloc_poisoned(dtype, desc)?;
    let opts = Options { causal: shape.causal, scale: None, splits: args.splits, entry: args.entry };
    let s = att.stream();
    let call = |out: &mut Tensor| att.forward(&q, &k, &v, out, None, &opts);
    let launched = call(&mut out)?;
    att.synchronize()?;
    if let Some(n) = args.launches_only {
        for _ in 1..n {
            call(&mut out)?;
        }
        att.synchronize()?;
        return Ok(None);
    }
    let ev = || att.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let elapsed_us = |a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent| -> Result<f64> {
        Ok(f64::from(a.elapsed_ms(b)?) * 1e3)
    };

    // The estimate that picks the method: the median of three batches of ten calls,
    // each queued behind ~1 GB of memsets and a warm-up call, so that neither the
    // CPU's launch cost nor the cold first call moves it (a case near
    // --graph-below-us must not flip methods between processes).
    let mut batches = Vec::new();
    for _ in 0..3 {
        let (e0, e1) = (ev()?, ev()?);
        for _ in 0..4 {
            s.memset_zeros(flush)?;
        }
        call(&mut out)?;
        e0.record(s)?;
        for _ in 0..10 {
            call(&mut out)?;
        }
        e1.record(s)?;
        att.synchronize()?;
        batches.push(elapsed_us(&e0, &e1)? / 10.0);
    }
    let estimate = bench::stats(&batches).median;

    let budget = Duration::from_millis(args.budget_ms);
    let start = Instant::now();
    let mut samples = Vec::new();
    let method;
    if estimate < args.graph_below_us {
        method = "graph-replay";
        let per_graph = ((200.0 / estimate.max(0.5)) as usize).clamp(10, 200);
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        for _ in 0..per_graph {
            call(&mut out)?;
        }
        let graph = s.end_capture(CUgraphInstantiate_flags(0))?.context("the capture recorded no work")?;
        graph.launch()?; // warm the graph
        while !bench::converged(&samples, args.min_samples, args.target_spread) && start.elapsed() < budget {
            let events: Vec<_> = (0..21).map(|_| ev()).collect::<Result<_, _>>()?;
            events[0].record(s)?;
            for e in &events[1..] {
                graph.launch()?;
                e.record(s)?;
            }
            att.synchronize()?;
            for w in events.windows(2) {
                samples.push(elapsed_us(&w[0], &w[1])? / per_graph as f64);
            }
        }
    } else {
        method = "events-cold-l2";
        while !bench::converged(&samples, args.min_samples, args.target_spread) && start.elapsed() < budget {
            let pairs: Vec<_> =
                (0..10).map(|_| Ok::<_, cudarc::driver::DriverError>((ev()?, ev()?))).collect::<Result<_, _>>()?;
            for (a, b) in &pairs {
                s.memset_zeros(flush)?; // evicts L2 and keeps the GPU busy while we enqueue
                a.record(s)?;
                call(&mut out)?;
                b.record(s)?;
            }
            att.synchronize()?;
            for (a, b) in &pairs {
                samples.push(elapsed_us(a, b)?);
            }
        }
    }
    let st = bench::stats(&samples);
    Ok(Some(BenchCase {
        name: shape.name(dtype),
        dtype: dtype.name().into(),
        shape: ShapeRecord {
            batch: shape.batch,
            heads: shape.heads,
            kv_heads: shape.heads,
            seqlen_q: shape.seqlen,
            seqlen_k: shape.seqlen,
            head_dim: shape.head_dim,
            causal: shape.causal,
        },
        method: method.into(),
        samples: samples.len(),
        median_us: st.median,
        q1_us: st.q1,
        q3_us: st.q3,
        min_us: st.min,
        mean_us: st.mean,
        rel_stdev: st.rel_stdev,
        tflops: shape.flops() / (st.median * 1e-6) / 1e12,
        ctas: launched.ctas,
        num_splits: launched.num_splits,
        entry: launched.entry_record(),
    }))
}
