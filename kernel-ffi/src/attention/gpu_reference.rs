//! The fp32 GPU reference, for shapes too large for the f64 CPU one
//! (`crate::reference`).

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::memory::{device_ptr, strides};
use super::{Attention, Tensor};
use crate::error::{CudaContext, Result, invalid};
use crate::params::ReferenceParams;
use crate::scores::{Band, Scores};
use crate::tensor;

impl Attention {
    /// The fp32 GPU reference: returns (out [B, H, Sq, D], lse [B, H, Sq]) on the host.
    pub fn reference(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scores: Scores,
        scale: Option<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let p = tensor::validate(q.arg("q"), k.arg("k"), v.arg("v"), q.arg("q (as out)"), scale)?;
        let name = format!("reference_attention_{}", q.dtype.name());
        let kern = self.kernel(&name)?;
        // Rounded up to 16 bytes: nvcc reads the score row with LDS.128 even in the loop's
        // remainder, so the tail of the last chunk must lie inside the allocation.
        let smem = p.seqlen_k.next_multiple_of(4) * 4;
        if smem > kern.dynamic_smem as usize {
            invalid!(
                "the GPU reference holds {} keys per row in shared memory; seqlen_k is {}",
                kern.dynamic_smem / 4,
                p.seqlen_k
            );
        }
        let rows = p.rows();
        if rows == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let (window_left, window_right) = match scores.band {
            Band::Full => (-1, -1),
            Band::Causal => (-1, 0),
            Band::Local { left, right } => (left as i32, right as i32),
        };
        let s = &self.stream;
        let o = s.alloc_zeros::<f32>(rows * p.head_dim).cuda("allocating the reference output")?;
        let l = s.alloc_zeros::<f32>(rows).cuda("allocating the reference LSE")?;
        let params = ReferenceParams {
            q: device_ptr(&q.data, s),
            k: device_ptr(&k.data, s),
            v: device_ptr(&v.data, s),
            o: device_ptr(&o, s),
            lse: device_ptr(&l, s),
            q_strides: strides(&q.desc),
            k_strides: strides(&k.desc),
            v_strides: strides(&v.desc),
            batch: p.batch as i32,
            heads: p.heads as i32,
            kv_heads: p.kv_heads as i32,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            head_dim: p.head_dim as i32,
            window_left,
            window_right,
            scale: p.scale,
            softcap: scores.softcap.unwrap_or(0.0),
        };
        let cfg = LaunchConfig {
            grid_dim: (p.seqlen_q as u32, (p.batch * p.heads) as u32, 1),
            block_dim: (kern.launch.threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: matches `reference_attention_<dtype>(const ReferenceParams p)` in
        // kernels/reference.cu; inputs validated as in `forward`, o/lse sized rows·D and
        // rows, dynamic smem holds seqlen_k floats rounded up to 16 bytes (≤ the manifest's allotment).
        unsafe { s.launch_builder(&kern.func).arg(&params).launch(cfg) }.cuda(format!("launching {name}"))?;
        let o = s.clone_dtoh(&o).cuda("copying the reference output")?;
        let l = s.clone_dtoh(&l).cuda("copying the reference LSE")?;
        Ok((o, l))
    }
}
