//! Correctness driver: runs the kernels over the feature matrix on fresh random
//! inputs and compares with the f64 CPU reference (small shapes) or the fp32 GPU
//! reference (large ones). Writes JSON for `cargo xtask test`.

mod serving;

use std::time::{Instant, SystemTime};

use anyhow::{Context, Result};
use kernel_ffi::check::{E4M3_WGMMA_QK_EPS, FP32_QK_EPS, compare, compare_lse_within, tolerances};
use kernel_ffi::cli::{self, CheckFailed};
use kernel_ffi::reference::{self, HostTensor};
use kernel_ffi::rng::Rng;
use kernel_ffi::schema::{EntryRecord, ListedCase, ShapeRecord, SkippedCase, TestCase, TestRun, WorkerReply};
use kernel_ffi::tensor::{E4M3_HEAD_DIMS, HEAD_DIMS};
use kernel_ffi::{
    Attention, Desc, Descales, Dtype, Family, KernelChoice, Layout, Options, Precision, Problem, Scores, Splits,
    Variant, Window,
};

/// Cases run the portable kernel, on the planner's entry, until `on_every_entry` names one.
const PORTABLE: KernelChoice =
    KernelChoice { variant: Variant::Portable, block_m: None, key_groups: None, persistent: None };
/// The Hopper kernel, on the planner's entry.
const HOPPER: KernelChoice = KernelChoice { variant: Variant::Hopper, ..PORTABLE };

#[derive(Debug, Clone)]
struct Case {
    dtype: Dtype,
    head_dim: usize,
    causal: bool,
    /// FlashAttention's `window_size` and `softcap`.
    window: Window,
    softcap: Option<f32>,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    layout: Layout,
    splits: Splits,
    lse: bool,
    scale: Option<f32>,
    gpu_reference: bool,
    /// An e4m3 case (`dtype` E4m3): its output dtype and inputs.
    fp8: Option<Fp8>,
    /// The kernel, and the query rows, key groups per CTA and persistence that
    /// `on_every_entry` names (`None`: the planner's choice).
    choice: KernelChoice,
}

/// An e4m3 case's output dtype, and whether its inputs carry outliers (a few
/// K channels and Q rows 16× the rest, as LLM activations do). Its descales are
/// random, so a descale the kernel drops or misplaces shows.
#[derive(Debug, Clone, Copy)]
struct Fp8 {
    out: Dtype,
    outliers: bool,
}

impl Case {
    /// Its inputs' and output's dtypes.
    fn precision(&self) -> Precision {
        Precision { input: self.dtype, output: self.fp8.map_or(self.dtype, |f| f.out) }
    }

    /// Whether an e4m3 case runs dequantised to its output dtype: with a window
    /// or softcap (no e4m3 entry of either kernel has one), or on the Hopper
    /// kernel at a head dim other than 128 and 256 (its e4m3 entries'). Stated
    /// here, apart from the library's rule, which the case checks against it.
    fn dequantised(&self) -> Result<bool> {
        let scores = self.scores()?;
        Ok(self.fp8.is_some()
            && (matches!(scores.band, kernel_ffi::Band::Local { .. })
                || scores.softcap.is_some()
                || (self.choice.variant == Variant::Hopper && !matches!(self.head_dim, 128 | 256))))
    }

    fn shape(&self) -> ShapeRecord {
        ShapeRecord {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            head_dim: self.head_dim,
            causal: self.causal,
            window: self.window.pair(),
            softcap: self.softcap,
        }
    }

    /// The mask and modifier the case's options resolve to.
    fn scores(&self) -> Result<Scores> {
        Ok(Scores::resolve(self.causal, self.window, self.softcap, self.seqlen_q, self.seqlen_k)?)
    }

    /// What the case costs, in units of the f64 CPU reference's inner step (batch
    /// × heads × query rows × keys × head dim): the reference is nearly all of a
    /// case's time. The fp32 GPU reference takes about 1/130 of the CPU's time a
    /// unit, plus a fixed ~0.05 s of uploads and launches (H200: 1.4e-9 s a unit
    /// on the CPU, 1.1e-11 on the GPU).
    fn work(&self) -> f64 {
        let units: f64 =
            [self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim].iter().map(|&x| x as f64).product();
        if self.gpu_reference { units / 130.0 + GPU_REFERENCE_FIXED } else { units }
    }

    fn layout_label(&self) -> &'static str {
        match self.layout {
            Layout::Bshd => "bshd",
            Layout::Bhsd => "bhsd",
        }
    }

    fn name(&self) -> String {
        format!(
            "{}{}-d{}{}{}{}-b{}h{}kv{}-q{}k{}-{}-s{}{}{}{}{}{}{}",
            self.precision().name(),
            if self.fp8.is_some_and(|f| f.outliers) { "-outliers" } else { "" },
            self.head_dim,
            if self.causal { "-causal" } else { "" },
            self.window.label(),
            self.softcap.map_or(String::new(), |c| format!("-cap{c}")),
            self.batch,
            self.heads,
            self.kv_heads,
            self.seqlen_q,
            self.seqlen_k,
            self.layout_label(),
            self.splits,
            if self.lse { "-lse" } else { "" },
            if self.scale.is_some() { "-scaled" } else { "" },
            if self.choice.variant == Variant::Hopper { "-hopper" } else { "" },
            self.choice.block_m.map_or(String::new(), |m| format!("-m{m}")),
            self.choice.key_groups.filter(|&g| g > 1).map_or(String::new(), |g| format!("-kg{g}")),
            if self.choice.persistent == Some(true) { "-persistent" } else { "" },
        )
    }
}

/// A GPU-reference case's fixed cost in CPU-reference units (~0.05 s).
const GPU_REFERENCE_FIXED: f64 = 3.5e7;

/// Small shapes that still reach every entry point and every code path (tails,
/// causal rows without keys, empty splits, GQA, combine, the GPU reference): what
/// compute-sanitizer runs, where each launch is 10-100x slower.
fn sanitize_set() -> Vec<Case> {
    let mut cases = Vec::new();
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                let case = |seqlen_q, seqlen_k, heads, kv_heads, layout, splits| Case {
                    head_dim,
                    causal,
                    window: Window::default(),
                    softcap: None,
                    heads,
                    kv_heads,
                    seqlen_q,
                    seqlen_k,
                    layout,
                    splits,
                    gpu_reference: false,
                    fp8: None,
                    ..sanitize_set_ref(dtype)
                };
                cases.push(case(65, 130, 2, 2, Layout::Bhsd, Splits::Fixed(1)));
                cases.push(case(130, 130, 4, 1, Layout::Bshd, Splits::Fixed(3)));
                cases.push(case(1, 77, 2, 1, Layout::Bhsd, Splits::Auto));
                if causal {
                    // 133 pairs of 128-row blocks: a partial last round on up to 132 SMs, so
                    // that the 128-row entries run a host schedule (planner::causal_order).
                    cases.push(case(256, 256, 133, 1, Layout::Bhsd, Splits::Fixed(1)));
                } else if head_dim == 64 {
                    // 133 192-row blocks: a partial last round on up to 132 SMs, which the
                    // Hopper D=64 192-row entry runs as split-tail items (planner::whole_units),
                    // the block's last third past the queries.
                    cases.push(case(100, 300, 133, 1, Layout::Bhsd, Splits::Fixed(1)));
                }
            }
        }
        cases.push(sanitize_set_ref(dtype));
        // Head dims 96, 192 and 256, split (their combines).
        for head_dim in [96, 192, 256] {
            cases.push(Case {
                head_dim,
                causal: false,
                seqlen_q: 130,
                seqlen_k: 200,
                splits: Splits::Fixed(3),
                gpu_reference: false,
                fp8: None,
                ..sanitize_set_ref(dtype)
            });
        }
        // Windowed and softcapped entries: a band's both edges and tails.
        for head_dim in HEAD_DIMS {
            let band = Window { left: Some(40), right: Some(9) };
            for (window, causal, softcap) in
                [(band, false, None), (Window::default(), true, Some(20.0)), (band, true, Some(20.0))]
            {
                cases.push(Case {
                    head_dim,
                    causal,
                    window,
                    softcap,
                    seqlen_q: 130,
                    seqlen_k: 200,
                    gpu_reference: false,
                    fp8: None,
                    ..sanitize_set_ref(dtype)
                });
            }
        }
    }
    let mut cases = on_every_entry(cases);
    cases.extend(e4m3_cases(5));
    // A split-tail item of the e4m3 D=128 192-row entry (133 units on up to 132 SMs).
    cases.push(Case {
        dtype: Dtype::E4m3,
        head_dim: 128,
        causal: false,
        heads: 133,
        kv_heads: 7,
        seqlen_q: 100,
        seqlen_k: 300,
        splits: Splits::Fixed(1),
        gpu_reference: false,
        fp8: Some(Fp8 { out: Dtype::Bf16, outliers: false }),
        choice: HOPPER_E4M3_M192,
        ..sanitize_set_ref(Dtype::E4m3)
    });
    cases
}

/// Every case on every entry: the portable kernel's and then the Hopper kernel's,
/// each at 32 (two key groups only), 64, 128 and 192 (Hopper D=64) query rows
/// per CTA, with one or two key groups, persistent or not (named `…-m64` /
/// `…-m32-kg2` / `…-hopper-m128` / `…-persistent`); a case runs only where its
/// entry is loaded (most configurations have one or two).
fn on_every_entry(cases: Vec<Case>) -> Vec<Case> {
    let entries =
        [(32, 2), (64, 1), (64, 2), (128, 1), (192, 1)].into_iter().flat_map(|(m, g)| [(m, g, false), (m, g, true)]);
    [Variant::Portable, Variant::Hopper]
        .into_iter()
        .flat_map(|variant| entries.clone().map(move |e| (variant, e)))
        .flat_map(|(variant, (m, g, pers))| {
            cases.iter().map(move |c| Case {
                choice: KernelChoice { variant, block_m: Some(m), key_groups: Some(g), persistent: Some(pers) },
                ..c.clone()
            })
        })
        .collect()
}

/// The Hopper kernel's e4m3 D=128 192-row entry (persistent, three consumer
/// warpgroups), pinned: the planner takes it for large grids only.
const HOPPER_E4M3_M192: KernelChoice =
    KernelChoice { block_m: Some(192), key_groups: Some(1), persistent: Some(true), ..HOPPER };

fn sanitize_set_ref(dtype: Dtype) -> Case {
    Case {
        dtype,
        head_dim: 64,
        causal: true,
        window: Window::default(),
        softcap: None,
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seqlen_q: 100,
        seqlen_k: 150,
        layout: Layout::Bshd,
        splits: Splits::Auto,
        lse: true,
        scale: None,
        gpu_reference: true,
        fp8: None,
        choice: PORTABLE,
    }
}

/// Every dtype × head dim (HEAD_DIMS) × causal × split mode, each over all lengths; layout,
/// GQA shape, batch, LSE and explicit scale rotate so each meets every length.
fn matrix() -> Vec<Case> {
    // Odd and even, below/at/above a 64 tile, Sq ≠ Sk both ways (causal rows with no key), 1 and 0.
    let lengths = [(1, 1), (1, 77), (63, 63), (64, 64), (65, 130), (128, 97), (200, 513), (130, 64), (0, 10), (10, 0)];
    let gqa = [(2, 2), (4, 1), (6, 2)];
    let mut cases = Vec::new();
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for causal in [false, true] {
                for (si, splits) in [Splits::Fixed(1), Splits::Fixed(3), Splits::Auto].into_iter().enumerate() {
                    for (i, &(seqlen_q, seqlen_k)) in lengths.iter().enumerate() {
                        let (heads, kv_heads) = gqa[(i + si) % 3];
                        cases.push(Case {
                            dtype,
                            head_dim,
                            causal,
                            window: Window::default(),
                            softcap: None,
                            batch: 1 + (i + si) % 2,
                            heads,
                            kv_heads,
                            seqlen_q,
                            seqlen_k,
                            layout: if (i + si) % 2 == 0 { Layout::Bshd } else { Layout::Bhsd },
                            splits,
                            lse: (i + si + usize::from(causal)) % 2 == 0,
                            scale: (i % 3 == 0).then_some(0.3),
                            gpu_reference: false,
                            fp8: None,
                            choice: PORTABLE,
                        });
                    }
                }
            }
        }
    }
    // Scores far above a row's first key tile (scale 4): the Hopper kernel's tiles
    // past the kept max's headroom are redone exactly (SoftmaxState::update_kept).
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for causal in [false, true] {
                cases.push(Case {
                    dtype,
                    head_dim,
                    causal,
                    window: Window::default(),
                    softcap: None,
                    batch: 1,
                    heads: 2,
                    kv_heads: 2,
                    seqlen_q: 300,
                    seqlen_k: 700,
                    layout: Layout::Bhsd,
                    splits: Splits::Fixed(1),
                    lse: true,
                    scale: Some(4.0),
                    gpu_reference: false,
                    fp8: None,
                    choice: PORTABLE,
                });
            }
        }
    }
    let seed = |dtype, s, b, h| Case {
        dtype,
        head_dim: 64,
        causal: false,
        window: Window::default(),
        softcap: None,
        batch: b,
        heads: h,
        kv_heads: h,
        seqlen_q: s,
        seqlen_k: s,
        layout: Layout::Bhsd,
        splits: Splits::Auto,
        lse: true,
        scale: None,
        gpu_reference: false,
        fp8: None,
        choice: PORTABLE,
    };
    // The seed problems, as the planner sees them.
    cases.extend([seed(Dtype::F16, 128, 1, 1), seed(Dtype::F16, 512, 1, 1), seed(Dtype::Bf16, 512, 2, 8)]);
    // Large shapes against the fp32 GPU reference.
    let large = |dtype, head_dim, causal, b, h, kv, sq, sk, layout, splits| Case {
        dtype,
        head_dim,
        causal,
        window: Window::default(),
        softcap: None,
        batch: b,
        heads: h,
        kv_heads: kv,
        seqlen_q: sq,
        seqlen_k: sk,
        layout,
        splits,
        lse: true,
        scale: None,
        gpu_reference: true,
        fp8: None,
        choice: PORTABLE,
    };
    cases.extend([
        large(Dtype::F16, 64, true, 2, 8, 8, 1024, 1024, Layout::Bshd, Splits::Auto),
        large(Dtype::Bf16, 128, false, 1, 16, 4, 2048, 2048, Layout::Bhsd, Splits::Auto),
        large(Dtype::F16, 128, true, 2, 4, 2, 1000, 3000, Layout::Bshd, Splits::Fixed(4)),
        large(Dtype::Bf16, 64, true, 1, 2, 1, 4096, 4096, Layout::Bhsd, Splits::Auto),
        large(Dtype::F16, 128, false, 1, 4, 4, 3000, 1001, Layout::Bhsd, Splits::Fixed(2)),
        // More work units than resident CTAs, an odd query-block count: persistent
        // causal CTAs run several units and pass over a pair's missing half.
        large(Dtype::Bf16, 64, true, 4, 16, 4, 960, 960, Layout::Bshd, Splits::Auto),
    ]);
    // Sliding windows and softcaps (FlashAttention's window_size and softcap),
    // each over lengths off every tile, Sq ≠ Sk both ways, 1 and 0: a band of
    // the diagonal alone, bands narrower and wider than a key tile, one
    // reaching right of the diagonal, one bounded on one side only, windows
    // that cover every key (then no mask, or causal), and capped scores under
    // each mask (cap 5 saturates: scores reach about 18 here; at scale 4 the
    // Hopper kernel's tiles without headroom are redone exactly).
    let w = |left: i64, right: i64| Window::from_pair(left, right).expect("a valid window");
    let banded = [
        (w(0, 0), false, None, None),
        (w(17, 0), false, None, None),
        (w(100, 30), false, None, None),
        (w(150, 7), true, None, None),
        (w(-1, 40), false, None, None),
        (w(64, -1), false, None, None),
        (w(5000, 5000), false, None, None),
        (w(5000, -1), true, None, None),
        (Window::default(), false, Some(5.0), None),
        (Window::default(), true, Some(5.0), None),
        (w(40, 0), false, Some(30.0), Some(4.0)),
        (w(33, 3), false, None, Some(4.0)),
    ];
    let lengths = [(1, 77), (65, 130), (200, 513), (130, 64), (300, 300), (0, 10)];
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for head_dim in HEAD_DIMS {
            for (wi, &(window, causal, softcap, scale)) in banded.iter().enumerate() {
                for (i, &(seqlen_q, seqlen_k)) in lengths.iter().enumerate() {
                    let r = i + wi;
                    let (heads, kv_heads) = gqa[r % 3];
                    cases.push(Case {
                        dtype,
                        head_dim,
                        causal,
                        window,
                        softcap,
                        batch: 1 + r % 2,
                        heads,
                        kv_heads,
                        seqlen_q,
                        seqlen_k,
                        layout: if r % 2 == 0 { Layout::Bshd } else { Layout::Bhsd },
                        splits: [Splits::Fixed(1), Splits::Fixed(3), Splits::Auto][r % 3],
                        lse: r % 2 == 1,
                        scale,
                        gpu_reference: false,
                        fp8: None,
                        choice: PORTABLE,
                    });
                }
            }
        }
    }
    // Bands of many key tiles, on long sequences, against the GPU reference;
    // Gemma 2's head dim, softcap and window.
    for (dtype, head_dim, window, causal, softcap) in [
        (Dtype::Bf16, 128, w(1000, 0), false, None),
        (Dtype::F16, 64, w(700, 300), false, Some(20.0)),
        (Dtype::F16, 128, w(-1, -1), true, Some(50.0)),
        (Dtype::Bf16, 64, w(513, 0), true, Some(50.0)),
        (Dtype::Bf16, 256, w(-1, -1), true, Some(50.0)),
        (Dtype::F16, 256, w(1023, 0), false, Some(50.0)),
        (Dtype::Bf16, 96, w(-1, -1), false, None),
        (Dtype::F16, 192, w(-1, -1), true, None),
    ] {
        cases.push(Case {
            window,
            softcap,
            ..large(dtype, head_dim, causal, 1, 8, 2, 3000, 4000, Layout::Bshd, Splits::Auto)
        });
    }
    // A partial last round of 192-row blocks on up to 132 SMs (266 or 532 units),
    // which the Hopper D=64 192-row entry runs as split-tail items
    // (planner::whole_units): one, two, three and more key tiles per item, a last
    // block's empty third, and key splits.
    for (dtype, seqlen_k, splits) in [
        (Dtype::F16, 100, Splits::Fixed(1)),
        (Dtype::Bf16, 250, Splits::Fixed(1)),
        (Dtype::F16, 300, Splits::Fixed(1)),
        (Dtype::Bf16, 700, Splits::Fixed(1)),
        (Dtype::F16, 700, Splits::Fixed(2)),
    ] {
        cases.push(large(dtype, 64, false, 1, 133, 7, 300, seqlen_k, Layout::Bshd, splits));
    }
    let mut cases = on_every_entry(cases);
    // The e4m3 D=128 192-row entry's split-tail items (266 units), against the
    // f64 reference of the dequantised inputs.
    for (seqlen_k, splits, outliers, out, layout, scale) in [
        (100, Splits::Fixed(1), false, Dtype::Bf16, Layout::Bshd, None),
        (700, Splits::Fixed(1), true, Dtype::F16, Layout::Bhsd, Some(0.3)),
        (700, Splits::Fixed(2), false, Dtype::Bf16, Layout::Bshd, None),
    ] {
        cases.push(Case {
            scale,
            gpu_reference: false,
            fp8: Some(Fp8 { out, outliers }),
            choice: HOPPER_E4M3_M192,
            ..large(Dtype::E4m3, 128, false, 1, 133, 7, 300, seqlen_k, layout, splits)
        });
    }
    cases.extend(e4m3_cases(1));
    cases
}

/// e4m3 inputs (head dims E4M3_HEAD_DIMS, no mask or causal, f16 and bf16
/// output) on both kernels (the Hopper kernel's D=64 dequantised): lengths
/// off every tile, Sq ≠ Sk both ways (causal rows
/// without keys), 1 and 0 (queries, and keys), GQA, both layouts, each split mode, and plain or
/// outlier-heavy inputs, every case with random descales. `every`: one case in
/// that many (the sanitize set's share; odd, so that both kernels keep cases).
fn e4m3_cases(every: usize) -> Vec<Case> {
    let lengths = [(1, 1), (1, 77), (65, 130), (200, 513), (130, 64), (0, 10), (10, 0), (300, 300), (513, 1000)];
    let gqa = [(2, 2), (4, 1), (6, 2)];
    let mut cases = Vec::new();
    // What every group shares but its own fields.
    let plain = Case {
        dtype: Dtype::E4m3,
        head_dim: 128,
        causal: false,
        window: Window::default(),
        softcap: None,
        batch: 1,
        heads: 2,
        kv_heads: 2,
        seqlen_q: 0,
        seqlen_k: 0,
        layout: Layout::Bhsd,
        splits: Splits::Fixed(1),
        lse: true,
        scale: None,
        gpu_reference: false,
        fp8: Some(Fp8 { out: Dtype::Bf16, outliers: false }),
        choice: PORTABLE,
    };
    for (oi, out) in [Dtype::Bf16, Dtype::F16].into_iter().enumerate() {
        for head_dim in E4M3_HEAD_DIMS {
            for causal in [false, true] {
                for (i, &(seqlen_q, seqlen_k)) in lengths.iter().enumerate() {
                    let r = i + oi + usize::from(causal);
                    let (heads, kv_heads) = gqa[r % 3];
                    cases.push(Case {
                        head_dim,
                        causal,
                        batch: 1 + r % 2,
                        heads,
                        kv_heads,
                        seqlen_q,
                        seqlen_k,
                        layout: if r % 2 == 0 { Layout::Bshd } else { Layout::Bhsd },
                        splits: [Splits::Fixed(1), Splits::Fixed(3), Splits::Auto][r % 3],
                        lse: r % 2 == 0,
                        scale: (i % 3 == 0).then_some(0.3),
                        fp8: Some(Fp8 { out, outliers: i % 2 == 1 }),
                        ..plain.clone()
                    });
                    cases.push(Case { choice: HOPPER, ..cases[cases.len() - 1].clone() });
                    if head_dim == 128 && !causal {
                        cases.push(Case { choice: HOPPER_E4M3_M192, ..cases[cases.len() - 1].clone() });
                    }
                }
            }
        }
    }
    // Windows and softcap, which run dequantised on both kernels.
    let w = |left: i64, right: i64| Window::from_pair(left, right).expect("a valid window");
    for (i, head_dim) in E4M3_HEAD_DIMS.into_iter().enumerate() {
        for (window, causal, softcap) in
            [(w(40, 9), false, None), (w(-1, -1), true, Some(20.0)), (w(100, 0), false, Some(30.0))]
        {
            for variant in [Variant::Portable, Variant::Hopper] {
                cases.push(Case {
                    head_dim,
                    causal,
                    window,
                    softcap,
                    batch: 2,
                    heads: 4,
                    seqlen_q: 130,
                    seqlen_k: 200 + 37 * i,
                    layout: Layout::Bshd,
                    splits: Splits::Auto,
                    choice: KernelChoice { variant, ..PORTABLE },
                    ..plain.clone()
                });
            }
        }
    }
    // Long rows on one split: FP8 wgmma's truncating sums lose O along the key
    // axis unless each tile's P·V is promoted to fp32 (15% of O at 16k keys);
    // at D=256 the Hopper kernel promotes it in two chains of columns.
    for (choice, head_dim) in [(PORTABLE, 128), (HOPPER, 128), (HOPPER_E4M3_M192, 128), (HOPPER, 256)] {
        for causal in [false, true] {
            if causal && choice.block_m == Some(192) {
                continue;
            }
            cases.push(Case { head_dim, causal, kv_heads: 1, seqlen_q: 64, seqlen_k: 16384, choice, ..plain.clone() });
        }
    }
    // Scores far above a row's first key tile (scale 1: about 12 log2 units a
    // standard deviation): the Hopper entries' kept max, in both schedules,
    // turns tiles down and redoes them exactly (HopperOperands::exp_pack_kept;
    // at D=256 from S computed again, kRedoFromK).
    for (choice, head_dim, causal) in [
        (HOPPER_E4M3_M192, 128, false),
        (HOPPER, 128, false),
        (HOPPER, 128, true),
        (HOPPER, 256, false),
        (HOPPER, 256, true),
    ] {
        for (i, out) in [Dtype::Bf16, Dtype::F16].into_iter().enumerate() {
            cases.push(Case {
                head_dim,
                causal,
                batch: 1 + i,
                kv_heads: 2 - i,
                seqlen_q: 400,
                seqlen_k: 700,
                scale: Some(1.0),
                fp8: Some(Fp8 { out, outliers: i == 1 }),
                choice,
                ..plain.clone()
            });
        }
    }
    // Causal Sq > Sk over several key tiles: items of rows that see no key
    // (one tile at most, the exact update), and items of two and three tiles
    // whose later tiles take the kept max across the diagonal.
    for (choice, head_dim) in [(PORTABLE, 128), (HOPPER, 128), (HOPPER, 256)] {
        cases.push(Case { head_dim, causal: true, seqlen_q: 700, seqlen_k: 300, choice, ..plain.clone() });
    }
    cases.into_iter().step_by(every.max(1)).collect()
}

/// A case of either kind: a dense call (`forward`) or a serving one (`forward_varlen`).
enum Item {
    Dense(Case),
    Serving(serving::Case),
}

impl Item {
    fn name(&self) -> String {
        match self {
            Item::Dense(c) => c.name(),
            Item::Serving(c) => c.name(),
        }
    }

    fn work(&self) -> f64 {
        match self {
            Item::Dense(c) => c.work(),
            Item::Serving(c) => c.work(),
        }
    }

    /// The kernel the case runs.
    fn variant(&self) -> Variant {
        match self {
            Item::Dense(c) => c.choice.variant,
            Item::Serving(c) => c.variant,
        }
    }

    /// The case, its f64 CPU reference on up to `threads` threads.
    fn run(&self, att: &Attention, rng: &mut Rng, threads: usize) -> TestCase {
        match self {
            Item::Dense(c) => run_case(att, c, rng, threads).unwrap_or_else(|e| not_run(c, &e)),
            Item::Serving(c) => serving::run_case(att, c, rng, threads).unwrap_or_else(|e| serving::not_run(c, &e)),
        }
    }
}

/// Scales the elements (b, s, d) that `picked(b, s, d)` names (whole rows or
/// channels of every head) by 16, as bits and values.
fn outliers(
    dtype: Dtype,
    desc: &Desc,
    bits: &mut [u16],
    vals: &mut [f32],
    picked: impl Fn(usize, usize, usize) -> bool,
) {
    let [batch, heads, seq, d] = desc.dims;
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                let off = desc.offset(b, h, s);
                for x in (0..d).filter(|&x| picked(b, s, x)) {
                    bits[off + x] = dtype.from_f32(vals[off + x] * 16.0);
                    vals[off + x] = dtype.to_f32(bits[off + x]);
                }
            }
        }
    }
}

/// The values of a [B, heads, S, D] tensor times their (batch, K/V head)'s
/// factor (`factors`: [B, kv_heads]), each rounded to `rounded` where given.
fn dequantise(desc: &Desc, vals: &mut [f32], factors: &[f32], kv_heads: usize, rounded: Option<Dtype>) {
    let [batch, heads, seq, d] = desc.dims;
    let group = heads / kv_heads.max(1);
    for b in 0..batch {
        for h in 0..heads {
            let f = factors[b * kv_heads + h / group.max(1)];
            for s in 0..seq {
                let off = desc.offset(b, h, s);
                for x in &mut vals[off..off + d] {
                    *x = rounded.map_or(*x * f, |r| r.to_f32(r.from_f32(*x * f)));
                }
            }
        }
    }
}

/// Random bits for a tensor, and the same values as f32 after rounding to dtype.
fn random(rng: &mut Rng, dtype: Dtype, desc: &Desc, lo: f32, hi: f32) -> (Vec<u16>, Vec<f32>) {
    let bits = rng.bits(dtype, desc.span(), lo, hi);
    let vals = bits.iter().map(|&b| dtype.to_f32(b)).collect();
    (bits, vals)
}

fn run_case(att: &Attention, case: &Case, rng: &mut Rng, threads: usize) -> Result<TestCase> {
    let Case { dtype, head_dim: d, batch: b, heads: h, kv_heads: hkv, seqlen_q: sq, seqlen_k: sk, .. } = *case;
    let out_dtype = case.precision().output;
    let qd = Desc::new([b, h, sq, d], case.layout);
    let kd = Desc::new([b, hkv, sk, d], case.layout);
    let (mut qb, mut qv) = random(rng, dtype, &qd, -1.5, 1.5);
    let (mut kb, mut kv) = random(rng, dtype, &kd, -1.5, 1.5);
    // Offset V so the output mean is not zero.
    let (vb, mut vv) = random(rng, dtype, &kd, -0.5, 1.5);
    let mut descales = None;
    if let Some(fp8) = case.fp8 {
        if fp8.outliers {
            outliers(dtype, &qd, &mut qb, &mut qv, |_, s, _| s % 29 == 3);
            outliers(dtype, &kd, &mut kb, &mut kv, |_, _, x| x % 17 == 5);
        }
        // Factors per (batch, K/V head); the reference takes the dequantised values,
        // rounded to the output's dtype where the call runs them so (Case::dequantised).
        let factors: [Vec<f32>; 3] = std::array::from_fn(|_| (0..b * hkv).map(|_| rng.uniform(0.5, 2.0)).collect());
        let rounded = case.dequantised()?.then_some(out_dtype);
        dequantise(&qd, &mut qv, &factors[0], hkv, rounded);
        dequantise(&kd, &mut kv, &factors[1], hkv, rounded);
        dequantise(&kd, &mut vv, &factors[2], hkv, rounded);
        descales = Some(factors);
    }
    let q = att.upload(dtype, qd, &qb)?;
    let k = att.upload(dtype, kd, &kb)?;
    let v = att.upload(dtype, kd, &vb)?;
    let mut out = att.alloc_poisoned(out_dtype, qd)?;
    let descales = match &descales {
        Some(f) => Some(f.iter().map(|f| att.stream().clone_htod(f)).collect::<Result<Vec<_>, _>>()?),
        None => None,
    };
    let rows = b * h * sq;
    let mut lse = if case.lse { Some(att.alloc_lse(rows)?) } else { None };
    let opts = Options {
        causal: case.causal,
        window: case.window,
        softcap: case.softcap,
        scale: case.scale,
        splits: case.splits,
        choice: case.choice,
    };
    let scores = case.scores()?;
    let given = descales.as_ref().map_or_else(Descales::default, |d| Descales {
        q: Some(&d[0]),
        k: Some(&d[1]),
        v: Some(&d[2]),
    });
    let launched = att.forward_descaled_on(att.stream(), &q, &k, &v, given, &mut out, lse.as_mut(), &opts)?;
    att.synchronize()?;
    let dequantised = case.dequantised()?;
    if !launched.kernel.is_empty() && launched.dequantised != dequantised {
        anyhow::bail!(
            "{} ran {}dequantised; this case expects it {}",
            launched.kernel,
            if launched.dequantised { "" } else { "not " },
            if dequantised { "dequantised (Case::dequantised)" } else { "on an e4m3 entry" }
        );
    }
    let got_bits = att.download(&out)?;
    let got_lse: Option<Vec<f32>> = match &lse {
        Some(l) => Some(att.download_lse(l, rows)?),
        None => None,
    };
    // A call's temporaries outlive the synchronisation of the downloads, kept
    // for the next call instead of mapped again (attention::scratch; where the
    // device has no such pool, `fa-test` says why once, at the start).
    let temporaries =
        launched.num_splits > 1 || launched.dequantised || dtype == Dtype::E4m3 && launched.family == Family::Hopper;
    if temporaries && !launched.kernel.is_empty() && matches!(att.scratch_bytes(), Ok(0)) {
        anyhow::bail!(
            "{}'s temporaries were given back at a synchronisation: the scratch pool is empty",
            launched.kernel
        );
    }

    let problem = Problem {
        batch: b,
        heads: h,
        kv_heads: hkv,
        seqlen_q: sq,
        seqlen_k: sk,
        head_dim: d,
        scale: case.scale.unwrap_or(1.0 / (d as f32).sqrt()),
    };
    let (want, want_lse) = if case.gpu_reference {
        let (o, l) = att.reference(&q, &k, &v, scores, case.scale)?;
        (o.into_iter().map(f64::from).collect::<Vec<_>>(), l.into_iter().map(f64::from).collect::<Vec<_>>())
    } else {
        reference::attention_on(
            threads,
            &HostTensor { desc: qd, data: &qv },
            &HostTensor { desc: kd, data: &kv },
            &HostTensor { desc: kd, data: &vv },
            &problem,
            scores,
        )
    };
    // The output in logical [B, H, Sq, D] order, whatever its layout.
    let mut got = Vec::with_capacity(rows * d);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..sq {
                let off = qd.offset(bi, hi, si);
                got.extend(got_bits[off..off + d].iter().map(|&x| f64::from(out_dtype.to_f32(x))));
            }
        }
    }
    // e4m3 inputs run dequantised to 16 bits take that dtype's numerics.
    let (tol_rel_l2, tol_max_abs, tol_lse_row) = tolerances(if dequantised { out_dtype } else { dtype });
    // e4m3 inputs' scores reach thousands where they carry outliers: a row's
    // scores are off by up to ε·M_i (M_i its largest scale·Σ|q·k|; ε by how the
    // entry sums Q·Kᵀ: check::E4M3_WGMMA_QK_EPS, FP32_QK_EPS), its LSE by as much
    // and its output by a further (e^{2ε·M_i} − 1)·max|v|; where that reaches
    // 2·max|v| (O is an average of values), the row is left open to max_abs.
    let magnitudes = if dtype == Dtype::E4m3 {
        let (q, k) = (HostTensor { desc: qd, data: &qv }, HostTensor { desc: kd, data: &kv });
        reference::score_magnitudes_on(threads, &q, &k, &problem, scores)
    } else {
        Vec::new()
    };
    let eps = if dtype == Dtype::E4m3 && !dequantised && launched.family == Family::Hopper {
        E4M3_WGMMA_QK_EPS
    } else {
        FP32_QK_EPS
    };
    let lse_allowance = |i: usize| magnitudes.get(i).map_or(0.0, |m| eps * m);
    let v_max = vv.iter().fold(0.0f64, |a, &x| a.max(f64::from(x).abs()));
    let open = |i: usize| (2.0 * lse_allowance(i)).exp_m1() >= 2.0;
    let o_allowance = |i: usize| if open(i) { 2.0 * v_max } else { (2.0 * lse_allowance(i)).exp_m1() * v_max };
    // A row whose bound that leaves open is held to 2·max|v| (O is an average
    // of values) and counts in the whole output's relative L2; not to a
    // relative L2 among such rows alone: within its score error two of its
    // keys can trade places, and one such row of 28 put them at 2.9e-2.
    let mut o_excess = 0.0f64;
    for (i, (g, w)) in got.chunks(d.max(1)).zip(want.chunks(d.max(1))).enumerate() {
        let worst = g.iter().zip(w).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        o_excess = o_excess.max(worst - o_allowance(i));
    }
    let errs = compare(got, &want);
    let (lse_max_abs, lse_bad, lse_excess) = match &got_lse {
        Some(g) => compare_lse_within(g, &want_lse, lse_allowance),
        None => (0.0, 0, 0.0),
    };
    // Reported: the widest row's bounds.
    let widest = |f: &dyn Fn(usize) -> f64| (0..magnitudes.len()).map(f).fold(0.0, f64::max);
    let (tol_max_abs_widest, tol_lse) = (tol_max_abs + widest(&o_allowance), tol_lse_row + widest(&lse_allowance));
    let passed = errs.non_finite == 0
        && lse_bad == 0
        && errs.rel_l2 <= tol_rel_l2
        && o_excess <= tol_max_abs
        && lse_excess <= tol_lse_row;
    Ok(TestCase {
        name: case.name(),
        gpu: None,
        dtype: case.precision().name(),
        shape: case.shape(),
        layout: case.layout_label().into(),
        entry: launched.entry_record(),
        splits: case.splits.to_string(),
        num_splits: launched.num_splits,
        lse: case.lse,
        reference: if case.gpu_reference { "gpu-f32" } else { "cpu-f64" }.into(),
        rel_l2: errs.rel_l2,
        max_abs: errs.max_abs,
        lse_max_abs,
        tol_rel_l2,
        tol_max_abs: tol_max_abs_widest,
        tol_lse,
        non_finite: errs.non_finite + lse_bad,
        passed,
        seconds: 0.0,
        error: None,
    })
}

/// The record of a case that could not run: `error` says why.
fn not_run(case: &Case, e: &anyhow::Error) -> TestCase {
    TestCase {
        name: case.name(),
        gpu: None,
        dtype: case.precision().name(),
        shape: case.shape(),
        layout: case.layout_label().into(),
        entry: EntryRecord {
            variant: case.choice.variant.name().into(),
            block_m: case.choice.block_m.unwrap_or(0),
            key_groups: case.choice.key_groups.unwrap_or(0),
            persistent: case.choice.persistent.unwrap_or(false),
            ..EntryRecord::default()
        },
        splits: case.splits.to_string(),
        num_splits: 0,
        lse: case.lse,
        reference: String::new(),
        rel_l2: f64::NAN,
        max_abs: f64::NAN,
        lse_max_abs: f64::NAN,
        tol_rel_l2: 0.0,
        tol_max_abs: 0.0,
        tol_lse: 0.0,
        non_finite: 0,
        passed: false,
        error: Some(format!("{e:#}")),
        seconds: 0.0,
    }
}

