//! The CPU reference: attention in f64 on the dtype-rounded inputs, with the
//! same semantics as the kernels (bottom-right causal, GQA, zeros and −inf LSE
//! for rows that see no key).

use crate::tensor::{Desc, Problem};

/// A host tensor of f32 values (already rounded to the kernel's dtype).
pub struct HostTensor<'a> {
    /// Logical dims [batch, heads, seq, head_dim] and element strides into `data`.
    pub desc: Desc,
    /// The values, laid out by `desc`.
    pub data: &'a [f32],
}

/// Returns (out [B, H, Sq, D] contiguous, lse [B, H, Sq]) in f64, for the
/// problem `tensor::validate` made of q, k, v (its scale and GQA group).
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
/// let (out, lse) = attention(&t(qd, &q), &t(kd, &k), &t(kd, &v), &p, false);
/// assert!(out.iter().all(|&x| (x - 2.0).abs() < 1e-12));
/// assert!((lse[0] - 2f64.ln()).abs() < 1e-12);
/// ```
pub fn attention(q: &HostTensor, k: &HostTensor, v: &HostTensor, p: &Problem, causal: bool) -> (Vec<f64>, Vec<f64>) {
    let (d, sk) = (p.head_dim, p.seqlen_k);
    let mut out = vec![0.0; p.batch * p.heads * p.seqlen_q * d];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * p.heads * p.seqlen_q];
    let group = p.heads / p.kv_heads.max(1);
    let mut scores = vec![0.0f64; sk];
    for b in 0..p.batch {
        for h in 0..p.heads {
            let kvh = h / group;
            for i in 0..p.seqlen_q {
                // Keys j ≤ i + (Sk − Sq) are visible when causal.
                let visible = if causal { (i + sk + 1).saturating_sub(p.seqlen_q).min(sk) } else { sk };
                let row = (b * p.heads + h) * p.seqlen_q + i;
                if visible == 0 {
                    continue;
                }
                let qo = q.desc.offset(b, h, i);
                let mut max = f64::NEG_INFINITY;
                for (j, s) in scores[..visible].iter_mut().enumerate() {
                    let ko = k.desc.offset(b, kvh, j);
                    let dot: f64 = (0..d).map(|x| f64::from(q.data[qo + x]) * f64::from(k.data[ko + x])).sum();
                    *s = dot * f64::from(p.scale);
                    max = max.max(*s);
                }
                let mut sum = 0.0;
                for s in &mut scores[..visible] {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let o = &mut out[row * d..(row + 1) * d];
                for (j, w) in scores[..visible].iter().enumerate() {
                    let vo = v.desc.offset(b, kvh, j);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Layout;

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
        let (out, lse) = attention(&t(1, &q), &t(4, &k), &t(4, &v), &p, false);
        assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-12));
        assert!((lse[0] - 4f64.ln()).abs() < 1e-12);
        // Causal, bottom-right: the single query row is the last row, so it sees all 4 keys.
        let (out, _) = attention(&t(1, &q), &t(4, &k), &t(4, &v), &p, true);
        assert!((out[0] - 1.5).abs() < 1e-12);
    }

    #[test]
    fn causal_rows_without_keys_are_zero_with_neg_inf_lse() {
        // Sq = 3 > Sk = 1: rows 0 and 1 see no key (j ≤ i − 2), row 2 sees key 0.
        let p = problem(1, 1, 3, 1);
        let q = vec![0.5; 3 * 64];
        let kv = vec![2.0; 64];
        let t = |s, data| HostTensor { desc: Desc::new([1, 1, s, 64], Layout::Bshd), data };
        let (out, lse) = attention(&t(3, &q), &t(1, &kv), &t(1, &kv), &p, true);
        assert!(out[..128].iter().all(|&x| x == 0.0));
        assert_eq!(&lse[..2], &[f64::NEG_INFINITY; 2]);
        assert!(out[128..].iter().all(|&x| (x - 2.0).abs() < 1e-12));
        assert!((lse[2] - 0.5 * 2.0 * 64.0 * 0.125).abs() < 1e-9);
    }

    #[test]
    fn gqa_maps_query_heads_to_shared_kv_heads() {
        let p = problem(4, 2, 1, 1);
        let q = vec![0.0; 4 * 64];
        let k = vec![0.0; 2 * 64];
        let v: Vec<f32> = (0..2 * 64).map(|x| (x / 64) as f32 + 1.0).collect();
        let t = |h, data| HostTensor { desc: Desc::new([1, h, 1, 64], Layout::Bhsd), data };
        let (out, _) = attention(&t(4, &q), &t(2, &k), &t(2, &v), &p, false);
        let heads: Vec<f64> = (0..4).map(|h| out[h * 64]).collect();
        assert_eq!(heads, vec![1.0, 1.0, 2.0, 2.0]);
    }
}
