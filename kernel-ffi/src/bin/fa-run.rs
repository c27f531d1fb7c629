//! Runs the attention kernel on q, k, v from a safetensors file and writes out
//! (and lse) to another: how users debug against their framework.
//!
//!   fa-run --input qkv.safetensors --output out.safetensors [--layout bhsd|bshd]
//!          [--causal] [--window LEFT,RIGHT] [--softcap C] [--scale S] [--splits auto|N] [--lse]
//!          [--out-dtype f16|bf16]
//!
//! e4m3 q, k and v (F8_E4M3) may come with F32 `q_descale`, `k_descale`,
//! `v_descale` of [batch, kv_heads] (FA3's); their output is bf16 unless
//! `--out-dtype` says f16.
//!
//! A file that also holds int32 `cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`
//! (or `cache_seqlens`) or `block_table` is a serving call in FlashAttention's
//! layouts (`io::read_serving`), run by `forward_varlen` with its index arrays
//! checked on the host first.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Parser;
use kernel_ffi::io::{self, HostTensor16, ServingInput, read_qkv, read_serving, write_outputs, write_packed_outputs};
use kernel_ffi::manifest::Manifest;
use kernel_ffi::{
    Attention, BlockTable, CudaSlice, Descales, Dtype, KernelChoice, Launched, Layout, Options, Precision, Sequences,
    Splits, Tensor, Window, cli, kernel_dir, sequences, tensor,
};

#[derive(Parser)]
#[command(about = "Run the FlashAttention forward kernel on tensors from a safetensors file", version = kernel_ffi::cli::VERSION)]
struct Args {
    /// GPU to run on: a CUDA ordinal among the visible devices, or a UUID as
    /// `nvidia-smi -L` prints it.
    #[arg(long, env = fa_schema::env::DEVICE, default_value = "0")]
    device: kernel_ffi::Gpu,
    /// safetensors file holding `q`, `k`, `v` (f16, bf16 or e4m3, rank 4), and for
    /// e4m3 optionally F32 `q_descale`, `k_descale`, `v_descale` [batch, kv_heads].
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
    /// Sliding window LEFT,RIGHT keys around the diagonal, −1 for unbounded
    /// (FlashAttention's window_size); e.g. 4096,0.
    #[arg(long, allow_hyphen_values = true)]
    window: Option<Window>,
    /// Logit softcap c: scores become c·tanh(score·scale/c) (Gemma 2).
    #[arg(long)]
    softcap: Option<f32>,
    /// Softmax scale; default 1/sqrt(head_dim).
    #[arg(long)]
    scale: Option<f32>,
    /// Key splits: auto (planner) or a count.
    #[arg(long, default_value = "auto")]
    splits: Splits,
    #[command(flatten)]
    choice: KernelChoice,
    /// Also write the per-row log-sum-exp (F32 [B, H, Sq]).
    #[arg(long)]
    lse: bool,
    /// The output's dtype for e4m3 inputs: bf16 (default) or f16.
    #[arg(long, value_parser = parse_out_dtype)]
    out_dtype: Option<Dtype>,
}

fn parse_out_dtype(s: &str) -> Result<Dtype, String> {
    match Dtype::parse(s)? {
        Dtype::E4m3 => Err("the kernels write f16 or bf16 output".into()),
        d => Ok(d),
    }
}

impl Args {
    fn options(&self) -> Options {
        Options {
            causal: self.causal,
            window: self.window.unwrap_or_default(),
            softcap: self.softcap,
            scale: self.scale,
            splits: self.splits,
            choice: self.choice,
        }
    }
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "bhsd" => Ok(Layout::Bhsd),
        "bshd" => Ok(Layout::Bshd),
        _ => Err(format!("`{s}` is not a layout; use bhsd or bshd")),
    }
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// The input file, read no further than its header says and its size allows:
/// the header length is checked against the file before the header is read, and
/// each tensor's bytes against the file before the data is.
fn read_input(path: &Path) -> Result<Vec<u8>> {
    let what = || format!("reading {}", path.display());
    let (mut file, len) = fa_schema::file::open_regular(path).map_err(|e| {
        anyhow::anyhow!("--input: {e:#} (save q, k and v with safetensors.torch.save_file and pass that file)")
    })?;
    let mut prefix = [0u8; 8];
    if len >= 8 {
        file.read_exact(&mut prefix).with_context(what)?;
    }
    let header_len = io::header_len(prefix, len).with_context(|| format!("in {}", path.display()))?;
    let mut bytes = prefix.to_vec();
    (&mut file).take(header_len).read_to_end(&mut bytes).with_context(what)?;
    let data_len = len - 8 - header_len;
    io::check_header(&bytes[8..], data_len).with_context(|| format!("in {}", path.display()))?;
    bytes
        .try_reserve_exact(data_len as usize)
        .with_context(|| format!("{}: {len} bytes do not fit in memory", path.display()))?;
    file.take(data_len).read_to_end(&mut bytes).with_context(what)?;
    if bytes.len() as u64 != len {
        bail!("{} changed size while it was read ({len} bytes, then {}); read it again", path.display(), bytes.len());
    }
    Ok(bytes)
}

