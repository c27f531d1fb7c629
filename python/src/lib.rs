//! `flash_pipeline._C`: the kernels over PyTorch's memory and stream. The
//! Python package (`flash_pipeline/`) checks the tensors and calls `forward`
//! with their device addresses, strides and extents; kernel-ffi checks every
//! rule again before anything is launched, and its message becomes the
//! `ValueError`.

// `_C` is the extension's module name (PyTorch's convention for a package's
// native part): its crate and init function carry it.
#![allow(non_snake_case)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kernel_ffi::tensor::{Desc, Dtype, E4M3_HEAD_DIMS, HEAD_DIMS};
use kernel_ffi::{Attention, BlockTable, Descales, Error, Gpu, KernelChoice, Options, Sequences, Splits, Window};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One loaded kernel set per (device, kernel folder), kept for the process.
type Loaded = Mutex<HashMap<(usize, PathBuf), Arc<Attention>>>;

fn loaded() -> &'static Loaded {
    static LOADED: std::sync::OnceLock<Loaded> = std::sync::OnceLock::new();
    LOADED.get_or_init(Loaded::default)
}

fn attention(device: usize, dir: &Path) -> Result<Arc<Attention>, Error> {
    let mut map = loaded().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = map.get(&(device, dir.to_path_buf())) {
        return Ok(a.clone());
    }
    let a = Arc::new(Attention::with_kernel_dir(&Gpu::Ordinal(device), dir)?);
    map.insert((device, dir.to_path_buf()), a.clone());
    Ok(a)
}

