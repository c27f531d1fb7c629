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
//!
//! `--serve` instead answers the paired gate's requests (schema::ServeRequest),
//! one JSON line each way, keeping its context and buffers between them.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice};
use kernel_ffi::bench::{self, Batching, Shape};
use kernel_ffi::manifest::Manifest;
use kernel_ffi::probe::Probes;
use kernel_ffi::rng::Rng;
use kernel_ffi::schema::{BenchCase, BenchRun, SERVE_PROTOCOL, ServeReply, ServeRequest, ShapeRecord};
use kernel_ffi::tensor::HEAD_DIMS;
use kernel_ffi::{
    Attention, Band, BlockTable, Desc, Dtype, KernelChoice, Launched, Layout, Options, Precision, Scores, Sequences,
    Splits, Tensor, Window, cli, kernel_dir, sequences,
};

#[derive(Parser)]
#[command(about = "Time the FlashAttention kernels", version = kernel_ffi::cli::VERSION)]
struct Args {
    /// GPU to run on: a CUDA ordinal among the visible devices, or a UUID as
    /// `nvidia-smi -L` prints it.
    #[arg(long, env = fa_schema::env::DEVICE, default_value = "0")]
    device: kernel_ffi::Gpu,
    /// Shapes as B,H,S,D[,causal], varlen:B,H,HKV,S,D[,causal] or paged:B,H,HKV,S,D,PAGE; repeatable. Default: the default set.
    #[arg(long = "shape", value_parser = Shape::parse, conflicts_with = "serve")]
    shapes: Vec<Shape>,
    /// f16, bf16 or e4m3, comma-separated (e4m3: bf16 out, descales of 1).
    #[arg(long, default_value = "f16", value_delimiter = ',', value_parser = Dtype::parse)]
    dtype: Vec<Dtype>,
    /// Key splits: auto or a count (1 = unsplit).
    #[arg(long, default_value = "auto")]
    splits: Splits,
    #[command(flatten)]
    choice: KernelChoice,
    /// Time budget per case in milliseconds (at least 1).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..))]
    budget_ms: u64,
    /// Stop when IQR/median/√n falls under this (a positive fraction).
    #[arg(long, default_value_t = 0.001, value_parser = positive)]
    target_spread: f64,
    /// Fewest samples per case before the spread may stop it.
    #[arg(long, default_value_t = 30)]
    min_samples: usize,
    /// Calls shorter than this many µs are timed by CUDA-graph replay (0: never).
    #[arg(long, default_value_t = 30.0, value_parser = non_negative)]
    graph_below_us: f64,
    /// Run each case only this many times, untimed (for ncu: one profiled launch per case).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with_all = ["serve", "json"])]
    launches_only: Option<u64>,
    /// Write JSON here (else stdout).
    #[arg(long, conflicts_with = "serve")]
    json: Option<std::path::PathBuf>,
    /// Answer the paired gate's requests on stdin/stdout instead of timing a set.
    #[arg(long)]
    serve: bool,
    /// With --serve: make every timed half this fraction slower (a spin kernel
    /// inside the half): the planted slowdown of `cargo xtask bench --self-test`.
    #[arg(long, default_value_t = 0.0, requires = "serve", value_parser = fraction)]
    plant_slowdown: f64,
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("`{s}` is not a number ≥ 0")),
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}`: expected a fraction in [0, 1)")),
    }
}

/// Refuses kernel choices that no compiled entry has, before any CUDA call: for every
/// shape and dtype to time, or, serving (shapes come later), for at least one.
fn check_choice(manifest: &Manifest, args: &Args, shapes: &[Shape]) -> Result<()> {
    if !args.serve {
        for &dtype in &args.dtype {
            for s in shapes.iter().filter(|s| s.takes(dtype)) {
                let scores = masking(s).scores(s.seqlen, s.seqlen)?;
                cli::check_choice(manifest, &args.choice, Precision::default_for(dtype), s.head_dim, scores)
                    .with_context(|| format!("--shape {}", s.spec()))?;
            }
        }
        return Ok(());
    }
    let mut first_err = None;
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for band in [Band::Full, Band::Causal] {
                match cli::check_choice(manifest, &args.choice, dtype, head_dim, Scores { band, softcap: None }) {
                    Ok(()) => return Ok(()),
                    Err(e) => first_err = first_err.or(Some(e)),
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e.context("--serve: no shape could run with these entry flags")),
        None => Ok(()),
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    let shapes = if args.shapes.is_empty() { bench::default_shapes() } else { args.shapes.clone() };
    let dtypes = args.dtype.clone();
    // Flags and shapes are checked (clap, and here against the manifest) before
    // the first CUDA call, `Attention::with_kernel_dir`.
    if let Some(path) = &args.json {
        fa_schema::file::check_target(path).context("--json")?;
    }
    let kernels = kernel_dir::find()?;
    let manifest_path = kernels.join("manifest.json");
    check_choice(&Manifest::load(&manifest_path)?, &args, &shapes)
        .with_context(|| format!("checking the flags against {}", manifest_path.display()))?;
    let att = Attention::with_kernel_dir(&args.device, &kernels).context("setting up the kernels")?;
    // 256 MiB: several times any L2 (50-60 MB on H100/H200, 48 MB on L4).
    let mut flush = att.stream().alloc_zeros::<u8>(256 << 20)?;
    if args.serve {
        return serve(&att, &args, &mut flush);
    }
    let sm_count = att.device().sm_count;
    let taken = dtypes.iter().map(|&d| shapes.iter().filter(|s| s.takes(d)).count()).sum::<usize>();
    eprintln!("fa-bench: {taken} on {} ({sm_count} SMs)", att.device().name);
    let mut cases = Vec::new();
    for &dtype in &dtypes {
        for shape in &shapes {
            if !shape.takes(dtype) {
                eprintln!("fa-bench: {} skipped: serving calls take 16-bit inputs", shape.name(dtype));
                continue;
            }
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
        Some(p) => cli::write_atomic(p, text.as_bytes()),
        None => cli::print(&format!("{text}\n")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    /// A CUDA graph of many calls, replayed back to back: short calls without launch gaps.
    GraphReplay,
    /// One call between events, L2 flushed by a memset queued ahead of the start event.
    EventsColdL2,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::GraphReplay => "graph-replay",
            Method::EventsColdL2 => "events-cold-l2",
        }
    }

    fn parse(s: &str) -> Result<Method> {
        match s {
            "graph-replay" => Ok(Method::GraphReplay),
            "events-cold-l2" => Ok(Method::EventsColdL2),
            other => bail!("unknown timing method `{other}`: expected graph-replay or events-cold-l2"),
        }
    }
}

/// One input set: Q, K, V and the output, and a serving shape's index arrays.
struct Buffers {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    seq: Option<SeqArrays>,
}

/// A serving shape's sequences on the device: packed offsets (varlen) or cache
/// lengths and a block table (paged).
struct SeqArrays {
    seqs: usize,
    /// The longest sequence's query rows and keys.
    max_seqlen: (usize, usize),
    cu_seqlens: Option<CudaSlice<i32>>,
    seqused_k: Option<CudaSlice<i32>>,
    block_table: Option<(CudaSlice<i32>, usize)>,
}

impl SeqArrays {
    fn sequences(&self) -> Sequences<'_> {
        Sequences {
            seqs: self.seqs,
            cu_seqlens_q: self.cu_seqlens.as_ref(),
            max_seqlen_q: self.max_seqlen.0,
            cu_seqlens_k: self.cu_seqlens.as_ref(),
            max_seqlen_k: self.max_seqlen.1,
            seqused_k: self.seqused_k.as_ref(),
            block_table: self.block_table.as_ref().map(|(pages, width)| BlockTable {
                pages,
                max_pages: *width,
                stride: *width,
            }),
            validate: false,
        }
    }
}

/// A shape's tensors: descs of q (and out) and of k and v, and the sequences'
/// arrays on the host (offsets; cache lengths, block table and its width).
fn layout(shape: &Shape) -> (Desc, Desc, Vec<i32>, Vec<i32>, Vec<i32>, usize) {
    let (h, hkv, d) = (shape.heads, shape.kv_heads(), shape.head_dim);
    let (q_lens, k_lens) = shape.lengths();
    match shape.batching {
        Batching::Dense => {
            let desc = Desc::new([shape.batch, h, shape.seqlen, d], Layout::Bhsd);
            (desc, desc, vec![], vec![], vec![], 0)
        }
        Batching::Varlen { .. } => {
            let total: usize = q_lens.iter().sum();
            let cu = sequences::offsets(&q_lens);
            (
                Desc::new([1, h, total, d], Layout::Bshd),
                Desc::new([1, hkv, total, d], Layout::Bshd),
                cu,
                vec![],
                vec![],
                0,
            )
        }
        Batching::Paged { page_size, .. } => {
            // Pages handed out in a fixed shuffled order, as a serving cache's are.
            let pages: Vec<usize> = k_lens.iter().map(|&n| n.div_ceil(page_size)).collect();
            let width = pages.iter().copied().max().unwrap_or(1);
            let total: usize = pages.iter().sum();
            let mut order: Vec<i32> = (0..total as i32).collect();
            let mut rng = Rng::new(17);
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut table = vec![0i32; shape.batch * width];
            let mut next = order.into_iter();
            for (s, &n) in pages.iter().enumerate() {
                for slot in 0..n {
                    table[s * width + slot] = next.next().unwrap_or(0);
                }
            }
            let used = k_lens.iter().map(|&n| n as i32).collect();
            let q = Desc::new([shape.batch, h, 1, d], Layout::Bshd);
            (q, Desc::new([total, hkv, page_size, d], Layout::Bshd), vec![], used, table, width)
        }
    }
}

/// One shape's input sets on the GPU, ready to be called; calls go round the sets.
struct Case<'a> {
    att: &'a Attention,
    shape: Shape,
    dtype: Dtype,
    sets: Vec<Buffers>,
    next: usize,
    opts: Options,
    launched: Launched,
}

/// The options a shape's mask and softcap name (`Shape::window_size`).
fn masking(shape: &Shape) -> Options {
    let side = |x: usize| Some(u32::try_from(x).unwrap_or(u32::MAX));
    let window = shape.window_size().map_or_else(Window::default, |(l, r)| Window { left: side(l), right: side(r) });
    Options { causal: shape.causal, window, softcap: shape.softcap.map(|c| c as f32), ..Options::default() }
}

fn random_tensor(att: &Attention, dtype: Dtype, desc: Desc, seed: u64) -> Result<Tensor> {
    Ok(att.upload(dtype, desc, &Rng::new(seed).bits(dtype, desc.span(), -1.0, 1.0))?)
}

impl<'a> Case<'a> {
    /// Uploads one input set of fixed-seed random data (the same on every side
    /// of a comparison) and runs one warm-up call.
    fn new(att: &'a Attention, dtype: Dtype, shape: Shape, splits: Splits, choice: KernelChoice) -> Result<Case<'a>> {
        let opts = Options { splits, choice, ..masking(&shape) };
        let mut case = Case { att, shape, dtype, sets: Vec::new(), next: 0, opts, launched: Launched::default() };
        case.add_sets(1)?;
        Ok(case)
    }

    /// Uploads `n` more input sets, each with its own seeds, and warms each.
    fn add_sets(&mut self, n: u64) -> Result<()> {
        let (att, dtype, shape) = (self.att, self.dtype, self.shape);
        let (q_desc, kv_desc, cu_seqlens, used, table, width) = layout(&shape);
        // q, k, v and out per set: 16-bit, or e4m3 inputs, bf16 out and (Hopper) 16-bit scratch.
        let (q_bytes, kv_bytes) = if dtype == Dtype::E4m3 { (5, 6) } else { (4, 4) };
        let bytes = n.saturating_mul((q_bytes * q_desc.span() + kv_bytes * kv_desc.span()) as u64);
        att.check_fits(bytes, &format!("{} ({n} input set(s))", shape.name(dtype)))?;
        let s = att.stream();
        let upload = |v: &Vec<i32>| -> Result<Option<CudaSlice<i32>>> {
            Ok(if v.is_empty() { None } else { Some(s.clone_htod(v)?) })
        };
        for _ in 0..n {
            let i = self.sets.len() as u64;
            let seq = (shape.batching != Batching::Dense)
                .then(|| -> Result<SeqArrays> {
                    let (q, k) = shape.lengths();
                    let longest = |lens: Vec<usize>| lens.into_iter().max().unwrap_or(0);
                    Ok(SeqArrays {
                        seqs: shape.batch,
                        max_seqlen: (longest(q), longest(k)),
                        cu_seqlens: upload(&cu_seqlens)?,
                        seqused_k: upload(&used)?,
                        block_table: upload(&table)?.map(|t| (t, width)),
                    })
                })
                .transpose()?;
            self.sets.push(Buffers {
                q: random_tensor(att, dtype, q_desc, 3 * i + 1)?,
                k: random_tensor(att, dtype, kv_desc, 3 * i + 2)?,
                v: random_tensor(att, dtype, kv_desc, 3 * i + 3)?,
                out: att.alloc_poisoned(Precision::default_for(dtype).output, q_desc)?,
                seq,
            });
            self.next = self.sets.len() - 1;
            self.launched = self.call()?;
        }
        att.synchronize()?;
        Ok(())
    }

    fn call(&mut self) -> Result<Launched> {
        let i = self.next;
        self.next = (i + 1) % self.sets.len();
        let b = &mut self.sets[i];
        Ok(match &b.seq {
            None => self.att.forward(&b.q, &b.k, &b.v, &mut b.out, None, &self.opts)?,
            Some(seq) => {
                let seqs = seq.sequences();
                self.att.forward_varlen(&b.q, &b.k, &b.v, &mut b.out, None, &seqs, &self.opts)?
            }
        })
    }

    fn event(&self) -> Result<CudaEvent> {
        Ok(self.att.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    /// One call's GPU time, which picks the method: the fastest of three batches
    /// of ten calls, each queued behind ~1 GB of memsets and a warm-up call, so that
    /// neither the CPU's launch cost nor the cold first call moves it (a case near
    /// --graph-below-us must not flip methods between processes). The fastest,
    /// because a CPU stall only ever lengthens a batch.
    fn estimate_us(&mut self, flush: &mut CudaSlice<u8>) -> Result<f64> {
        let s = self.att.stream().clone();
        let mut batches = Vec::new();
        for _ in 0..3 {
            let (e0, e1) = (self.event()?, self.event()?);
            for _ in 0..4 {
                s.memset_zeros(flush)?;
            }
            self.call()?;
            e0.record(&s)?;
            for _ in 0..10 {
                self.call()?;
            }
            e1.record(&s)?;
            self.att.synchronize()?;
            batches.push(elapsed_us(&e0, &e1)? / 10.0);
        }
        Ok(bench::stats(&batches).min)
    }

    /// A graph of `n` calls, instantiated.
    fn graph(&mut self, n: usize) -> Result<CudaGraph> {
        let s = self.att.stream().clone();
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        for _ in 0..n {
            self.call()?;
        }
        let graph = s.end_capture(CUgraphInstantiate_flags(0))?.context("the capture recorded no work")?;
        graph.launch()?; // warm the graph
        Ok(graph)
    }

    fn record(&self, method: Method, samples: &[f64]) -> BenchCase {
        let st = bench::stats(samples);
        let shape = self.shape;
        BenchCase {
            name: shape.name(self.dtype),
            dtype: self.dtype.name().into(),
            shape: ShapeRecord {
                batch: shape.batch,
                heads: shape.heads,
                kv_heads: shape.kv_heads(),
                seqlen_q: shape.lengths().0.into_iter().max().unwrap_or(0),
                seqlen_k: shape.seqlen,
                head_dim: shape.head_dim,
                causal: shape.causal,
                window: shape.window_size().map(|(l, r)| [l as i64, r as i64]),
                softcap: shape.softcap.map(|c| c as f32),
            },
            method: method.name().into(),
            samples: samples.len(),
            median_us: st.median,
            q1_us: st.q1,
            q3_us: st.q3,
            min_us: st.min,
            mean_us: st.mean,
            rel_stdev: st.rel_stdev,
            tflops: shape.flops() / (st.median * 1e-6) / 1e12,
            kv_tbps: (shape.batching != Batching::Dense).then(|| shape.kv_bytes() / (st.median * 1e-6) / 1e12),
            ctas: self.launched.ctas,
            num_splits: self.launched.num_splits,
            entry: self.launched.entry_record(),
        }
    }
}

fn elapsed_us(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    Ok(f64::from(a.elapsed_ms(b)?) * 1e3)
}

fn bench_case(
    att: &Attention,
    args: &Args,
    dtype: Dtype,
    shape: &Shape,
    flush: &mut CudaSlice<u8>,
) -> Result<Option<BenchCase>> {
    let mut case = Case::new(att, dtype, *shape, args.splits, args.choice)?;
    if let Some(n) = args.launches_only {
        for _ in 1..n {
            case.call()?;
        }
        att.synchronize()?;
        return Ok(None);
    }
    let estimate = case.estimate_us(flush)?;
    let s = att.stream().clone();
    let budget = Duration::from_millis(args.budget_ms);
    let start = Instant::now();
    let mut samples = Vec::new();
    let method = if estimate < args.graph_below_us { Method::GraphReplay } else { Method::EventsColdL2 };
    match method {
        Method::GraphReplay => {
            let per_graph = ((200.0 / estimate.max(0.5)) as usize).clamp(10, 200);
            let graph = case.graph(per_graph)?;
            while !bench::converged(&samples, args.min_samples, args.target_spread) && start.elapsed() < budget {
                let events: Vec<_> = (0..21).map(|_| case.event()).collect::<Result<_>>()?;
                events[0].record(&s)?;
                for e in &events[1..] {
                    graph.launch()?;
                    e.record(&s)?;
                }
                att.synchronize()?;
                for w in events.windows(2) {
                    samples.push(elapsed_us(&w[0], &w[1])? / per_graph as f64);
                }
            }
        }
        Method::EventsColdL2 => {
            while !bench::converged(&samples, args.min_samples, args.target_spread) && start.elapsed() < budget {
                let pairs: Vec<_> = (0..10).map(|_| Ok((case.event()?, case.event()?))).collect::<Result<_>>()?;
                for (a, b) in &pairs {
                    s.memset_zeros(flush)?; // evicts L2 and keeps the GPU busy while we enqueue
                    a.record(&s)?;
                    case.call()?;
                    b.record(&s)?;
                }
                att.synchronize()?;
                for (a, b) in &pairs {
                    samples.push(elapsed_us(a, b)?);
                }
            }
        }
    }
    Ok(Some(case.record(method, &samples)))
}

/// Input sets a server goes round when timing cold-L2 calls, so that no single
/// allocation's placement decides a process's speed (up to 0.7% between two
/// processes on one set each). Graph replay keeps one set: its data stays in L2
/// between calls, and four sets would fill L2 to where the hit rate depends on
/// each process's placement (1% between processes at B1 H16 S512 D128, H100).
const COLD_SETS: u64 = 4;

/// The case a server holds between requests.
struct Served<'a> {
    case: Case<'a>,
    method: Method,
    /// One call's time by `method`, from the calibration.
    call_us: f64,
    /// The graph of the last `Time` request's size, kept while the size holds.
    graph: Option<(usize, CudaGraph)>,
    /// The planted spin for halves of (launches), in ns, once calibrated.
    plant_ns: Option<(usize, u64)>,
}

/// Answers requests until `Quit` or end of input. A failed request is answered
/// with `Error` and the server goes on; a broken stdout ends it.
fn serve(att: &Attention, args: &Args, flush: &mut CudaSlice<u8>) -> Result<()> {
    let mut probes = Probes::load(att)?;
    let mut out = std::io::stdout().lock();
    let mut reply = |r: &ServeReply| -> Result<()> {
        writeln!(out, "{}", serde_json::to_string(r)?).context("writing a reply")?;
        out.flush().context("writing a reply")
    };
    let default_shapes = bench::default_shapes().iter().map(Shape::spec).collect();
    reply(&ServeReply::Hello { protocol: SERVE_PROTOCOL, device: att.device().clone(), default_shapes })?;
    let mut served: Option<Served> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading a request")?;
        let answer = match serde_json::from_str::<ServeRequest>(&line) {
            Err(e) => Err(anyhow::anyhow!("request `{line}` is not a ServeRequest: {e}")),
            Ok(ServeRequest::Quit) => return Ok(()),
            Ok(ServeRequest::Setup { shape, dtype, method }) => {
                served = None; // free the last case's buffers first
                setup(att, args, flush, &shape, &dtype, method.as_deref()).map(|s| {
                    let r = ready(&s);
                    served = Some(s);
                    r
                })
            }
            Ok(ServeRequest::Time { launches, probe }) => match served.as_mut() {
                None => Err(anyhow::anyhow!("`time` before any `setup`")),
                Some(s) => time_half(s, &mut probes, flush, launches, probe, args.plant_slowdown),
            },
        };
        reply(&answer.unwrap_or_else(|e| ServeReply::Error { message: format!("{e:#}") }))?;
    }
    Ok(())
}

fn setup<'a>(
    att: &'a Attention,
    args: &Args,
    flush: &mut CudaSlice<u8>,
    shape: &str,
    dtype: &str,
    method: Option<&str>,
) -> Result<Served<'a>> {
    let shape = Shape::parse(shape).map_err(anyhow::Error::msg)?;
    let mut case = Case::new(att, Dtype::parse(dtype).map_err(anyhow::Error::msg)?, shape, args.splits, args.choice)?;
    let estimate = case.estimate_us(flush)?;
    let l2_bytes = att
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .context("reading the L2 size")?;
    let method = match method {
        Some(m) => Method::parse(m)?,
        None if estimate < args.graph_below_us || in_l2(&shape, l2_bytes) => Method::GraphReplay,
        None => Method::EventsColdL2,
    };
    if method == Method::EventsColdL2 {
        case.add_sets(COLD_SETS - 1)?;
    }
    let mut served = Served { case, method, call_us: estimate, graph: None, plant_ns: None };
    if method == Method::EventsColdL2 {
        // Cold calls take longer than the warm batches of the estimate.
        let mut cold = Vec::new();
        for _ in 0..5 {
            cold.push(timed(&mut served, flush, 1, None)?);
        }
        served.call_us = bench::stats(&cold).median;
    }
    Ok(served)
}

/// Whether the gate times `shape` warm although its calls are long: where Q, K,
/// V and the output (2 bytes an element) fit in a quarter of L2. A cold call of
/// such a shape waits on DRAM for the few CTAs it runs, and its time depends on
/// where each process's buffers and code lie: two processes of one build
/// differed by up to 1.8% at B1 H1 S8192 D128 causal (H100), warm by 0.3%.
fn in_l2(shape: &Shape, l2_bytes: i32) -> bool {
    let (q, kv, ..) = layout(shape);
    let bytes = 2 * 2 * (q.span() + kv.span());
    bytes.saturating_mul(4) <= l2_bytes.max(0) as usize
}

fn ready(s: &Served) -> ServeReply {
    ServeReply::Ready {
        name: s.case.shape.name(s.case.dtype),
        method: s.method.name().into(),
        estimate_us: s.call_us,
        flops: s.case.shape.flops(),
        entry: s.case.launched.entry_record(),
        num_splits: s.case.launched.num_splits,
        ctas: s.case.launched.ctas,
    }
}

/// Mean µs per call of one half; `plant` (probes, ns) spins inside its timed window.
fn timed(s: &mut Served, flush: &mut CudaSlice<u8>, launches: usize, plant: Option<(&Probes, u64)>) -> Result<f64> {
    let stream = s.case.att.stream().clone();
    let total = match s.method {
        Method::GraphReplay => {
            if s.graph.as_ref().map(|g| g.0) != Some(launches) {
                s.graph = None;
                s.graph = Some((launches, s.case.graph(launches)?));
            }
            let (e0, e1) = (s.case.event()?, s.case.event()?);
            stream.memset_zeros(flush)?;
            e0.record(&stream)?;
            s.graph.as_ref().expect("captured above").1.launch()?;
            if let Some((p, ns)) = plant {
                p.spin(ns)?;
            }
            e1.record(&stream)?;
            s.case.att.synchronize()?;
            elapsed_us(&e0, &e1)?
        }
        Method::EventsColdL2 => {
            let pairs: Vec<_> = (0..launches).map(|_| Ok((s.case.event()?, s.case.event()?))).collect::<Result<_>>()?;
            for (i, (a, b)) in pairs.iter().enumerate() {
                stream.memset_zeros(flush)?;
                a.record(&stream)?;
                s.case.call()?;
                if let Some((p, ns)) = plant.filter(|_| i + 1 == launches) {
                    p.spin(ns)?;
                }
                b.record(&stream)?;
            }
            s.case.att.synchronize()?;
            pairs.iter().map(|(a, b)| elapsed_us(a, b)).sum::<Result<f64>>()?
        }
    };
    Ok(total / launches as f64)
}

fn time_half(
    s: &mut Served,
    probes: &mut Probes,
    flush: &mut CudaSlice<u8>,
    launches: usize,
    probe: bool,
    plant: f64,
) -> Result<ServeReply> {
    if launches == 0 || launches > 10_000 {
        bail!("`time` with {launches} launches: expected 1 to 10000");
    }
    let plant_ns = if plant > 0.0 { plant_spin_ns(s, probes, flush, launches, plant)? } else { 0 };
    let us = timed(s, flush, launches, (plant_ns > 0).then_some((&*probes, plant_ns)))?;
    let sm_mhz = if probe { Some(probes.clock_mhz()?) } else { None };
    Ok(ServeReply::Timed { us, sm_mhz })
}

/// The spin that makes a half of `launches` calls `plant` slower: the fraction
/// of the half's own time, less what launching a spin costs (the median of five
/// halves with a zero spin against five without). Measured once per half size.
fn plant_spin_ns(
    s: &mut Served,
    probes: &Probes,
    flush: &mut CudaSlice<u8>,
    launches: usize,
    plant: f64,
) -> Result<u64> {
    if let Some((n, ns)) = s.plant_ns
        && n == launches
    {
        return Ok(ns);
    }
    let (mut bare, mut zero) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        bare.push(timed(s, flush, launches, None)? * launches as f64);
        zero.push(timed(s, flush, launches, Some((probes, 1)))? * launches as f64);
    }
    let (bare, zero) = (bench::stats(&bare).median, bench::stats(&zero).median);
    let ns = ((plant * bare - (zero - bare).max(0.0)) * 1e3).max(1.0) as u64;
    s.plant_ns = Some((launches, ns));
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_flag_is_described() {
        Args::command().debug_assert();
        for arg in Args::command().get_arguments() {
            assert!(arg.get_help().is_some(), "--{} has no description", arg.get_id());
        }
    }

    #[test]
    fn bad_flags_are_refused_when_parsed() {
        let parse = |args: &[&str]| Args::try_parse_from([&["fa-bench"], args].concat()).map(|_| ());
        let e = parse(&["--shape", "1,1,128,80"]).unwrap_err().to_string();
        assert!(e.contains("q head dim is 80"), "{e}");
        for bad in [
            &["--dtype", "f16,f32"][..],
            &["--serve", "--shape", "1,1,128,64"],
            &["--serve", "--launches-only", "1"],
            &["--launches-only", "0"],
            &["--launches-only", "1", "--json", "x.json"],
            &["--budget-ms", "0"],
            &["--target-spread", "NaN"],
            &["--graph-below-us", "-1"],
            &["--plant-slowdown", "0.1"],
            &["--serve", "--plant-slowdown", "1.5"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse(&["--serve", "--plant-slowdown", "0.03", "--variant", "portable"]).is_ok());
        assert!(parse(&["--launches-only", "1", "--shape", "1,1,128,64", "--dtype", "f16,bf16"]).is_ok());
    }

    #[test]
    fn serving_needs_entry_flags_some_shape_can_run() {
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let args = |extra: &[&str]| Args::try_parse_from([&["fa-bench", "--serve"], extra].concat()).unwrap();
        assert!(check_choice(&m, &args(&["--variant", "hopper", "--block-m", "128"]), &[]).is_ok());
        let e = check_choice(&m, &args(&["--variant", "hopper", "--key-groups", "2"]), &[]).unwrap_err();
        assert!(format!("{e:#}").starts_with("--serve: no shape could run"), "{e:#}");
        let timed =
            |extra: &[&str]| Args::try_parse_from([&["fa-bench", "--dtype", "f16,bf16"], extra].concat()).unwrap();
        let shapes = [Shape::parse("1,1,128,128").unwrap(), Shape::parse("1,1,128,64,causal").unwrap()];
        assert!(check_choice(&m, &timed(&["--block-m", "128"]), &shapes).is_ok());
        let e = check_choice(&m, &timed(&["--variant", "portable", "--block-m", "128"]), &shapes).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("--shape 1,1,128,64,causal: --variant portable --block-m 128"), "{e}");
    }

    #[test]
    fn the_gate_times_shapes_whose_data_fits_a_quarter_of_l2_warm() {
        let h100_l2 = 50 << 20;
        let shape = |s: &str| Shape::parse(s).unwrap();
        // 8 MiB of Q, K, V and O: warm, though a call takes 55 µs.
        assert!(in_l2(&shape("1,1,8192,128,causal"), h100_l2));
        assert!(in_l2(&shape("1,16,512,128"), h100_l2));
        // 64 MiB: cold calls between events.
        assert!(!in_l2(&shape("4,16,2048,64"), h100_l2));
        assert!(!in_l2(&shape("1,1,8192,128"), 0));
    }
}