fn run() -> Result<()> {
    let args = Args::parse();
    // Everything that can be wrong with the input and flags is refused here,
    // before the first CUDA call (`Attention::with_kernel_dir`).
    let bytes = read_input(&args.input)?;
    if let Some(serving) = read_serving(&bytes, args.layout).with_context(|| format!("in {}", args.input.display()))? {
        return run_serving(&args, serving);
    }
    let [q, k, v] = read_qkv(&bytes, args.layout).with_context(|| format!("in {}", args.input.display()))?;
    let precision = precision(&args, q.dtype)?;
    let out_arg = tensor::Arg { name: "out", dtype: precision.output, desc: q.desc, len: q.desc.span() };
    let problem = tensor::validate(q.arg("q"), k.arg("k"), v.arg("v"), out_arg, args.scale)
        .with_context(|| format!("in {}", args.input.display()))?;
    let descales = io::read_descales(&bytes).with_context(|| format!("in {}", args.input.display()))?;
    check_descales(&descales, q.dtype, problem.batch, problem.kv_heads)
        .with_context(|| format!("in {}", args.input.display()))?;
    check_output(&args.output)?;
    let kernels = kernel_dir::find()?;
    let manifest_path = kernels.join("manifest.json");
    let opts = args.options();
    let scores = opts.scores(problem.seqlen_q, problem.seqlen_k)?;
    cli::check_choice(&Manifest::load(&manifest_path)?, &args.choice, precision, problem.head_dim, scores)
        .with_context(|| format!("checking the flags against {}", manifest_path.display()))?;
    let att = Attention::with_kernel_dir(&args.device, &kernels).context("setting up the kernels")?;
    let (qd, kd, vd) = (
        att.upload(q.dtype, q.desc, &q.bits)?,
        att.upload(k.dtype, k.desc, &k.bits)?,
        att.upload(v.dtype, v.desc, &v.bits)?,
    );
    let mut out = att.alloc_poisoned(precision.output, q.desc)?;
    let [b, h, s, _] = q.desc.dims;
    let mut lse = if args.lse { Some(att.alloc_lse(b * h * s)?) } else { None };
    let factors = descales
        .iter()
        .map(|d| {
            d.as_ref().map(|(f, _)| att.stream().clone_htod(f).context("copying a descale to the GPU")).transpose()
        })
        .collect::<Result<Vec<_>>>()?;
    let given = Descales { q: factors[0].as_ref(), k: factors[1].as_ref(), v: factors[2].as_ref() };
    let launched = att.forward_descaled_on(att.stream(), &qd, &kd, &vd, given, &mut out, lse.as_mut(), &opts)?;
    att.synchronize()?;
    let out = HostTensor16 { dtype: precision.output, desc: q.desc, bits: att.download(&out)? };
    let lse = match &lse {
        Some(l) => Some(att.download_lse(l, b * h * s)?),
        None => None,
    };
    let bytes = write_outputs(&out, args.layout, lse.as_deref())?;
    cli::write_atomic(&args.output, &bytes)?;
    report(&precision.name(), &format!("{:?}", q.desc.dims), &att, &launched, &args.output);
    Ok(())
}

/// The call's dtypes: `--out-dtype` is for e4m3 inputs only.
fn precision(args: &Args, input: Dtype) -> Result<Precision> {
    match (input, args.out_dtype) {
        (Dtype::E4m3, Some(output)) => Ok(Precision { input, output }),
        (_, None) => Ok(Precision::default_for(input)),
        (_, Some(_)) => bail!("--out-dtype is for e4m3 inputs; q is {}, and the output takes its dtype", input.name()),
    }
}

/// Descales in the file are for e4m3 inputs, each [batch, kv_heads].
fn check_descales(descales: &io::Descales, input: Dtype, batch: usize, kv_heads: usize) -> Result<()> {
    for (name, d) in io::DESCALE_TENSORS.iter().zip(descales) {
        let Some((_, shape)) = d else { continue };
        if input != Dtype::E4m3 {
            bail!("`{name}` is given but q is {}; descales dequantise e4m3 inputs", input.name());
        }
        if shape[..] != [batch, kv_heads] {
            bail!("`{name}` has shape {shape:?}; expected [batch, kv_heads] = [{batch}, {kv_heads}]");
        }
    }
    Ok(())
}

