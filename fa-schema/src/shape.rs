//! The shapes the bench and the gate time: `B,H,S,D[,causal][,window=W][,softcap=C]`
//! as flags and names, checked by the launch API's rules (`tensor::validate`)
//! when parsed.

use crate::tensor::{Arg, Desc, Dtype, Layout, validate};

/// Matrix-product FLOPs of an attention forward by the usual convention (the
/// one FlashAttention papers and the bench's TFLOP/s use): 4·B·H·Sq·Sk·D, halved
/// for causal.
pub fn attention_flops(
    batch: usize,
    heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    causal: bool,
) -> f64 {
    let f = 4.0 * (batch * heads) as f64 * seqlen_q as f64 * seqlen_k as f64 * head_dim as f64;
    if causal { f / 2.0 } else { f }
}

/// Query-key pairs a band keeps: row i of `sq` sees keys i + sk − sq − left …
/// i + sk − sq + right of `sk` (bottom-right aligned, as the kernels), `None`
/// unbounded. What a windowed shape's FLOPs are counted on.
///
/// ```
/// use fa_schema::shape::kept_pairs;
///
/// assert_eq!(kept_pairs(4, 4, None, Some(0)), 10); // causal: 1 + 2 + 3 + 4
/// assert_eq!(kept_pairs(4, 4, Some(1), Some(0)), 7); // 1 + 2 + 2 + 2
/// assert_eq!(kept_pairs(3, 5, None, None), 15);
/// ```
pub fn kept_pairs(sq: usize, sk: usize, left: Option<usize>, right: Option<usize>) -> u64 {
    (0..sq as i64)
        .map(|i| {
            let diag = i + sk as i64 - sq as i64;
            let lo = left.map_or(0, |l| (diag - l as i64).max(0));
            let hi = right.map_or(sk as i64 - 1, |r| (diag + r as i64).min(sk as i64 - 1));
            (hi - lo + 1).max(0) as u64
        })
        .sum()
}

/// How a bench shape's sequences lie: one dense batch, or a serving batch of
/// sequences of different lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batching {
    /// q, k and v all [batch, heads, seqlen, head_dim].
    #[default]
    Dense,
    /// Prefill of `batch` packed sequences of [`Shape::lengths`] rows (the
    /// longest `seqlen`), queries and keys alike, on `kv_heads` K/V heads.
    Varlen {
        /// K/V heads.
        kv_heads: usize,
    },
    /// Decode: one query row per sequence against a paged cache of
    /// [`Shape::lengths`] keys (the longest `seqlen`) in pages of `page_size`.
    Paged {
        /// K/V heads.
        kv_heads: usize,
        /// Keys per page.
        page_size: usize,
    },
}

/// A shape the bench times: a dense self-attention batch
/// (`B,H,S,D[,causal][,window=W][,softcap=C]`: a sliding window of W keys each
/// side of the diagonal, left only when causal, FlashAttention's `window_size`
/// (W, W) or (W, 0); Gemma 2's logit softcap C), or a serving batch, `varlen:B,H,HKV,S,D[,causal]` (prefill of B packed
/// sequences, the longest S) or `paged:B,H,HKV,S,D,PAGE` (decode of B sequences
/// against a paged cache, the longest S keys).
///
/// ```
/// use fa_schema::shape::Shape;
/// use fa_schema::tensor::Dtype;
///
/// let s = Shape::parse("2,16,8192,128,causal").unwrap();
/// assert_eq!((s.batch, s.heads, s.seqlen, s.head_dim, s.causal), (2, 16, 8192, 128, true));
/// assert_eq!(s.spec(), "2,16,8192,128,causal");
/// assert_eq!(s.name(Dtype::F16), "f16-b2h16s8192d128-causal");
/// // Refused when parsed: the kernels have no head dim 80.
/// assert!(Shape::parse("1,1,128,80").unwrap_err().contains("head dims [64, 96, 128, 192, 256]"));
///
/// let w = Shape::parse("1,16,32768,128,causal,window=4096,softcap=50").unwrap();
/// assert_eq!((w.window, w.softcap), (Some(4096), Some(50)));
/// assert_eq!(w.name(Dtype::Bf16), "bf16-b1h16s32768d128-causal-w4096-cap50");
///
/// let d = Shape::parse("paged:64,32,8,32768,128,16").unwrap();
/// assert_eq!(d.name(Dtype::Bf16), "bf16-paged16-b64h32kv8s32768d128");
/// assert_eq!(d.lengths().1.iter().max(), Some(&32768));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// B: batch or sequences.
    pub batch: usize,
    /// H, query heads (the k/v heads too when dense).
    pub heads: usize,
    /// Queries and keys per head; serving: the longest sequence's.
    pub seqlen: usize,
    /// D.
    pub head_dim: usize,
    /// Whether the causal mask applies.
    pub causal: bool,
    /// Dense only: a sliding window of this many keys each side of the
    /// diagonal (left only when causal).
    pub window: Option<usize>,
    /// Dense only: the logit softcap.
    pub softcap: Option<u32>,
    /// Dense or a serving batch.
    pub batching: Batching,
}

