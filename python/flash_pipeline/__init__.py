"""FlashAttention forward kernels with flash-attn 2's Python API.

    from flash_pipeline import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q: (batch, seqlen, nheads, headdim)

Supported: CUDA float16/bfloat16, head dims of ``supported()["head_dims"]``
(64 and 128), causal (bottom-right aligned) or not, GQA/MQA, seqlen_q != seqlen_k,
any strides whose head_dim stride is 1. Forward only (inference).

Raises NotImplementedError for what is not supported yet (dropout_p != 0,
window_size, softcap > 0, alibi_slopes, inputs that require grad) and
ValueError for shapes, dtypes or devices the kernels cannot run.

Importing needs torch but no GPU; the transformers backend lives in
``flash_pipeline.transformers`` (imported on demand).
"""

import torch

from . import ops
from .ops import kernel_dir, supported

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("flash_pipeline")
except PackageNotFoundError:  # a source checkout, not an installed wheel
    __version__ = "0+unknown"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "supported",
    "kernel_dir",
    "__version__",
]


def _check_unsupported(dropout_p, window_size, softcap, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: flash_pipeline has no attention dropout; pass dropout_p=0.0 "
            "(flash-attn's value for evaluation)"
        )
    if window_size[0] >= 0 or window_size[1] >= 0:  # negative = infinite, as flash-attn
        raise NotImplementedError(
            f"window_size={tuple(window_size)}: sliding-window (local) attention is not supported yet; "
            "pass window_size=(-1, -1)"
        )
    if softcap > 0.0:
        raise NotImplementedError(f"softcap={softcap}: softcapping is not supported yet; pass softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported yet; pass alibi_slopes=None")


def _check_no_grad(*tensors):
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise NotImplementedError(
            "flash_pipeline is forward-only and these inputs require grad: call it under torch.no_grad() or "
            "torch.inference_mode(), or pass detached tensors"
        )


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """softmax(q·kᵀ·softmax_scale [causal mask]) · v, flash-attn 2's ``flash_attn_func``.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim)
        k, v: (batch_size, seqlen_k, nheads_k, headdim); nheads a multiple of nheads_k:
            q head h attends with kv head h // (nheads // nheads_k) (MQA/GQA).
        dropout_p: must be 0.0 (NotImplementedError otherwise).
        softmax_scale: scaling of q·kᵀ; default 1 / sqrt(headdim).
        causal: causal mask aligned to the bottom right of the (seqlen_q, seqlen_k) matrix,
            as flash-attn >= 2.1: with seqlen_q = 2, seqlen_k = 5 row 0 sees keys 0..3.
            A row that sees no key gives out = 0 (and lse = -inf).
        window_size: must be infinite, (-1, -1) (NotImplementedError otherwise).
        softcap: must be <= 0.0, i.e. off (NotImplementedError otherwise).
        alibi_slopes: must be None (NotImplementedError otherwise).
        deterministic: accepted and ignored: the forward is deterministic (it is a
            flag of flash-attn's backward, which flash_pipeline does not have).
        return_attn_probs: also return the log-sum-exp.
    Return:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype, contiguous.
        With return_attn_probs=True, (out, softmax_lse, None): softmax_lse is float32
        (batch_size, nheads, seqlen_q), the log-sum-exp of each row of q·kᵀ·softmax_scale;
        flash-attn's third value S_dmask (the probabilities, for testing) is not produced.

    Inputs that require grad (with grad mode on) raise NotImplementedError: there is no backward.
    """
    _check_unsupported(dropout_p, window_size, softcap, alibi_slopes)
    _check_no_grad(q, k, v)
    out, softmax_lse = torch.ops.flash_pipeline.fwd(q, k, v, softmax_scale, causal)
    return (out, softmax_lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """:func:`flash_attn_func` on qkv (batch_size, seqlen, 3, nheads, headdim); no copies are made."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv has shape {tuple(getattr(qkv, 'shape', ()))}; it must be (batch, seqlen, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """:func:`flash_attn_func` on q and kv (batch_size, seqlen_k, 2, nheads_k, headdim); no copies are made."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv has shape {tuple(getattr(kv, 'shape', ()))}; it must be (batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )
