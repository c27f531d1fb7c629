"""FlashAttention forward kernels with flash-attn 2's Python API.

    from flash_pipeline import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q: (batch, seqlen, nheads, headdim)

Supported: CUDA float16/bfloat16, head dims of ``supported()["head_dims"]``
(64, 96, 128, 192 and 256, dense and serving calls); float8_e4m3fn in dense
calls at head dims 64, 128 and 256, with FA3's ``q_descale``, ``k_descale``,
``v_descale`` and bfloat16 output (sm_89 and sm_90; what has no e4m3 entry,
windows, softcap and the Hopper kernel's head dim 64, runs them
dequantised to bfloat16);
causal (bottom-right aligned) or not, sliding windows
(``window_size``, aligned as causal) and logit softcapping (``softcap``),
GQA/MQA, seqlen_q != seqlen_k, any strides whose head_dim stride is 1.
Forward only (inference).

Raises NotImplementedError for what is not supported yet (dropout_p != 0,
alibi_slopes, inputs that require grad) and ValueError for shapes, dtypes,
windows or devices the kernels cannot run.

Serving calls: ``flash_attn_varlen_func`` (sequences packed with cu_seqlens,
optionally a paged K/V cache) and ``flash_attn_with_kvcache`` (decode and
chunked prefill against a dense or paged cache, new keys appended).
``FLASH_PIPELINE_VALIDATE=1`` checks their index tensors on the host first.

Importing needs torch but no GPU; the transformers backend lives in
``flash_pipeline.transformers`` (imported on demand).
"""

import torch

from . import ops
from ._args import check_window as _check_window
from .ops import kernel_dir, release_scratch, supported

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("flash_pipeline")
except PackageNotFoundError:  # a source checkout, not an installed wheel
    __version__ = "0+unknown"

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "supported",
    "kernel_dir",
    "release_scratch",
    "__version__",
]