impl Shape {
    /// A dense shape.
    pub fn dense(batch: usize, heads: usize, seqlen: usize, head_dim: usize, causal: bool) -> Shape {
        Shape { batch, heads, seqlen, head_dim, causal, window: None, softcap: None, batching: Batching::Dense }
    }

    /// K/V heads.
    pub fn kv_heads(&self) -> usize {
        match self.batching {
            Batching::Dense => self.heads,
            Batching::Varlen { kv_heads } | Batching::Paged { kv_heads, .. } => kv_heads,
        }
    }

    /// Each sequence's (query rows, keys). Dense: B × (S, S). Varlen: lengths
    /// 1 + (S − 1)·(i / (B − 1))³, from 1 to S and mostly short (B16 S8192:
    /// about 35k tokens). Paged: one query row against S/32 … S keys spread
    /// evenly, in an order that mixes long and short.
    pub fn lengths(&self) -> (Vec<usize>, Vec<usize>) {
        let (b, s) = (self.batch, self.seqlen);
        match self.batching {
            Batching::Dense => (vec![s; b], vec![s; b]),
            Batching::Varlen { .. } => {
                let spread = (0..b).map(|i| {
                    let x = if b > 1 { i as f64 / (b - 1) as f64 } else { 1.0 };
                    1 + ((s - 1) as f64 * x * x * x).round() as usize
                });
                let lens: Vec<usize> = spread.collect();
                (lens.clone(), lens)
            }
            Batching::Paged { .. } => {
                let lo = (s / 32).max(1);
                let keys = (0..b).map(|i| {
                    let j = (i * 7) % b.max(1); // 7 is prime to any batch not a multiple of 7
                    let x = if b > 1 { j as f64 / (b - 1) as f64 } else { 1.0 };
                    lo + ((s - lo) as f64 * x).round() as usize
                });
                (vec![1; b], keys.collect())
            }
        }
    }

    /// FlashAttention's `window_size` of a windowed shape: (W, W), or (W, 0) when causal.
    pub fn window_size(&self) -> Option<(usize, usize)> {
        self.window.map(|w| (w, if self.causal { 0 } else { w }))
    }

    /// The name reports and the gate key results by, e.g.
    /// `f16-b2h16s8192d128-causal`, `bf16-varlen-b16h32kv8s8192d128-causal`,
    /// `bf16-b1h16s32768d128-causal-w4096-cap50`.
    pub fn name(&self, dtype: Dtype) -> String {
        let (kind, kv) = match self.batching {
            Batching::Dense => (String::new(), String::new()),
            Batching::Varlen { kv_heads } => ("varlen-".to_string(), format!("kv{kv_heads}")),
            Batching::Paged { kv_heads, page_size } => (format!("paged{page_size}-"), format!("kv{kv_heads}")),
        };
        format!(
            "{}-{kind}b{}h{}{kv}s{}d{}{}{}{}",
            dtype.name(),
            self.batch,
            self.heads,
            self.seqlen,
            self.head_dim,
            if self.causal { "-causal" } else { "" },
            self.window.map_or(String::new(), |w| format!("-w{w}")),
            self.softcap.map_or(String::new(), |c| format!("-cap{c}")),
        )
    }

    /// Whether calls of this shape take inputs of `dtype`: serving shapes
    /// take 16-bit inputs only (kernel-ffi refuses e4m3 serving calls), so
    /// benches and the gate leave those pairs out.
    pub fn takes(&self, dtype: Dtype) -> bool {
        self.batching == Batching::Dense || dtype.is_output()
    }

    /// What `parse` reads.
    pub fn spec(&self) -> String {
        let causal = if self.causal { ",causal" } else { "" };
        let (b, h, s, d) = (self.batch, self.heads, self.seqlen, self.head_dim);
        let window = self.window.map_or(String::new(), |w| format!(",window={w}"));
        let softcap = self.softcap.map_or(String::new(), |c| format!(",softcap={c}"));
        match self.batching {
            Batching::Dense => format!("{b},{h},{s},{d}{causal}{window}{softcap}"),
            Batching::Varlen { kv_heads } => format!("varlen:{b},{h},{kv_heads},{s},{d}{causal}"),
            Batching::Paged { kv_heads, page_size } => format!("paged:{b},{h},{kv_heads},{s},{d},{page_size}"),
        }
    }

    /// Matrix-product FLOPs: [`attention_flops`] per sequence, summed; a
    /// windowed shape's on the pairs its band keeps ([`kept_pairs`]).
    pub fn flops(&self) -> f64 {
        if let Some((left, right)) = self.window_size() {
            let pairs = kept_pairs(self.seqlen, self.seqlen, Some(left), Some(right)) as f64;
            return 4.0 * (self.batch * self.heads * self.head_dim) as f64 * pairs;
        }
        let (q, k) = self.lengths();
        q.iter().zip(&k).map(|(&sq, &sk)| attention_flops(1, self.heads, sq, sk, self.head_dim, self.causal)).sum()
    }

    /// Bytes of K and V the call must read (16-bit elements): what a decode
    /// call's bandwidth is counted on.
    pub fn kv_bytes(&self) -> f64 {
        let keys: usize = self.lengths().1.iter().sum();
        (2 * 2 * keys * self.kv_heads() * self.head_dim) as f64
    }

    /// A shape spec (see [`Shape`]), each count at least 1, within the launch
    /// API's rules (`tensor::validate`), so that a bad shape is refused before
    /// any CUDA call.
    pub fn parse(s: &str) -> Result<Shape, String> {
        let (kind, body) = match s.split_once(':') {
            Some((kind, body)) => (Some(kind.trim()), body),
            None => (None, s),
        };
        let parts: Vec<&str> = body.split(',').map(str::trim).collect();
        let n =
            |i: usize| parts[i].parse::<usize>().map_err(|_| format!("`{}` in shape `{s}` is not a number", parts[i]));
        let causal_at = |i: usize| match parts.get(i) {
            None => Ok(false),
            Some(&"causal") => Ok(true),
            Some(other) => Err(format!("`{other}` in shape `{s}`: the last field may only be `causal`")),
        };
        let shape = match kind {
            None => {
                if parts.len() < 4 {
                    return Err(format!("shape `{s}` must be B,H,S,D[,causal][,window=W][,softcap=C]"));
                }
                let mut shape = Shape::dense(n(0)?, n(1)?, n(2)?, n(3)?, false);
                for &part in &parts[4..] {
                    let count = |v: &str| {
                        v.parse::<usize>()
                            .ok()
                            .filter(|&x| x >= 1)
                            .ok_or_else(|| format!("`{part}` in shape `{s}`: expected a whole number ≥ 1"))
                    };
                    match part.split_once('=') {
                        None if part == "causal" && !shape.causal => shape.causal = true,
                        Some(("window", v)) if shape.window.is_none() => shape.window = Some(count(v)?),
                        Some(("softcap", v)) if shape.softcap.is_none() => {
                            shape.softcap =
                                Some(u32::try_from(count(v)?).map_err(|_| format!("softcap {v} is too large"))?)
                        }
                        _ => {
                            return Err(format!(
                                "`{part}` in shape `{s}`: after B,H,S,D come `causal`, `window=W` and `softcap=C`, each once"
                            ));
                        }
                    }
                }
                shape
            }
            Some("varlen") => {
                if !(5..=6).contains(&parts.len()) {
                    return Err(format!("shape `{s}` must be varlen:B,H,HKV,S,D or varlen:B,H,HKV,S,D,causal"));
                }
                let batching = Batching::Varlen { kv_heads: n(2)? };
                Shape { batching, ..Shape::dense(n(0)?, n(1)?, n(3)?, n(4)?, causal_at(5)?) }
            }
            Some("paged") => {
                if parts.len() != 6 {
                    return Err(format!("shape `{s}` must be paged:B,H,HKV,S,D,PAGE"));
                }
                let batching = Batching::Paged { kv_heads: n(2)?, page_size: n(5)? };
                Shape { batching, ..Shape::dense(n(0)?, n(1)?, n(3)?, n(4)?, false) }
            }
            Some(other) => return Err(format!("`{other}:` in shape `{s}`: the kinds are varlen: and paged:")),
        };
        let page = match shape.batching {
            Batching::Paged { page_size, .. } => page_size,
            _ => 1,
        };
        if [shape.batch, shape.heads, shape.kv_heads(), shape.seqlen, page].contains(&0) {
            return Err(format!("shape `{s}`: batch, heads, sequence length and page size must be at least 1"));
        }
        let (sq, sk) = match shape.batching {
            Batching::Dense => (shape.seqlen, shape.seqlen),
            Batching::Varlen { .. } => (shape.seqlen, shape.seqlen),
            Batching::Paged { .. } => (1, shape.seqlen),
        };
        let desc = |h, n| Desc::new([shape.batch, h, n, shape.head_dim], Layout::Bhsd);
        let arg = |name, desc: Desc| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
        let (q, kv) = (desc(shape.heads, sq), desc(shape.kv_heads(), sk));
        validate(arg("q", q), arg("k", kv), arg("v", kv), arg("out", q), None)
            .map_err(|e| format!("shape `{s}`: {e}"))?;
        Ok(shape)
    }
}

