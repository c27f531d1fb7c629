//! A forward pass from host buffers, checked against the CPU reference.
//!
//! ```text
//! cargo run -p kernel-ffi --example forward [-- DEVICE]
//! ```
//!
//! Opens the GPU (`DEVICE`: a CUDA ordinal or a UUID, default 0), loads the
//! kernels where `Attention::new` finds them (`FA_KERNEL_DIR`, else the
//! `target/kernels` of the flash-pipeline checkout this runs in), copies q, k
//! and v up, runs a causal GQA forward, copies out and the LSE back, and
//! compares them with `kernel_ffi::reference` at the dtype's tolerances.
//! Exit status: 0 within tolerance, 1 outside it, 2 could not run (no GPU, no
//! kernels), with the reason on stderr.

use std::error::Error;
use std::process::ExitCode;

use kernel_ffi::reference::{self, HostTensor};
use kernel_ffi::rng::Rng;
use kernel_ffi::tensor::{self, Arg};
use kernel_ffi::{Attention, Desc, Dtype, Gpu, Layout, Options, check};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, Box<dyn Error>> {
    let gpu: Gpu = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => Gpu::default(),
    };
    // Causal attention of 128 queries against 384 keys; 8 query heads share 2 k/v heads.
    let (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim) = (2, 8, 2, 128, 384, 64);
    let (dtype, causal) = (Dtype::F16, true);
    // Dense [B, H, S, D]: `download` then returns out in the reference's order.
    let q_desc = Desc::new([batch, heads, seqlen_q, head_dim], Layout::Bhsd);
    let kv_desc = Desc::new([batch, kv_heads, seqlen_k, head_dim], Layout::Bhsd);
    let mut rng = Rng::new(1);
    let q = rng.bits(dtype, q_desc.span(), -1.0, 1.0);
    let k = rng.bits(dtype, kv_desc.span(), -1.0, 1.0);
    let v = rng.bits(dtype, kv_desc.span(), -1.0, 1.0);

    // Open the GPU and load the kernels.
    let att = Attention::new(&gpu)?;
    // Copy q, k and v up; the output starts as NaN, so nothing unwritten passes.
    let qd = att.upload(dtype, q_desc, &q)?;
    let kd = att.upload(dtype, kv_desc, &k)?;
    let vd = att.upload(dtype, kv_desc, &v)?;
    let mut out = att.alloc_poisoned(dtype, q_desc)?;
    let rows = batch * heads * seqlen_q;
    let mut lse = att.alloc_lse(rows)?;
    // Run: every rule is checked before the launch.
    let opts = Options { causal, ..Options::default() };
    let launched = att.forward(&qd, &kd, &vd, &mut out, Some(&mut lse), &opts)?;
    // Copy out (this waits for the launch).
    let out = att.download(&out)?;
    let lse = att.download_lse(&lse, rows)?;

    // The CPU reference, in f64 on the same f16 inputs.
    let values = |bits: &[u16]| bits.iter().map(|&b| dtype.to_f32(b)).collect::<Vec<f32>>();
    let (qf, kf, vf) = (values(&q), values(&k), values(&v));
    let arg = |name, desc, len| Arg { name, dtype, desc, len };
    let problem = tensor::validate(
        arg("q", q_desc, q.len()),
        arg("k", kv_desc, k.len()),
        arg("v", kv_desc, v.len()),
        arg("out", q_desc, out.len()),
        opts.scale,
    )?;
    let host = |desc, data| HostTensor { desc, data };
    let scores = opts.scores(seqlen_q, seqlen_k)?;
    let (want_out, want_lse) =
        reference::attention(&host(q_desc, &qf), &host(kv_desc, &kf), &host(kv_desc, &vf), &problem, scores);

    let errors = check::compare(out.iter().map(|&b| f64::from(dtype.to_f32(b))), &want_out);
    let (lse_max, lse_bad) = check::compare_lse(&lse, &want_lse);
    let (rel_l2, max_abs, lse_tol) = check::tolerances(dtype);
    let ok = errors.rel_l2 <= rel_l2 && errors.max_abs <= max_abs && lse_bad == 0 && lse_max <= lse_tol;
    println!(
        "{} on {}: {} kernel, {}-row CTAs with {} key group(s), {} split(s), {} CTAs",
        dtype.name(),
        att.device().name,
        launched.family.name(),
        launched.block_m,
        launched.key_groups,
        launched.num_splits,
        launched.ctas
    );
    println!(
        "out: rel L2 {:.2e} (tolerance {rel_l2:.0e}), max abs {:.2e} ({max_abs:.0e}); \
         lse: max abs {lse_max:.2e} ({lse_tol:.0e}), {lse_bad} wrong",
        errors.rel_l2, errors.max_abs
    );
    println!("{}", if ok { "within tolerance" } else { "OUTSIDE TOLERANCE" });
    Ok(ok)
}
