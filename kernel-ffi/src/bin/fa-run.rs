//! Runs the attention kernel on q, k, v from a safetensors file and writes out
//! (and lse) to another: how users debug against their framework.
//!
//!   fa-run --input qkv.safetensors --output out.safetensors [--layout bhsd|bshd]
//!          [--causal] [--scale S] [--splits auto|N] [--lse]

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use kernel_ffi::io::{HostTensor16, read_qkv, write_outputs};
use kernel_ffi::{Attention, Entry, Layout, Options, Splits};

#[derive(Parser)]
#[command(about = "Run the FlashAttention forward kernel on tensors from a safetensors file", version = kernel_ffi::cli::VERSION)]
struct Args {
    /// GPU to run on: a CUDA ordinal among the visible devices, or a UUID as
    /// `nvidia-smi -L` prints it.
    #[arg(long, env = "FA_DEVICE", default_value = "0")]
    device: kernel_ffi::Gpu,
    /// safetensors file holding `q`, `k`, `v` (f16 or bf16, rank 4).
    #[arg(long)]
    input: PathBuf,
    /// Where to write `out` (and `lse` with --lse).
    #[arg(long)]
    output: PathBuf,
    /// Dim order of the tensors: bhsd ([B, H, S, D], SDPA's) or bshd ([B, S, H, D]).
    #[arg(long, default_value = "bhsd", value_parser = parse_layout)]
    layout: Layout,
    /// Bottom-right aligned causal mask (PyTorch's causal_lower_right).
    #[arg(long)]
    causal: bool,
    /// Softmax scale; default 1/sqrt(head_dim).
    #[arg(long)]
    scale: Option<f32>,
    /// Key splits: auto (planner) or a count.
    #[arg(long, default_value = "auto")]
    splits: Splits,
    #[command(flatten)]
    entry: Entry,
    /// Also write the per-row log-sum-exp (F32 [B, H, Sq]).
    #[arg(long)]
    lse: bool,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "bhsd" => Ok(Layout::Bhsd),
        "bshd" => Ok(Layout::Bshd),
        _ => Err(format!("`{s}` is not a layout; use bhsd or bshd")),
    }
}

fn main() -> std::process::ExitCode {
    kernel_ffi::cli::finish(run())
}

fn run() -> Result<()> {
    let args = Args::parse();
    let bytes = std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let [q, k, v] = read_qkv(&bytes, args.layout)?;
    let att = Attention::new(&args.device).context("setting up the kernels")?;
    let (qd, kd, vd) = (
        att.upload(q.dtype, q.desc, &q.bits)?,
        att.upload(k.dtype, k.desc, &k.bits)?,
        att.upload(v.dtype, v.desc, &v.bits)?,
    );
    let mut out = att.alloc_poisoned(q.dtype, q.desc)?;
    let [b, h, s, _] = q.desc.dims;
    let mut lse = if args.lse { Some(att.alloc_lse(b * h * s)?) } else { None };
    let opts = Options { causal: args.causal, scale: args.scale, splits: args.splits, entry: args.entry };
    let launched = att.forward(&qd, &kd, &vd, &mut out, lse.as_mut(), &opts)?;
    att.synchronize()?;
    let out = HostTensor16 { dtype: q.dtype, desc: q.desc, bits: att.download(&out)? };
    let lse = match &lse {
        Some(l) => Some(att.download_lse(l, b * h * s)?),
        None => None,
    };
    let bytes = write_outputs(&out, args.layout, lse.as_deref())?;
    std::fs::write(&args.output, bytes).with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "fa-run: {} {:?} on {}, {} kernel, {} split(s), {} CTAs → {}",
        q.dtype.name(),
        q.desc.dims,
        att.device().name,
        launched.variant.name(),
        launched.num_splits,
        launched.ctas,
        args.output.display()
    );
    Ok(())
}