/// The default set: the seed's small shapes, the large ones, a windowed, a
/// softcapped and two head-dim-256 ones (causal and not), and two serving
/// batches (a ragged causal prefill and a paged decode).
pub fn default_shapes() -> Vec<Shape> {
    let s = Shape::dense;
    let mut v: Vec<Shape> = [32, 64, 128, 256, 512].iter().map(|&n| s(1, 1, n, 64, false)).collect();
    v.extend([
        s(2, 8, 512, 64, false),
        s(1, 16, 512, 128, false),
        s(4, 16, 2048, 64, false),
        s(4, 16, 2048, 128, false),
        s(2, 16, 8192, 128, false),
        s(2, 16, 8192, 128, true),
        s(8, 32, 1024, 64, true),
        // Causal grids that leave SMs idle when unsplit (planner::plan_simulated).
        s(1, 4, 2048, 64, true),
        s(1, 1, 8192, 128, true),
        // Mistral's sliding window on a long sequence; Gemma 2's softcap and head dim.
        Shape { window: Some(4096), ..s(1, 16, 32768, 128, true) },
        Shape { softcap: Some(50), ..s(2, 16, 4096, 128, true) },
        s(2, 8, 4096, 256, false),
        s(2, 8, 4096, 256, true),
    ]);
    v.extend(serving_shapes());
    v
}