#[derive(clap::Parser)]
#[command(about = "Correctness matrix of the attention kernels against f64 CPU / fp32 GPU references", version = kernel_ffi::cli::VERSION)]
struct Args {
    /// GPU to run on: a CUDA ordinal among the visible devices, or a UUID as
    /// `nvidia-smi -L` prints it.
    #[arg(long, env = fa_schema::env::DEVICE, default_value = "0")]
    device: kernel_ffi::Gpu,
    /// Write the results here as JSON (else to stdout).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Only cases whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// Seed for the random inputs (default: from the clock, printed and recorded).
    #[arg(long)]
    seed: Option<u64>,
    /// Which cases.
    #[arg(long, value_enum, default_value_t = Set::Full)]
    set: Set,
    /// List the case names and exit (with --json: names and work, as JSON).
    #[arg(long, conflicts_with = "info")]
    list: bool,
    /// Only the cases named in FILE, one exact name a line (as --list prints them).
    #[arg(long, value_name = "FILE")]
    cases: Option<std::path::PathBuf>,
    /// Print the device (JSON) and exit: proves the driver loads the fatbins.
    #[arg(long)]
    info: bool,
    /// Run the cases named on stdin, one a line, answering each with a JSON line
    /// on stdout (`WorkerReply`), after a first line saying it is ready: one
    /// process per GPU, fed by `cargo xtask test --gpus`.
    #[arg(long, conflicts_with_all = ["list", "info", "json", "cases"])]
    worker: bool,
    /// Threads for the f64 CPU reference (default: this machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    /// Only this kernel's cases: portable or hopper (default: both, Hopper where loaded).
    #[arg(long, value_parser = case_variant)]
    variant: Option<Variant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Set {
    /// The correctness matrix.
    Full,
    /// Small shapes that reach every entry and code path (what compute-sanitizer runs).
    Sanitize,
    /// One case.
    Smoke,
}

/// `--variant`: a case names its kernel, so `auto` selects nothing.
fn case_variant(s: &str) -> Result<Variant, String> {
    match s.parse::<Variant>()? {
        Variant::Auto => {
            Err("cases name their kernel: use portable or hopper (or leave --variant out for both)".into())
        }
        v => Ok(v),
    }
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// The cases `text` names (one a line, blank lines ignored), in the matrix's
/// order; a name the matrix lacks is an error naming it.
fn named(cases: Vec<Item>, text: &str) -> std::result::Result<Vec<Item>, String> {
    let wanted: std::collections::HashSet<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let known: std::collections::HashSet<String> = cases.iter().map(Item::name).collect();
    let mut unknown: Vec<&str> = wanted.iter().copied().filter(|w| !known.contains(*w)).collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(format!("no such case: {} (see fa-test --list)", unknown.join(", ")));
    }
    Ok(cases.into_iter().filter(|c| wanted.contains(c.name().as_str())).collect())
}

/// One case, its inputs drawn from `seed` and its name (so the same seed gives
/// a case the same inputs whatever ran before it), timed, its line on stderr
/// (`[at] ok|FAIL …`); and whether its CUDA error lost the context, so that no
/// later case can run in this process.
fn run_one(case: &Item, att: &Attention, (seed, threads): (u64, usize), at: &str) -> (TestCase, bool) {
    let t = Instant::now();
    let name = case.name();
    let mut rng = Rng::new(seed ^ fnv1a(name.as_bytes()));
    let mut result = case.run(att, &mut rng, threads);
    result.seconds = t.elapsed().as_secs_f64();
    let mark = if result.passed { "ok" } else { "FAIL" };
    eprintln!(
        "[{at}] {mark} {name} rel_l2 {:.2e} max_abs {:.2e}{}",
        result.rel_l2,
        result.max_abs,
        result.error.as_deref().map(|e| format!(" error: {e}")).unwrap_or_default()
    );
    let fatal = result.error.as_deref().is_some_and(|e| e.contains("CUDA error"));
    if fatal {
        // A kernel fault poisons the context: later cases would only repeat it.
        eprintln!("fa-test: stopping after a CUDA error");
    }
    (result, fatal)
}

/// FNV-1a over `bytes`: a case name's share of its inputs' seed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `--worker`: a ready line, then a reply per case name read on stdin, until
/// the input ends or a CUDA error loses the context.
fn work_on_names(
    cases: Vec<Item>,
    skipped: Vec<SkippedCase>,
    att: &Attention,
    (seed, threads): (u64, usize),
    setup_s: f64,
) -> Result<()> {
    use std::io::{BufRead, Write};
    let known: std::collections::HashMap<String, Item> = cases.into_iter().map(|c| (c.name(), c)).collect();
    let skipped: std::collections::HashMap<String, SkippedCase> =
        skipped.into_iter().map(|s| (s.name.clone(), s)).collect();
    let reply = |r: &WorkerReply| -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(r)?).and_then(|()| out.flush()).context("writing a reply")
    };
    reply(&WorkerReply::Ready { device: att.device().clone(), seed, setup_s })?;
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let name = line.context("reading a case name")?.trim().to_string();
        let answer = match (known.get(&name), skipped.get(&name)) {
            (Some(case), _) => {
                let (case, last) = run_one(case, att, (seed, threads), &(i + 1).to_string());
                WorkerReply::Ran { case: Box::new(case), last }
            }
            (None, Some(s)) => WorkerReply::Skipped { case: s.clone() },
            (None, None) => WorkerReply::Unknown { name },
        };
        reply(&answer)?;
        if matches!(answer, WorkerReply::Ran { last: true, .. }) {
            break;
        }
    }
    Ok(())
}

/// `--list`: names, or with `json` names and work as JSON.
fn list_cases(cases: &[Item], json: Option<&std::path::Path>) -> Result<()> {
    if let Some(path) = json {
        let listed: Vec<ListedCase> = cases.iter().map(|c| ListedCase { name: c.name(), work: c.work() }).collect();
        return cli::write_atomic(path, serde_json::to_string_pretty(&listed)?.as_bytes());
    }
    cli::print(&cases.iter().map(|c| c.name() + "\n").collect::<String>())
}

/// The cases this GPU's kernel set runs, and the others with why: Hopper
/// cases off sm_90, e4m3 cases below sm_89, and cases for an entry geometry the build's configuration
/// does not have.
fn runnable_here(cases: Vec<Item>, att: &Attention) -> (Vec<Item>, Vec<SkippedCase>) {
    let hopper = att.has_hopper();
    let mut skipped = Vec::new();
    let mut kept = Vec::new();
    for c in cases {
        let why = if c.variant() == Variant::Hopper && !hopper {
            Some(format!("{} is not sm_90: no Hopper kernel", att.device().name))
        } else if let Item::Dense(d) = &c
            && d.dtype == Dtype::E4m3
            && !has_geometry(att, d, &KernelChoice { variant: d.choice.variant, ..PORTABLE })
        {
            Some(format!("{} has no e4m3 entries (built for sm_89 and sm_90)", att.device().name))
        } else if let Item::Dense(d) = &c
            && !has_geometry(att, d, &d.choice)
        {
            Some(
                "it pins a tile geometry (block_m, key groups, persistence) this build's manifest does not configure"
                    .to_string(),
            )
        } else {
            None
        };
        match why {
            Some(why) => skipped.push(SkippedCase { name: c.name(), why }),
            None => kept.push(c),
        }
    }
    (kept, skipped)
}

