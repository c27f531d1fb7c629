//! The CPU reference: attention in f64 on the dtype-rounded inputs, with the
//! same semantics as the kernels (bottom-right causal and windows, softcap,
//! GQA, zeros and −inf LSE for rows that see no key).

use crate::scores::Scores;
use crate::tensor::{Desc, Problem};

/// A host tensor of f32 values (already rounded to the kernel's dtype).
pub struct HostTensor<'a> {
    /// Logical dims [batch, heads, seq, head_dim] and element strides into `data`.
    pub desc: Desc,
    /// The values, laid out by `desc`.
    pub data: &'a [f32],
}

/// Returns (out [B, H, Sq, D] contiguous, lse [B, H, Sq]) in f64, for the
/// problem `tensor::validate` made of q, k, v (its scale and GQA group) and
/// `scores` (its mask and softcap).
/// O(B·H·Sq·Sk·D): for shapes the GPU reference
/// ([`Attention::reference`](crate::Attention::reference)) is there for larger
/// ones.
///
/// ```
/// use kernel_ffi::reference::{HostTensor, attention};
/// use kernel_ffi::tensor::{self, Arg, Desc, Dtype, Layout};
///
/// // One query against two keys: equal scores (q = 0) average the values.
/// let (qd, kd) = (Desc::new([1, 1, 1, 64], Layout::Bhsd), Desc::new([1, 1, 2, 64], Layout::Bhsd));
/// let q = vec![0.0; 64];
/// let k = vec![0.5; 128];
/// let v: Vec<f32> = (0..128).map(|i| if i < 64 { 1.0 } else { 3.0 }).collect();
/// let arg = |name, desc: Desc| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
/// let p = tensor::validate(arg("q", qd), arg("k", kd), arg("v", kd), arg("out", qd), None).unwrap();
/// let t = |desc, data| HostTensor { desc, data };
/// let (out, lse) = attention(&t(qd, &q), &t(kd, &k), &t(kd, &v), &p, Default::default());
/// assert!(out.iter().all(|&x| (x - 2.0).abs() < 1e-12));
/// assert!((lse[0] - 2f64.ln()).abs() < 1e-12);
/// ```
pub fn attention(q: &HostTensor, k: &HostTensor, v: &HostTensor, p: &Problem, scores: Scores) -> (Vec<f64>, Vec<f64>) {
    attention_on(std::thread::available_parallelism().map_or(1, |n| n.get()), q, k, v, p, scores)
}

/// Fewest multiply-adds worth a thread of their own (a thread costs tens of µs).
const WORK_PER_THREAD: usize = 1 << 22;

/// [`attention`] on at most `threads` threads: the rows are split between them
/// and each row's arithmetic is the same, so every result bit is the same on
/// any count.
pub fn attention_on(
    threads: usize,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    p: &Problem,
    scores: Scores,
) -> (Vec<f64>, Vec<f64>) {
    let rows = p.batch * p.heads * p.seqlen_q;
    let d = p.head_dim;
    let mut out = vec![0.0; rows * d];
    let mut lse = vec![f64::NEG_INFINITY; rows];
    let (threads, per) = row_split(threads, p);
    if threads == 1 || d == 0 {
        rows_of(q, k, v, p, scores, 0, &mut out, &mut lse);
        return (out, lse);
    }
    std::thread::scope(|s| {
        for (c, (o, l)) in out.chunks_mut(per * d).zip(lse.chunks_mut(per)).enumerate() {
            s.spawn(move || rows_of(q, k, v, p, scores, c * per, o, l));
        }
    });
    (out, lse)
}