def _check_unsupported(dropout_p, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: flash_pipeline has no attention dropout; pass dropout_p=0.0 "
            "(flash-attn's value for evaluation)"
        )
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
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
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
        window_size: (left, right): row i sees keys i + seqlen_k - seqlen_q - left through
            i + seqlen_k - seqlen_q + right (-1: unbounded), aligned as causal; with causal,
            right is 0. A row whose window holds no key gives out = 0 (and lse = -inf).
        softcap: c > 0 makes the scores c * tanh(q·kᵀ·softmax_scale / c) (Gemma 2); 0.0: off.
        alibi_slopes: must be None (NotImplementedError otherwise).
        deterministic: accepted and ignored: the forward is deterministic (it is a
            flag of flash-attn's backward, which flash_pipeline does not have).
        return_attn_probs: also return the log-sum-exp.
        q_descale, k_descale, v_descale: FA3's FP8 arguments: with float8_e4m3fn q, k, v
            (head dims 64, 128, 256), float32 (batch_size, nheads_k) positive factors that
            dequantise them (None: 1).
    Return:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype (bfloat16 for float8_e4m3fn), contiguous.
        With return_attn_probs=True, (out, softmax_lse, None): softmax_lse is float32
        (batch_size, nheads, seqlen_q), the log-sum-exp of each row of q·kᵀ·softmax_scale;
        flash-attn's third value S_dmask (the probabilities, for testing) is not produced.

    Inputs that require grad (with grad mode on) raise NotImplementedError: there is no backward.
    """
    _check_unsupported(dropout_p, alibi_slopes)
    _check_no_grad(q, k, v)
    left, right = _check_window(window_size)
    out, softmax_lse = torch.ops.flash_pipeline.fwd(
        q, k, v, softmax_scale, causal, left, right, float(softcap), q_descale, k_descale, v_descale
    )
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


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_k=None,
):
    """Attention over each sequence of a packed batch, flash-attn 2's ``flash_attn_varlen_func``.

    Arguments:
        q: (total_q, nheads, headdim); sequence i's rows are cu_seqlens_q[i]:cu_seqlens_q[i + 1].
        k, v: (total_k, nheads_k, headdim), split likewise by cu_seqlens_k; or, with block_table,
            a paged cache (num_blocks, page_block_size, nheads_k, headdim) of any page size.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets on q's device. With block_table
            cu_seqlens_k only gives the lengths (cu_seqlens_k[i + 1] - cu_seqlens_k[i]), unless
            seqused_k does; it may then be None.
        max_seqlen_q: the most query rows of a sequence (rows past it are not computed).
        max_seqlen_k: the most keys of a sequence (sizes the key splits).
        softmax_scale: scaling of q·kᵀ; default 1 / sqrt(headdim).
        causal: bottom-right aligned per sequence: with L_q rows and L_k keys, row i sees
            keys j <= i + L_k - L_q; a row that sees no key gives 0 (lse -inf).
        block_table: int32 (batch, max_num_blocks_per_seq): sequence i's keys lie on pages
            block_table[i, 0], block_table[i, 1], … in order (pages may be shared).
        seqused_k: int32 (batch,), keyword-only: keys each sequence uses, at most what it has.
        window_size, softcap: as flash_attn_func, aligned to each sequence's own lengths.
        dropout_p, alibi_slopes: as flash_attn_func (only their off values).
        deterministic: accepted and ignored (the forward is deterministic).
        return_attn_probs: also return the log-sum-exp, float32 (nheads, total_q).
    Return: out (total_q, nheads, headdim); with return_attn_probs, (out, softmax_lse, None).
    Rows of q that no sequence covers are left unwritten, as flash-attn's.

    Offsets, lengths and pages are read on the GPU: bad ones give wrong rows, never a
    fault; FLASH_PIPELINE_VALIDATE=1 checks them on the host first (a synchronisation).
    """
    _check_unsupported(dropout_p, alibi_slopes)
    left, right = _check_window(window_size)
    _check_no_grad(q, k, v)
    ops.check_index_types(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                          seqused_k=seqused_k)
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q is None; q is packed (total_q, nheads, headdim) and needs its offsets")
    if block_table is None:
        if cu_seqlens_k is None:
            raise ValueError("cu_seqlens_k is None; without block_table, k and v are packed and need their offsets")
    elif seqused_k is None:
        if cu_seqlens_k is None:
            raise ValueError("block_table needs each sequence's key count: pass cu_seqlens_k or seqused_k")
        # kernel-ffi takes paged lengths from seqused_k, never offsets: derive them on the GPU.
        if not torch.compiler.is_compiling():  # while tracing, the op's fake implementation checks
            ops.check_index("cu_seqlens_k", cu_seqlens_k, q)
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    if block_table is not None:
        cu_seqlens_k = None
    out, softmax_lse = torch.ops.flash_pipeline.varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, 0, left, right, float(softcap)
    )
    return (out, softmax_lse, None) if return_attn_probs else out


def _append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Writes k and v (batch, seqlen_new, nheads_k, headdim) into the caches in place at each
    sequence's positions cache_seqlens[b] … (through block_table when paged), by torch
    indexing ops. A position outside the cache becomes an index past its end, so that torch's
    bounds check fails on it (a device-side assert) rather than a negative index wrapping."""
    b, n = k.shape[0], k.shape[1]
    pos = cache_seqlens.long()[:, None] + torch.arange(n, device=k.device)[None, :]  # (batch, seqlen_new)
    if block_table is None:
        rows = torch.arange(b, device=k.device)[:, None].expand(b, n)
        index = (rows, pos.masked_fill(pos < 0, k_cache.shape[1]))
    else:
        page_size, slots = k_cache.shape[1], block_table.shape[1]
        slot = pos.div(page_size, rounding_mode="floor")
        page = block_table.long().gather(1, slot.clamp(0, slots - 1))
        outside = (slot < 0) | (slot >= slots) | (page < 0)
        index = (page.masked_fill(outside, k_cache.shape[0]), pos.remainder(page_size))
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention against a KV cache, flash-attn 2's ``flash_attn_with_kvcache``.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim): decode (seqlen_q 1) or a chunk of rows.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim) with batch_cache >= batch
            (the first batch entries are used), or with block_table a paged cache
            (num_blocks, page_block_size, nheads_k, headdim) of any page size.
        k, v: optional (batch, seqlen_new, nheads_k, headdim), written into the caches in place
            at positions cache_seqlens[b] … before attending, which then sees
            cache_seqlens + seqlen_new keys. The append runs as torch indexing ops (not fused
            into the kernel); every position must lie in the cache (FLASH_PIPELINE_VALIDATE=1
            checks that on the host, else torch's bounds check fails on the device).
        cache_seqlens: int, or int32 (batch,): keys in the cache per sequence (default: all
            seqlen_cache, or every slot of the sequence's block_table row when paged).
        block_table: int32 (batch, max_num_blocks_per_seq): sequence b's keys lie on pages
            block_table[b, 0], block_table[b, 1], … in order.
        softmax_scale: scaling of q·kᵀ; default 1 / sqrt(headdim).
        causal: bottom-right aligned: query row i of a sequence with L keys sees keys
            j <= L - seqlen_q + i.
        window_size, softcap: as flash_attn_func, aligned as causal to each sequence's cache.
        num_splits: key splits; 0 lets the planner choose.
        return_softmax_lse: also return the log-sum-exp, float32 (batch, nheads, seqlen_q).
    Return: out (batch, seqlen_q, nheads, headdim); with return_softmax_lse, (out, softmax_lse).

    Not supported yet (NotImplementedError): rotary_cos/rotary_sin (rotary_interleaved is
    then unused), cache_batch_idx, cache_leftpad, alibi_slopes.
    """
    _check_unsupported(0.0, alibi_slopes)
    left, right = _check_window(window_size)
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad)):
        if value is not None:
            raise NotImplementedError(f"{name}: not supported yet; pass {name}=None")
    _check_no_grad(q, k_cache, v_cache, k, v)
    if not isinstance(cache_seqlens, int):
        ops.check_index_types(cache_seqlens=cache_seqlens, block_table=block_table)
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: pass both or neither")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} has {t.dim()} dims {tuple(t.shape)}; it must be 4-D (batch, seqlen, nheads, headdim)"
            )
    batch = q.shape[0]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if not torch.compiler.is_compiling():  # while tracing, the op's fake implementation checks
        # The op would name cache_seqlens seqused_k.
        ops.check_index("cache_seqlens", cache_seqlens, q)
        if cache_seqlens is not None and cache_seqlens.shape[0] != batch:
            raise ValueError(f"cache_seqlens holds {cache_seqlens.shape[0]} lengths but q has batch {batch}; "
                             f"it must hold {batch}")
        ops.check_index("block_table", block_table, q, rank=2)
    if block_table is None:
        k_cache, v_cache = k_cache[:batch], v_cache[:batch]  # views: the append still lands in the caches
        max_seqlen_k = k_cache.shape[1]
    else:
        max_seqlen_k = block_table.shape[1] * k_cache.shape[1]
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("k and v are appended at cache_seqlens: pass cache_seqlens (where each sequence ends)")
        if not torch.compiler.is_compiling():  # while tracing, the op's fake implementation checks
            ops.check_append(q, k_cache, v_cache, k, v, cache_seqlens, block_table, max_seqlen_k, num_splits)
        _append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table)
        cache_seqlens = cache_seqlens + k.shape[1]
    out, softmax_lse = torch.ops.flash_pipeline.varlen_fwd(
        q, k_cache, v_cache, None, None, cache_seqlens, block_table, q.shape[1], max_seqlen_k, softmax_scale, causal,
        num_splits, left, right, float(softcap)
    )
    return (out, softmax_lse) if return_softmax_lse else out