/// `--output` names a writable place: its folder exists and it is not something
/// the atomic writer refuses.
fn check_output(output: &Path) -> Result<()> {
    let out_dir = output.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !out_dir.is_dir() {
        bail!("--output {}: folder {} does not exist", output.display(), out_dir.display());
    }
    fa_schema::file::check_target(output).context("--output")
}

fn report(dtype: &str, what: &str, att: &Attention, launched: &Launched, output: &Path) {
    eprintln!(
        "fa-run: {dtype} {what} on {}, {} kernel, {} split(s), {} CTAs → {}",
        att.device().name,
        launched.family.name(),
        launched.num_splits,
        launched.ctas,
        output.display()
    );
}

/// A serving call: its shapes checked against its sequences before any CUDA
/// call, its index arrays on the host before the launch.
fn run_serving(args: &Args, input: ServingInput) -> Result<()> {
    let ServingInput { qkv: [q, k, v], cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, seqs } = input;
    if q.dtype == Dtype::E4m3 {
        bail!("in {}: serving calls take f16 or bf16; e4m3 runs dense calls only", args.input.display());
    }
    let lens = |cu: &Option<Vec<i32>>| {
        cu.as_ref().map_or(0, |c| c.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).max().unwrap_or(0))
    };
    let layout = sequences::SeqLayout {
        seqs,
        cu_seqlens_q: cu_seqlens_q.as_ref().map(Vec::len),
        max_seqlen_q: lens(&cu_seqlens_q),
        cu_seqlens_k: cu_seqlens_k.as_ref().map(Vec::len),
        max_seqlen_k: lens(&cu_seqlens_k),
        seqused_k: seqused_k.as_ref().map(Vec::len),
        block_table: block_table.as_ref().map(|(t, width)| sequences::PageTable {
            len: t.len(),
            max_pages: *width,
            stride: *width,
        }),
    };
    let out_arg = tensor::Arg { name: "out", dtype: q.dtype, desc: q.desc, len: q.desc.span() };
    let p = sequences::validate(q.arg("q"), k.arg("k"), v.arg("v"), out_arg, &layout, args.scale)
        .with_context(|| format!("in {}", args.input.display()))?;
    check_output(&args.output)?;
    let kernels = kernel_dir::find()?;
    let att = Attention::with_kernel_dir(&args.device, &kernels).context("setting up the kernels")?;
    let up = |t: &HostTensor16| att.upload(t.dtype, t.desc, &t.bits);
    let (qd, kd, vd) = (up(&q)?, up(&k)?, up(&v)?);
    let ints = |a: &Option<Vec<i32>>| -> Result<Option<CudaSlice<i32>>> {
        a.as_ref().map(|a| att.stream().clone_htod(a).context("copying the sequence arrays to the GPU")).transpose()
    };
    let (cu_q, cu_k, used) = (ints(&cu_seqlens_q)?, ints(&cu_seqlens_k)?, ints(&seqused_k)?);
    let table = ints(&block_table.as_ref().map(|t| t.0.clone()))?;
    let sequences = Sequences {
        seqs,
        cu_seqlens_q: cu_q.as_ref(),
        max_seqlen_q: layout.max_seqlen_q,
        cu_seqlens_k: cu_k.as_ref(),
        max_seqlen_k: layout.max_seqlen_k,
        seqused_k: used.as_ref(),
        block_table: table.as_ref().zip(block_table.as_ref()).map(|(pages, (_, width))| BlockTable {
            pages,
            max_pages: *width,
            stride: *width,
        }),
        validate: true,
    };
    let mut out: Tensor = att.alloc_poisoned(q.dtype, q.desc)?;
    let mut lse = if args.lse { Some(att.alloc_lse(p.rows())?) } else { None };
    let opts = args.options();
    let launched = att
        .forward_varlen(&qd, &kd, &vd, &mut out, lse.as_mut(), &sequences, &opts)
        .with_context(|| format!("in {}", args.input.display()))?;
    att.synchronize()?;
    let out = HostTensor16 { dtype: q.dtype, desc: q.desc, bits: att.download(&out)? };
    let lse = match &lse {
        Some(l) => Some(att.download_lse(l, p.rows())?),
        None => None,
    };
    let bytes = match cu_seqlens_q {
        Some(_) => write_packed_outputs(&out, lse.as_deref())?,
        None => write_outputs(&out, args.layout, lse.as_deref())?,
    };
    cli::write_atomic(&args.output, &bytes)?;
    report(q.dtype.name(), &format!("{seqs} sequences"), &att, &launched, &args.output);
    Ok(())
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
}