/// Per row (as [`attention`]'s LSE), the largest `scale · Σ_d |q_d · k_d|` over
/// the keys the row sees (0 where it sees none): what the error of a score
/// summed in low precision scales with (the Hopper kernel's e4m3 Q·Kᵀ,
/// `check::E4M3_WGMMA_QK_EPS`). On at most `threads` threads.
pub fn score_magnitudes_on(threads: usize, q: &HostTensor, k: &HostTensor, p: &Problem, scores: Scores) -> Vec<f64> {
    let mut out = vec![0.0; p.batch * p.heads * p.seqlen_q];
    let (_, per) = row_split(threads, p);
    let group = p.heads / p.kv_heads.max(1);
    let rows_from = |first: usize, out: &mut [f64]| {
        for (r, m) in out.iter_mut().enumerate() {
            let (b, h, i) = row_position(p, first + r);
            let qo = q.desc.offset(b, h, i);
            let q_row = &q.data[qo..qo + p.head_dim];
            for j in scores.band.keys(i, p.seqlen_q, p.seqlen_k) {
                let ko = k.desc.offset(b, h / group, j);
                let key = &k.data[ko..ko + p.head_dim];
                let sum: f64 = q_row.iter().zip(key).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
                *m = m.max(sum * f64::from(p.scale));
            }
        }
    };
    std::thread::scope(|s| {
        for (c, chunk) in out.chunks_mut(per).enumerate() {
            s.spawn(move || rows_from(c * per, chunk));
        }
    });
    out
}

/// How many of at most `threads` threads share `p`'s rows (none with fewer
/// than WORK_PER_THREAD multiply-adds, at least one), and rows per thread.
fn row_split(threads: usize, p: &Problem) -> (usize, usize) {
    let rows = p.batch * p.heads * p.seqlen_q;
    let work = rows.saturating_mul(p.seqlen_k).saturating_mul(p.head_dim);
    let threads = threads.min(work / WORK_PER_THREAD).clamp(1, rows.max(1));
    (threads, rows.div_ceil(threads).max(1))
}

/// Row `row`'s (batch, head, query): row = (batch · heads + head) · Sq + query.
fn row_position(p: &Problem, row: usize) -> (usize, usize, usize) {
    let (bh, i) = (row / p.seqlen_q, row % p.seqlen_q);
    (bh / p.heads, bh % p.heads, i)
}