/// The serving shapes of the default set: 16 causal sequences of 1 to 8192
/// tokens, 32 query heads on 8; decode of 64 sequences with 1k to 32k cached
/// keys in pages of 16.
pub fn serving_shapes() -> Vec<Shape> {
    vec![
        Shape { batching: Batching::Varlen { kv_heads: 8 }, ..Shape::dense(16, 32, 8192, 128, true) },
        Shape { batching: Batching::Paged { kv_heads: 8, page_size: 16 }, ..Shape::dense(64, 32, 32768, 128, false) },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_and_names() {
        let s = Shape::dense(4, 16, 2048, 64, false);
        assert_eq!(s.flops(), 4.0 * 64.0 * 2048.0 * 2048.0 * 64.0);
        assert_eq!(Shape { causal: true, ..s }.flops(), s.flops() / 2.0);
        assert_eq!(s.name(Dtype::Bf16), "bf16-b4h16s2048d64");
    }

    #[test]
    fn shape_parsing() {
        assert_eq!(Shape::parse("2,16,8192,128,causal").unwrap().seqlen, 8192);
        assert!(Shape::parse("2,16,8192,128,causal").unwrap().causal);
        assert!(Shape::parse("2,16,8192").unwrap_err().contains("B,H,S,D"));
        assert!(Shape::parse("2,16,x,128").unwrap_err().contains("`x`"));
        assert!(Shape::parse("2,16,8,128,sideways").unwrap_err().contains("causal"));
        let w = Shape::parse("1,2,64,64,window=8,softcap=30").unwrap();
        assert_eq!((w.causal, w.window_size(), w.softcap), (false, Some((8, 8)), Some(30)));
        assert_eq!(Shape::parse(&w.spec()), Ok(w));
        assert!(Shape::parse("1,2,64,64,window=0").unwrap_err().contains("≥ 1"));
        assert!(Shape::parse("1,2,64,64,causal,causal").unwrap_err().contains("each once"));
        assert!(Shape::parse("1,2,64,64,softcap=x").unwrap_err().contains("`softcap=x`"));
    }

    #[test]
    fn windowed_flops_count_the_band() {
        let causal = Shape::dense(1, 2, 1000, 64, true);
        // A window as long as the sequence keeps every causal pair.
        let all = Shape { window: Some(1000), ..causal };
        assert_eq!(all.flops(), 4.0 * 2.0 * 64.0 * (1000.0 * 1001.0 / 2.0));
        let band = Shape { window: Some(99), ..causal };
        // 100 keys a row from row 99 on, 1 … 99 before.
        assert_eq!(band.flops(), 4.0 * 2.0 * 64.0 * (901.0 * 100.0 + 99.0 * 100.0 / 2.0));
    }

    #[test]
    fn shapes_the_kernels_cannot_run_are_refused_at_parse_time() {
        let e = Shape::parse("1,1,128,80").unwrap_err();
        assert!(
            e.contains("shape `1,1,128,80`: q head dim is 80; the kernels support head dims [64, 96, 128, 192, 256]"),
            "{e}"
        );
        assert!(Shape::parse("1,0,128,64").unwrap_err().contains("at least 1"));
        let e = Shape::parse("4294967296,4294967296,1,64").unwrap_err();
        assert!(e.contains("exceeds 65535"), "{e}");
        assert!(Shape::parse("1,1,4294967296,64").unwrap_err().contains("sequence length 4294967296 exceeds"));
        for s in default_shapes() {
            assert_eq!(Shape::parse(&s.spec()), Ok(s));
        }
    }

    #[test]
    fn serving_shapes_parse_name_and_spread_their_lengths() {
        // ci/bench_serving.py computes the same lengths for its anchors.
        let v = Shape::parse("varlen:16,32,8,8192,128,causal").unwrap();
        assert_eq!(v.name(Dtype::Bf16), "bf16-varlen-b16h32kv8s8192d128-causal");
        let (q, k) = v.lengths();
        assert_eq!(q, k);
        assert_eq!(&q[..6], &[1, 3, 20, 67, 156, 304]);
        assert_eq!((q[15], q.iter().sum::<usize>()), (8192, 34963));
        let p = Shape::parse("paged:64,32,8,32768,128,16").unwrap();
        let (q, k) = p.lengths();
        assert_eq!((q, &k[..4], k.iter().sum::<usize>()), (vec![1; 64], &[1024, 4551, 8078, 11605][..], 1081344));
        assert_eq!(p.kv_bytes(), 4.0 * 1081344.0 * 8.0 * 128.0);
        assert_eq!(p.kv_heads(), 8);
        for bad in ["varlen:16,32,8,8192", "paged:64,32,8,32768,128", "paged:64,32,8,32768,128,0", "ragged:1,1,1,64"] {
            assert!(Shape::parse(bad).is_err(), "{bad}");
        }
        assert!(Shape::parse("varlen:16,32,5,8192,128").unwrap_err().contains("multiple of k/v heads"));
    }

    #[test]
    fn serving_shapes_take_16_bit_inputs_only() {
        let dense = Shape::dense(1, 1, 128, 64, false);
        assert!([Dtype::F16, Dtype::Bf16, Dtype::E4m3].iter().all(|&d| dense.takes(d)));
        for s in serving_shapes() {
            assert!(s.takes(Dtype::F16) && s.takes(Dtype::Bf16) && !s.takes(Dtype::E4m3), "{}", s.spec());
        }
    }

    #[test]
    fn default_set_covers_the_seed_and_large_shapes() {
        let names: Vec<String> = default_shapes().iter().map(|s| s.name(Dtype::F16)).collect();
        for want in [
            "f16-b1h1s32d64",
            "f16-b1h1s512d64",
            "f16-b2h8s512d64",
            "f16-b2h16s8192d128-causal",
            "f16-b8h32s1024d64-causal",
            "f16-b1h4s2048d64-causal",
            "f16-b2h8s4096d256",
            "f16-b2h8s4096d256-causal",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
    }
}