/// Whether the kernel set has an entry of `choice`'s geometry for the case's problem.
fn has_geometry(att: &Attention, c: &Case, choice: &KernelChoice) -> bool {
    choice.variant.family().is_none_or(|family| {
        let Ok(scores) = c.scores() else { return true }; // the case reports the error
        let loaded = att.geometries(family, c.precision(), c.head_dim, scores);
        loaded.iter().any(|&(m, g, pers)| {
            choice.block_m.is_none_or(|cm| cm == m)
                && choice.key_groups.is_none_or(|cg| cg == g)
                && choice.persistent.is_none_or(|cp| cp == pers)
        })
    })
}

/// Exit 1 unless some case ran and every case passed.
fn verdict(cases: &[TestCase]) -> Result<()> {
    if cases.is_empty() {
        return Err(CheckFailed("no test case ran (does --filter match any name in --list?)".into()).into());
    }
    let failed: Vec<&str> = cases.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let more = if failed.len() > 10 { ", …" } else { "" };
    Err(CheckFailed(format!(
        "{} of {} cases failed: {}{more}",
        failed.len(),
        cases.len(),
        failed[..failed.len().min(10)].join(", ")
    ))
    .into())
}

fn run() -> Result<()> {
    let started = Instant::now();
    let Args { json, filter, seed, set, list, cases: only, info, worker, threads, variant, device } =
        clap::Parser::parse();
    let threads = threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), usize::from);
    let (dense, serving) = match set {
        Set::Full => (matrix(), serving::matrix()),
        Set::Sanitize => (sanitize_set(), serving::sanitize_set()),
        Set::Smoke => (vec![sanitize_set_ref(Dtype::F16)], vec![]),
    };
    let all = dense.into_iter().map(Item::Dense).chain(serving.into_iter().map(Item::Serving));
    let mut cases: Vec<Item> = all
        .filter(|c| filter.as_ref().is_none_or(|f| c.name().contains(f.as_str())))
        .filter(|c| variant.is_none_or(|v| v == c.variant()))
        .collect();
    if let Some(path) = &json {
        fa_schema::file::check_target(path).context("--json")?;
    }
    if let Some(file) = only {
        let text = fa_schema::file::read_text(&file).with_context(|| format!("reading --cases {}", file.display()))?;
        cases = named(cases, &text).map_err(|e| anyhow::anyhow!("--cases {}: {e}", file.display()))?;
    }
    if list {
        return list_cases(&cases, json.as_deref());
    }
    let seed = seed
        .unwrap_or_else(|| SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
    let kernels = kernel_ffi::kernel_dir::find()?;
    let att = Attention::with_kernel_dir(&device, &kernels).context("setting up the kernels")?;
    if info {
        return cli::print(&format!("{}\n", serde_json::to_string(att.device())?));
    }
    if variant == Some(Variant::Hopper) && !att.has_hopper() {
        anyhow::bail!("--variant hopper: {} has no Hopper kernel (needs sm_90)", att.device().name);
    }
    if let Err(e) = att.scratch_bytes() {
        eprintln!("fa-test: not checking that calls keep their temporaries: {e}");
    }
    let (cases, skipped) = runnable_here(cases, &att);
    if !skipped.is_empty() {
        let why: std::collections::BTreeSet<&str> = skipped.iter().map(|s| s.why.as_str()).collect();
        let why: Vec<&str> = why.into_iter().collect();
        eprintln!("fa-test: {} cases skipped: {}", skipped.len(), why.join("; "));
    }
    let setup_s = started.elapsed().as_secs_f64();
    if worker {
        return work_on_names(cases, skipped, &att, (seed, threads), setup_s);
    }
    eprintln!(
        "fa-test: {} cases on {} (sm count {}), seed {seed}",
        cases.len(),
        att.device().name,
        att.device().sm_count
    );
    let mut results = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (result, fatal) = run_one(case, &att, (seed, threads), &format!("{}/{}", i + 1, cases.len()));
        results.push(result);
        if fatal {
            break;
        }
    }
    eprintln!("fa-test: {:.1} s ({setup_s:.1} s setting up)", started.elapsed().as_secs_f64());
    let run = TestRun { device: att.device().clone(), seed, setup_s, cases: results, skipped };
    let text = serde_json::to_string_pretty(&run)?;
    match json {
        Some(path) => cli::write_atomic(&path, text.as_bytes())?,
        None => cli::print(&format!("{text}\n"))?,
    }
    verdict(&run.cases)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    fn case(name: &str, passed: bool) -> TestCase {
        TestCase { name: name.into(), passed, ..not_run(&sanitize_set_ref(Dtype::F16), &anyhow::anyhow!("test")) }
    }

    #[test]
    fn a_failed_case_is_a_failed_check() {
        assert!(verdict(&[case("a", true), case("b", true)]).is_ok());
        let e = verdict(&[case("a", true), case("b", false)]).unwrap_err();
        assert_eq!(cli::exit_code(&Err(e)), 1);
        let e = verdict(&[case("a", true), case("b", false)]).unwrap_err().to_string();
        assert_eq!(e, "1 of 2 cases failed: b");
        let many: Vec<TestCase> = (0..12).map(|i| case(&format!("c{i}"), false)).collect();
        assert!(verdict(&many).unwrap_err().to_string().ends_with("c8, c9, …"));
        let e = verdict(&[]).unwrap_err();
        assert!(e.to_string().contains("no test case ran"));
        assert_eq!(cli::exit_code(&Err(e)), 1);
    }

    #[test]
    fn auto_is_refused_when_the_flags_are_parsed() {
        let e = Args::try_parse_from(["fa-test", "--variant", "auto"]).err().expect("--variant auto parsed");
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(e.to_string().contains("cases name their kernel"), "{e}");
        assert!(Args::try_parse_from(["fa-test", "--set", "huge"]).is_err());
        let args = Args::try_parse_from(["fa-test", "--variant", "hopper", "--set", "smoke"]).unwrap();
        assert_eq!((args.variant, args.set), (Some(Variant::Hopper), Set::Smoke));
    }

    #[test]
    fn every_flag_is_described() {
        Args::command().debug_assert();
        for arg in Args::command().get_arguments() {
            assert!(arg.get_help().is_some(), "--{} has no description", arg.get_id());
        }
    }
}
