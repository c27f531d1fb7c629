//! Safe, validated launches of the FlashAttention forward kernels that `cargo
//! xtask build` compiles, plus the pure pieces (shape validation, the split
//! planner, a CPU reference) that work without a GPU.
//!
//! The kernels compute out = softmax(q·kᵀ·scale [+ causal mask]) · v for f16 or
//! bf16 tensors of head dim 64 or 128, any sequence lengths, grouped-query
//! attention (k/v with fewer heads than q) and any strides that are multiples of
//! 8 elements. Two kernel families share the API: a portable sm_80+ one and a
//! Hopper (sm_90a) one, which [`Variant::Auto`] picks where it is loaded and
//! measured faster. Small problems have their keys split over more CTAs and
//! merged by a second launch; the [`planner`] decides how.
//!
//! # The pieces
//!
//! - [`Attention`]: the kernels loaded on one GPU, with
//!   [`upload`](Attention::upload), [`forward`](Attention::forward) and
//!   [`download`](Attention::download).
//! - [`Tensor`] (on the device), [`Desc`] (dims and strides), [`Dtype`],
//!   [`Layout`]: the operands.
//! - [`Options`] ([`Splits`], [`KernelChoice`], [`Variant`]): what a call asks
//!   for; [`Launched`] ([`Family`]): what ran.
//! - [`Error`]: every refusal names the value and the rule, before anything runs.
//! - Pure, no GPU needed: [`tensor::validate`], [`planner`], [`reference`](mod@reference) (f64
//!   CPU attention), [`check`] (error norms and tolerances), [`kernel_dir`].
//! - What this crate's tools (`fa-run`, `fa-test`, `fa-bench`) share: [`io`]
//!   (safetensors), [`cli`], [`bench`](mod@bench), [`probe`], [`rng`], [`params`] (the
//!   kernels' parameter structs).
//!
//! # Where the kernels come from
//!
//! `cargo build` does not compile CUDA: `cargo xtask build`, run in the
//! flash-pipeline checkout, compiles the kernels with nvcc into a kernel set
//! (`target/kernels`: fatbins per arch, `manifest.json` and `kernel-set.json`).
//! [`Attention::new`] loads the set `FA_KERNEL_DIR` names, else that of the
//! flash-pipeline checkout the current directory is in; it does not look beside
//! the executable or in a dependent crate's own `target/`.
//! [`Attention::with_kernel_dir`] takes the folder outright. So a program of
//! another crate, run outside the checkout, either runs with
//! `FA_KERNEL_DIR=/path/to/flash-pipeline/target/kernels` or passes that path;
//! where no set is found the error says exactly that. [`kernel_dir`] has the
//! rule, and the one kernel-ffi's own tools follow.
//!
//! At run time the NVIDIA driver is loaded dynamically, so everything builds and
//! the pure parts run on machines without one; opening a GPU there fails with
//! [`Error::Unsupported`]. The GPU's arch must be one the kernel set was built
//! for (`kernels/manifest.json` lists them).
//!
//! # Example
//!
//! A forward pass from host buffers (`examples/forward.rs` is the same, checked
//! against [`reference::attention`]):
//!
//! ```no_run
//! use kernel_ffi::{Attention, Desc, Dtype, Gpu, Layout, Options};
//!
//! let att = Attention::new(&Gpu::default())?; // GPU 0; kernels per the rule above
//! let q_desc = Desc::new([2, 8, 512, 128], Layout::Bhsd); // [batch, heads, seq, head_dim]
//! let kv_desc = Desc::new([2, 2, 512, 128], Layout::Bhsd); // 2 k/v heads: GQA
//! let host = |desc: Desc| vec![Dtype::Bf16.from_f32(0.25); desc.span()];
//! let q = att.upload(Dtype::Bf16, q_desc, &host(q_desc))?;
//! let k = att.upload(Dtype::Bf16, kv_desc, &host(kv_desc))?;
//! let v = att.upload(Dtype::Bf16, kv_desc, &host(kv_desc))?;
//! let mut out = att.alloc_poisoned(Dtype::Bf16, q_desc)?;
//! let opts = Options { causal: true, ..Options::default() };
//! let launched = att.forward(&q, &k, &v, &mut out, None, &opts)?;
//! let bits: Vec<u16> = att.download(&out)?; // waits for the launch
//! let first = Dtype::Bf16.to_f32(bits[0]);
//! println!("{} kernel, {} split(s), out[0] = {first}", launched.family.name(), launched.num_splits);
//! # Ok::<(), kernel_ffi::Error>(())
//! ```
//!
//! Without a GPU, the rules a launch is held to are checked the same way:
//!
//! ```
//! use kernel_ffi::tensor::{self, Arg, Desc, Dtype, Layout};
//!
//! let q = Desc::new([2, 8, 512, 128], Layout::Bshd);
//! let kv = Desc::new([2, 3, 512, 128], Layout::Bshd);
//! let arg = |name, desc: Desc| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
//! let e = tensor::validate(arg("q", q), arg("k", kv), arg("v", kv), arg("out", q), None).unwrap_err();
//! assert_eq!(e.to_string(), "q heads (8) must be a multiple of k/v heads (3) for GQA");
//! ```
//!
//! # cudarc
//!
//! Device memory and streams are [cudarc](https://docs.rs/cudarc)'s. The crate
//! re-exports it ([`cudarc`]) and the types its API hands out
//! ([`CudaContext`], [`CudaStream`], [`CudaSlice`], [`DriverError`]), so a
//! dependent crate needs no cudarc dependency of its own, nor one whose version
//! and features must match.

#![warn(missing_docs)]

pub mod attention;
pub mod bench;
pub mod check;
pub mod cli;
pub mod device;
pub mod error;
pub mod io;
pub mod kernel_dir;
pub mod params;
pub mod planner;
pub mod probe;
pub mod reference;
pub mod rng;
pub mod scores;
pub mod sequences;

pub use attention::{
    Attention, BlockTable, Descales, Family, KernelChoice, Launched, Options, Precision, Sequences, Splits, Tensor,
    Variant,
};
pub use cudarc;
pub use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};
pub use device::Gpu;
pub use error::{Error, Result};
#[doc(inline)]
pub use fa_schema::{manifest, schema, tensor};
pub use schema::DeviceInfo;
pub use scores::{Band, Scores, Window};
pub use tensor::{Desc, Dtype, Layout, Problem};