fn py_err(e: Error) -> PyErr {
    match e {
        Error::Invalid(rule) => PyValueError::new_err(rule),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// out = softmax(q·kᵀ·scale [+ bottom-right causal mask])·v on `stream`, and
/// the per-row log-sum-exp into `lse` where it is not 0. Addresses are device
/// pointers; strides are in elements, of (batch, head, seq); `lens` are the
/// elements reachable from each of q, k, v and out. `window` is
/// FlashAttention's `window_size` (−1: unbounded), `softcap` 0 for none.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dtype, dims, q_strides, k_strides, v_strides, out_strides, lens, causal, window, softcap, scale, device, stream, kernel_dir, out_dtype, descales))]
#[allow(clippy::too_many_arguments)]
fn forward(
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    lse: u64,
    dtype: &str,
    dims: (usize, usize, usize, usize, usize, usize),
    q_strides: [usize; 3],
    k_strides: [usize; 3],
    v_strides: [usize; 3],
    out_strides: [usize; 3],
    lens: [usize; 4],
    causal: bool,
    window: (i64, i64),
    softcap: f32,
    scale: Option<f32>,
    device: usize,
    stream: u64,
    kernel_dir: PathBuf,
    out_dtype: &str,
    descales: [u64; 3],
) -> PyResult<()> {
    let dtype = Dtype::parse(dtype).map_err(PyValueError::new_err)?;
    let out_dtype = Dtype::parse(out_dtype).map_err(PyValueError::new_err)?;
    let window = Window::from_pair(window.0, window.1).map_err(PyValueError::new_err)?;
    let softcap = (softcap != 0.0).then_some(softcap);
    let (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim) = dims;
    let desc = |dims, strides| Desc { dims, strides };
    let [q_desc, o_desc] = [q_strides, out_strides].map(|s| desc([batch, heads, seqlen_q, head_dim], s));
    let [k_desc, v_desc] = [k_strides, v_strides].map(|s| desc([batch, kv_heads, seqlen_k, head_dim], s));
    if [q, k, v, out].contains(&0) {
        return Err(PyValueError::new_err("a tensor's device address is 0 (an empty or freed tensor)"));
    }
    let att = attention(device, &kernel_dir).map_err(py_err)?;
    let opts = Options { causal, window, softcap, scale, splits: Splits::Auto, choice: KernelChoice::default() };
    // SAFETY: the caller (flash_pipeline.ops) passes PyTorch's current stream of
    // `device` and tensors of that device whose storage holds `lens` elements from
    // each address; they stay alive while the stream runs this work, because
    // PyTorch's caching allocator reuses memory in the order of that stream.
    // forward_on checks dims, strides and extents against `lens` before launching.
    unsafe {
        let s = att.borrow_stream(stream);
        let q = att.borrow_tensor(&s, q, lens[0], dtype, q_desc);
        let k = att.borrow_tensor(&s, k, lens[1], dtype, k_desc);
        let v = att.borrow_tensor(&s, v, lens[2], dtype, v_desc);
        let mut o = att.borrow_tensor(&s, out, lens[3], out_dtype, o_desc);
        let rows = batch.checked_mul(heads).and_then(|n| n.checked_mul(seqlen_q));
        let rows = rows.ok_or_else(|| PyValueError::new_err("batch × heads × seqlen_q overflows"))?;
        let mut l = (lse != 0).then(|| att.borrow_f32(&s, lse, rows));
        // Each descale given is (batch, kv_heads) float32, contiguous (flash_pipeline._args).
        let factors = descales.map(|d| (d != 0).then(|| att.borrow_f32(&s, d, batch.saturating_mul(kv_heads))));
        let given = Descales { q: factors[0].as_deref(), k: factors[1].as_deref(), v: factors[2].as_deref() };
        att.forward_descaled_on(&s, &q, &k, &v, given, &mut o, l.as_deref_mut(), &opts).map_err(py_err)?;
    }
    Ok(())
}

/// One tensor as the extension takes it: device address, dims [batch, heads,
/// seq, head_dim], element strides of (batch, head, seq), and the elements
/// reachable from the address.
type TensorArg = (u64, [usize; 4], [usize; 3], usize);

/// One int32 array: device address (0: absent) and length.
type IntArg = (u64, usize);

/// A serving call (`Attention::forward_varlen_on`) on `stream`: q and out
/// dense [seqs, H, Sq, D] or packed [1, H, total_q, D] (with `cu_seqlens_q`),
/// k and v dense, packed (with `cu_seqlens_k`) or paged [pages, Hkv,
/// page_size, D] (with `block_table` = (address, length, max_pages, stride)).
/// `lse` (address 0: none) gets fp32 [batch, H, rows] of q's view. An int32
/// array whose address is 0 is absent. `window` and `softcap` as `forward`'s.
/// `num_splits` 0 lets the planner choose; `validate` checks the arrays on the
/// host first (a synchronising copy).
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dtype, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, seqs, max_seqlen_q, max_seqlen_k, causal, window, softcap, scale, num_splits, validate, device, stream, kernel_dir))]
#[allow(clippy::too_many_arguments)]
fn forward_varlen(
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    out: TensorArg,
    lse: IntArg,
    dtype: &str,
    cu_seqlens_q: IntArg,
    cu_seqlens_k: IntArg,
    seqused_k: IntArg,
    block_table: (u64, usize, usize, usize),
    seqs: usize,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    causal: bool,
    window: (i64, i64),
    softcap: f32,
    scale: Option<f32>,
    num_splits: u32,
    validate: bool,
    device: usize,
    stream: u64,
    kernel_dir: PathBuf,
) -> PyResult<()> {
    let dtype = Dtype::parse(dtype).map_err(PyValueError::new_err)?;
    if [q.0, k.0, v.0, out.0].contains(&0) {
        return Err(PyValueError::new_err("a tensor's device address is 0 (an empty or freed tensor)"));
    }
    let att = attention(device, &kernel_dir).map_err(py_err)?;
    let splits = if num_splits == 0 { Splits::Auto } else { Splits::Fixed(num_splits) };
    let window = Window::from_pair(window.0, window.1).map_err(PyValueError::new_err)?;
    let softcap = (softcap != 0.0).then_some(softcap);
    let opts = Options { causal, window, softcap, scale, splits, choice: KernelChoice::default() };
    let (table, table_len, max_pages, table_stride) = block_table;
    // SAFETY: as in `forward`: the caller (flash_pipeline.ops) passes PyTorch's current
    // stream of `device` and tensors and int32 arrays of that device whose storage holds
    // the given elements from each address, alive while the stream runs this work.
    // forward_varlen_on checks every shape against those lengths before launching; the
    // kernels clamp every index they read from the arrays into the tensors.
    unsafe {
        let s = att.borrow_stream(stream);
        let tensor =
            |(ptr, dims, strides, len): TensorArg| att.borrow_tensor(&s, ptr, len, dtype, Desc { dims, strides });
        let ints = |(ptr, len): IntArg| (ptr != 0).then(|| att.borrow_i32(&s, ptr, len));
        let (q, k, v, mut o) = (tensor(q), tensor(k), tensor(v), tensor(out));
        let mut l = (lse.0 != 0).then(|| att.borrow_f32(&s, lse.0, lse.1));
        let (cu_q, cu_k, used) = (ints(cu_seqlens_q), ints(cu_seqlens_k), ints(seqused_k));
        let pages = ints((table, table_len));
        let sequences = Sequences {
            seqs,
            cu_seqlens_q: cu_q.as_deref(),
            max_seqlen_q,
            cu_seqlens_k: cu_k.as_deref(),
            max_seqlen_k,
            seqused_k: used.as_deref(),
            block_table: pages.as_deref().map(|pages| BlockTable { pages, max_pages, stride: table_stride }),
            validate,
        };
        att.forward_varlen_on(&s, &q, &k, &v, &mut o, l.as_deref_mut(), &sequences, &opts).map_err(py_err)?;
    }
    Ok(())
}

/// What the kernels run: head dims (dense and serving calls) and dtypes.
#[pyfunction]
fn supported(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("head_dims", HEAD_DIMS.to_vec())?;
    d.set_item("dtypes", ["f16", "bf16", "e4m3"])?;
    d.set_item("e4m3_head_dims", E4M3_HEAD_DIMS.to_vec())?;
    Ok(d)
}

/// Gives the memory every loaded kernel set keeps for calls' temporaries, and
/// no call uses, back to the driver.
#[pyfunction]
fn release_scratch() -> PyResult<()> {
    let map = loaded().lock().unwrap_or_else(|e| e.into_inner());
    for att in map.values() {
        att.trim_scratch().map_err(py_err)?;
    }
    Ok(())
}

#[pymodule]
fn _C(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(forward_varlen, m)?)?;
    m.add_function(wrap_pyfunction!(supported, m)?)?;
    m.add_function(wrap_pyfunction!(release_scratch, m)?)?;
    Ok(())
}