/// Rows `first…` of the output (row = (batch · heads + head) · Sq + query),
/// as many as `lse` holds, into `out` and `lse`. A (batch, K/V head)'s keys and
/// values are widened to f64 once, for every row that reads them.
#[allow(clippy::too_many_arguments)]
fn rows_of(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    p: &Problem,
    mask: Scores,
    first: usize,
    out: &mut [f64],
    lse: &mut [f64],
) {
    let (d, sk) = (p.head_dim, p.seqlen_k);
    let group = p.heads / p.kv_heads.max(1);
    let mut scores = vec![0.0f64; sk];
    let mut q_row = vec![0.0f64; d];
    let (mut k64, mut v64) = (vec![0.0f64; sk * d], vec![0.0f64; sk * d]);
    let mut widened: Option<(usize, usize)> = None;
    for (r, (o, row_lse)) in out.chunks_mut(d.max(1)).zip(lse.iter_mut()).enumerate() {
        let (b, h, i) = row_position(p, first + r);
        let kvh = h / group;
        let keys = mask.band.keys(i, p.seqlen_q, sk);
        if keys.is_empty() {
            continue;
        }
        if widened != Some((b, kvh)) {
            for j in 0..sk {
                let (ko, vo) = (k.desc.offset(b, kvh, j), v.desc.offset(b, kvh, j));
                for x in 0..d {
                    k64[j * d + x] = f64::from(k.data[ko + x]);
                    v64[j * d + x] = f64::from(v.data[vo + x]);
                }
            }
            widened = Some((b, kvh));
        }
        let qo = q.desc.offset(b, h, i);
        for (x, w) in q_row.iter_mut().enumerate() {
            *w = f64::from(q.data[qo + x]);
        }
        let (seen, d1) = (&mut scores[..keys.len()], d.max(1));
        let mut max = f64::NEG_INFINITY;
        for (s, key) in seen.iter_mut().zip(k64[keys.start * d..].chunks_exact(d1)) {
            let dot: f64 = q_row.iter().zip(key).map(|(a, b)| a * b).sum();
            *s = mask.modify(dot * f64::from(p.scale));
            max = max.max(*s);
        }
        let mut sum = 0.0;
        for s in seen.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        for (w, value) in seen.iter().zip(v64[keys.start * d..].chunks_exact(d1)) {
            for (acc, x) in o.iter_mut().zip(value) {
                *acc += w * x;
            }
        }
        o.iter_mut().for_each(|x| *x /= sum);
        *row_lse = max + sum.ln();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scores::{Band, Window};
    use crate::tensor::Layout;

    fn causal(on: bool) -> Scores {
        Scores { band: if on { Band::Causal } else { Band::Full }, softcap: None }
    }

    fn problem(h: usize, hkv: usize, sq: usize, sk: usize) -> Problem {
        Problem { batch: 1, heads: h, kv_heads: hkv, seqlen_q: sq, seqlen_k: sk, head_dim: 64, scale: 0.125 }
    }

    #[test]
    fn uniform_scores_average_values() {
        // q = 0 makes every score equal: out is the mean of the visible v rows.
        let p = problem(1, 1, 1, 4);
        let q = vec![0.0; 64];
        let k: Vec<f32> = (0..4 * 64).map(|x| x as f32).collect();
        let v: Vec<f32> = (0..4 * 64).map(|x| (x / 64) as f32).collect();
        let desc = |s| Desc::new([1, 1, s, 64], Layout::Bhsd);
        let t = |s, data| HostTensor { desc: desc(s), data };
        let (out, lse) = attention(&t(1, &q), &t(4, &k), &t(4, &v), &p, causal(false));
        assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-12));
        assert!((lse[0] - 4f64.ln()).abs() < 1e-12);
        // Causal, bottom-right: the single query row is the last row, so it sees all 4 keys.
        let (out, _) = attention(&t(1, &q), &t(4, &k), &t(4, &v), &p, causal(true));
        assert!((out[0] - 1.5).abs() < 1e-12);
    }

    #[test]
    fn causal_rows_without_keys_are_zero_with_neg_inf_lse() {
        // Sq = 3 > Sk = 1: rows 0 and 1 see no key (j ≤ i − 2), row 2 sees key 0.
        let p = problem(1, 1, 3, 1);
        let q = vec![0.5; 3 * 64];
        let kv = vec![2.0; 64];
        let t = |s, data| HostTensor { desc: Desc::new([1, 1, s, 64], Layout::Bshd), data };
        let (out, lse) = attention(&t(3, &q), &t(1, &kv), &t(1, &kv), &p, causal(true));
        assert!(out[..128].iter().all(|&x| x == 0.0));
        assert_eq!(&lse[..2], &[f64::NEG_INFINITY; 2]);
        assert!(out[128..].iter().all(|&x| (x - 2.0).abs() < 1e-12));
        assert!((lse[2] - 0.5 * 2.0 * 64.0 * 0.125).abs() < 1e-9);
    }

    /// The reference written plainly: every element widened where it is read,
    /// every key tested against the mask's definition.
    fn plain(q: &HostTensor, k: &HostTensor, v: &HostTensor, p: &Problem, mask: Scores) -> (Vec<f64>, Vec<f64>) {
        let (d, sk) = (p.head_dim, p.seqlen_k);
        let mut out = vec![0.0; p.batch * p.heads * p.seqlen_q * d];
        let mut lse = vec![f64::NEG_INFINITY; p.batch * p.heads * p.seqlen_q];
        let group = p.heads / p.kv_heads;
        for b in 0..p.batch {
            for h in 0..p.heads {
                for i in 0..p.seqlen_q {
                    let visible: Vec<usize> =
                        (0..sk).filter(|&j| mask.band.keys(i, p.seqlen_q, sk).contains(&j)).collect();
                    let row = (b * p.heads + h) * p.seqlen_q + i;
                    if visible.is_empty() {
                        continue;
                    }
                    let qo = q.desc.offset(b, h, i);
                    let mut scores = vec![0.0; visible.len()];
                    let mut max = f64::NEG_INFINITY;
                    for (&j, s) in visible.iter().zip(scores.iter_mut()) {
                        let ko = k.desc.offset(b, h / group, j);
                        let dot: f64 = (0..d).map(|x| f64::from(q.data[qo + x]) * f64::from(k.data[ko + x])).sum();
                        *s = dot * f64::from(p.scale);
                        if let Some(c) = mask.softcap {
                            *s = f64::from(c) * (*s / f64::from(c)).tanh();
                        }
                        max = max.max(*s);
                    }
                    let mut sum = 0.0;
                    for s in &mut scores {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let o = &mut out[row * d..(row + 1) * d];
                    for (&j, w) in visible.iter().zip(&scores) {
                        let vo = v.desc.offset(b, h / group, j);
                        for (x, acc) in o.iter_mut().enumerate() {
                            *acc += w * f64::from(v.data[vo + x]);
                        }
                    }
                    o.iter_mut().for_each(|x| *x /= sum);
                    lse[row] = max + sum.ln();
                }
            }
        }
        (out, lse)
    }

    #[test]
    fn any_thread_count_and_mask_gives_the_plain_bits() {
        // 2 × 3 heads (GQA 3:1) × 200 rows against 300 keys: enough work for
        // several threads, split mid-head.
        let p = Problem { batch: 2, heads: 3, kv_heads: 1, seqlen_q: 200, seqlen_k: 300, head_dim: 64, scale: 0.125 };
        let mut rng = crate::rng::Rng::new(5);
        let mut fill = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect() };
        let (q, k, v) = (fill(2 * 3 * 200 * 64), fill(2 * 300 * 64), fill(2 * 300 * 64));
        let t = |h, s, data| HostTensor { desc: Desc::new([2, h, s, 64], Layout::Bshd), data };
        let window = Window { left: Some(37), right: Some(5) };
        let local = Scores::resolve(false, window, Some(2.0), 200, 300).unwrap();
        assert_eq!(local.band, Band::Local { left: 37, right: 5 });
        for mask in [causal(true), local] {
            let first = plain(&t(3, 200, &q), &t(1, 300, &k), &t(1, 300, &v), &p, mask);
            let one = attention_on(1, &t(3, 200, &q), &t(1, 300, &k), &t(1, 300, &v), &p, mask);
            assert!(one.0.iter().zip(&first.0).all(|(a, b)| a.to_bits() == b.to_bits()), "{mask:?}");
            assert!(one.1.iter().zip(&first.1).all(|(a, b)| a.to_bits() == b.to_bits()), "{mask:?}");
        }
        let one = attention_on(1, &t(3, 200, &q), &t(1, 300, &k), &t(1, 300, &v), &p, causal(true));
        for threads in [2, 3, 7, 64] {
            let many = attention_on(threads, &t(3, 200, &q), &t(1, 300, &k), &t(1, 300, &v), &p, causal(true));
            assert!(one.0.iter().zip(&many.0).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
            assert!(one.1.iter().zip(&many.1).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }

    #[test]
    fn score_magnitudes_take_absolute_products_over_the_keys_a_row_sees() {
        // One head, Sq = Sk = 2, causal: row 0 sees key 0, row 1 keys 0 and 1.
        let p = problem(1, 1, 2, 2);
        let q: Vec<f32> = (0..2 * 64).map(|x| if x % 2 == 0 { 1.0 } else { -1.0 }).collect();
        // Key 0: all 1 (q·k = 0, Σ|q·k| = 64); key 1: all −2 (Σ|q·k| = 128).
        let k: Vec<f32> = (0..2 * 64).map(|x| if x < 64 { 1.0 } else { -2.0 }).collect();
        let t = |data| HostTensor { desc: Desc::new([1, 1, 2, 64], Layout::Bhsd), data };
        let m = score_magnitudes_on(3, &t(&q), &t(&k), &p, causal(true));
        assert_eq!(m, vec![64.0 * 0.125, 128.0 * 0.125]);
        assert_eq!(score_magnitudes_on(1, &t(&q), &t(&k), &p, causal(false)), vec![16.0, 16.0]);
    }

    #[test]
    fn gqa_maps_query_heads_to_shared_kv_heads() {
        let p = problem(4, 2, 1, 1);
        let q = vec![0.0; 4 * 64];
        let k = vec![0.0; 2 * 64];
        let v: Vec<f32> = (0..2 * 64).map(|x| (x / 64) as f32 + 1.0).collect();
        let t = |h, data| HostTensor { desc: Desc::new([1, h, 1, 64], Layout::Bhsd), data };
        let (out, _) = attention(&t(4, &q), &t(2, &k), &t(2, &v), &p, causal(false));
        let heads: Vec<f64> = (0..4).map(|h| out[h * 64]).collect();
        assert_eq!(heads, vec![1.0, 1.0, 2.0, 2.0]);
    }
}
