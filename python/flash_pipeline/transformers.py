"""flash_pipeline as a transformers (5.x) attention backend.

    import flash_pipeline.transformers as fpt
    name = fpt.register()                      # "fa_pipeline"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name, dtype=torch.bfloat16)
    model.set_attn_implementation("sdpa")      # switch back and forth on the same weights

The default name is ``"fa_pipeline"``, not ``"flash_pipeline"``: transformers 5
treats every attn_implementation whose name contains "flash" as a FlashAttention
package or hub kernel (``is_flash_attention_requested`` and
``lazy_import_flash_attention``) and fails to load it, so :func:`register`
refuses such names.

:func:`register` adds :func:`attention_forward` to ``AttentionInterface`` and
transformers' ``sdpa_mask`` to ``AttentionMaskInterface`` under the same name
(without a mask function transformers would pass ``attention_mask=None`` and
drop padding silently). The masks are therefore exactly those of
``attn_implementation="sdpa"``: ``None`` when no token is padded and the
pattern is plain causal, else a boolean (batch, 1, seqlen_q, seqlen_k) mask.

How each call runs:

* mask ``None``: our kernel. Causality is decided as in transformers'
  ``sdpa_attention_forward``: the ``is_causal`` kwarg, else ``module.is_causal``,
  else True, and only for seqlen_q > 1. With seqlen_q > 1 and seqlen_k > seqlen_q
  (prefill into an empty static cache) only the first seqlen_q keys are used, as
  sdpa does; otherwise the kernel's bottom-right causal mask is the KV-cache one.
* mask given: it is compared (on the GPU, one synchronisation) with the
  bottom-right causal mask and with all-True; if it is one of them (e.g. a
  chunked prefill after a KV cache) our kernel runs. A left-padded batch (in
  prefill and in every generation step after it) is one
  whose mask equals, per sequence, bottom-right causal attention of its
  unpadded queries to its unpadded keys: its queries, keys and values are
  gathered into packed rows (a copy per call, as FlashAttention's transformers
  integration does) and run by the serving kernel
  (``flash_attn_varlen_func``), the padded query rows getting zeros. Any other
  mask (right padding, whose padded queries still see keys; packed
  sequences, static-cache slots) falls back to transformers'
  ``sdpa_attention_forward`` with the mask.
* ``sliding_window`` (W: a row sees itself and the W − 1 keys before it):
  transformers materialises a mask whenever the window cuts a key, so a
  ``None`` mask means it cuts none; a mask equal to the bottom-right causal
  band of W keys runs the kernel with ``window_size = (W − 1, 0)``.
* ``softcap`` (Gemma 2's attention logit softcapping) runs in the kernels
  (padded batches too); where the call would fall back to SDPA, it raises
  NotImplementedError instead, as SDPA has no softcapping (use 'eager').
  While compiling (``torch.compile``) or capturing a CUDA graph a given mask is
  not inspected: those calls fall back to SDPA.
* also falling back to SDPA, with a one-time warning: non-CUDA inputs, dtypes
  other than float16/bfloat16, head dims the kernels lack (they run 64, 96,
  128, 192 and 256, padded batches too), inputs that need gradients (the
  kernels are forward-only), a ``position_bias``.
* raising NotImplementedError: ``dropout`` > 0 (attention dropout in training),
  ``s_aux`` (sinks).

GQA runs natively (no ``repeat_kv``); ``scaling`` is the kernel's softmax scale.
The output is (batch, seqlen_q, heads, head_dim) contiguous and the weights
``None``, like ``sdpa_attention_forward``. :data:`stats` counts the calls
(``"kernel"``, ``"varlen"`` for padded batches and ``"sdpa: <reason>"``) when
not compiling.
"""

import warnings
from typing import NamedTuple

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import ops

NAME = "fa_pipeline"
# Read once here, not per call: a plain tuple keeps the per-call checks traceable by torch.compile.
_HEAD_DIMS = ops.head_dims()

stats = {}
_warned = set()


def register(name: str = NAME) -> str:
    """Register the backend under ``name`` (attention function and its mask function); returns ``name``."""
    if "flash" in name:
        raise ValueError(
            f"name {name!r} contains 'flash': transformers 5 would treat it as a FlashAttention package or hub "
            f"kernel and fail to load it; use a name without 'flash', e.g. {NAME!r}"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _note(key: str, warning: str = None) -> None:
    if torch.compiler.is_compiling():
        return
    stats[key] = stats.get(key, 0) + 1
    if warning is not None and key not in _warned:
        _warned.add(key)
        warnings.warn(warning, RuntimeWarning, stacklevel=3)


def _unusable(query, key, value, kwargs):
    """Why the kernels cannot take these inputs, as (category, detail), or None."""
    if query.device.type != "cuda":
        return "device", f"inputs on {query.device}, not CUDA"
    if query.dtype not in (torch.float16, torch.bfloat16) or not (query.dtype == key.dtype == value.dtype):
        return "dtype", f"dtypes {query.dtype}/{key.dtype}/{value.dtype}; the kernels run float16 or bfloat16"
    dims = _HEAD_DIMS
    if query.shape[-1] not in dims or key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
        return "head dim", f"head dims {query.shape[-1]}/{key.shape[-1]}/{value.shape[-1]}; the kernels run {list(dims)}"
    if key.shape[1] == 0 or query.shape[1] % key.shape[1] != 0:
        return "heads", f"{query.shape[1]} query heads for {key.shape[1]} kv heads"
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return "grad", "inputs require grad and the kernels are forward-only"
    if kwargs.get("position_bias") is not None:
        return "position_bias", "position_bias is an additive bias the kernels lack"
    return None


class _Dense(NamedTuple):
    """The dense kernel's call: causal, the window's left side (-1: none), and the keys and values."""

    causal: bool
    left: int
    key: torch.Tensor
    value: torch.Tensor


def _pattern(query, key, value, attention_mask, is_causal, sliding_window=None):
    """Map the call onto the kernel: _Dense, a padded batch (_Padded) for the serving
    kernel, or a reason (str) to fall back to SDPA."""
    sq, sk = query.shape[2], key.shape[2]
    if attention_mask is None:
        if is_causal and sq > 1 and sk > sq:
            # transformers' convention (its sdpa path slices the same way): prefill of an empty static cache
            key, value = key[:, :, :sq], value[:, :, :sq]
        if is_causal and sq > 1 and sk < sq:
            return "causal with fewer keys than queries and no mask, which SDPA aligns top-left"
        return _Dense(bool(is_causal and sq > 1), -1, key, value)
    if torch.compiler.is_compiling() or (query.is_cuda and torch.cuda.is_current_stream_capturing()):
        return "a mask is given while compiling or capturing, where it cannot be inspected"
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (sq, sk):
        return f"the mask ({attention_mask.dtype}, {tuple(attention_mask.shape)}) is not a boolean (.., {sq}, {sk}) mask"
    causal = torch.ones(sq, sk, dtype=torch.bool, device=attention_mask.device).tril(sk - sq)
    if torch.equal(attention_mask, causal.expand_as(attention_mask)):
        return _Dense(True, -1, key, value)
    if sliding_window is not None and sliding_window >= 1:
        band = causal.triu(sk - sq - (sliding_window - 1))
        if torch.equal(attention_mask, band.expand_as(attention_mask)):
            return _Dense(True, sliding_window - 1, key, value)
    if bool(attention_mask.all()):
        return _Dense(False, -1, key, value)
    windows = [-1] + ([sliding_window - 1] if sliding_window is not None and sliding_window >= 1 else [])
    for left in windows:
        padded = _padded_batch(attention_mask, is_causal, left)
        if padded is not None:
            return padded
    return "the mask has padding or a pattern other than causal"


class _Padded(NamedTuple):
    """A padded batch: which query rows and keys of each sequence are kept, boolean (batch, seqlen),
    and the sliding window's left side over the kept keys (-1: none)."""

    q_keep: torch.Tensor
    k_keep: torch.Tensor
    left: int = -1


def _padded_batch(mask, is_causal, left=-1):
    """The kept rows where the mask is exactly each sequence's bottom-right causal
    (or full) attention of its kept query rows to its kept keys, within `left` keys
    before the diagonal where that is not -1; else None."""
    if mask.shape[1] != 1:
        return None
    m = mask[:, 0]  # (batch, sq, sk)
    q_keep, k_keep = m.any(dim=2), m.any(dim=1)
    n_q, n_k = q_keep.sum(1, keepdim=True), k_keep.sum(1, keepdim=True)
    q_rank = q_keep.cumsum(1) - 1  # a kept row's index among its sequence's kept rows
    k_rank = k_keep.cumsum(1) - 1
    implied = q_keep[:, :, None] & k_keep[:, None, :]
    diag = q_rank[:, :, None] + (n_k - n_q)[:, :, None]
    if is_causal and m.shape[1] > 1:
        implied &= k_rank[:, None, :] <= diag
    if left >= 0:
        implied &= k_rank[:, None, :] >= diag - left
    return _Padded(q_keep, k_keep, left) if torch.equal(implied, m) else None


def _varlen(query, key, value, q_keep, k_keep, left, causal, scaling, softcap=0.0):
    """The padded batch's kept rows, packed, through the serving kernel; padded query rows get zeros."""
    b, h, sq, d = query.shape
    q_rows, k_rows = q_keep.reshape(-1).nonzero().squeeze(1), k_keep.reshape(-1).nonzero().squeeze(1)
    cu = lambda keep: torch.nn.functional.pad(keep.sum(1).cumsum(0), (1, 0)).to(torch.int32)
    packed = lambda t, rows: t.transpose(1, 2).reshape(-1, t.shape[1], d)[rows]
    cu_q, cu_k = cu(q_keep), cu(k_keep)
    out, _ = torch.ops.flash_pipeline.varlen_fwd(
        packed(query, q_rows), packed(key, k_rows), packed(value, k_rows), cu_q, cu_k, None, None,
        query.shape[2], key.shape[2], scaling, causal, 0, left, -1, softcap,
    )
    full = query.new_zeros((b * sq, h, d))
    full[q_rows] = out
    return full.view(b, sq, h, d)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    is_causal=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """transformers' attention-function signature: query (batch, heads, seqlen_q, head_dim),
    key/value (batch, kv_heads, seqlen_k, head_dim); returns ((batch, seqlen_q, heads, head_dim), None)."""
    if dropout and dropout > 0.0:
        raise NotImplementedError(
            f"attention dropout {dropout}: flash_pipeline is forward-only; call model.eval() (or set "
            "attention_dropout=0), or train with attn_implementation='sdpa'"
        )
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("s_aux (attention sinks) is not supported; use 'eager'")
    if kwargs.get("output_attentions", False):
        _note("output_attentions", "flash_pipeline returns no attention weights (output_attentions=True gives None)")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)

    bad = _unusable(query, key, value, kwargs)
    if bad is None:
        plan = _pattern(query, key, value, attention_mask, is_causal, sliding_window)
        if isinstance(plan, _Dense):
            q, k, v = (t.transpose(1, 2) for t in (query, plan.key, plan.value))
            out, _ = torch.ops.flash_pipeline.fwd(q, k, v, scaling, plan.causal, plan.left, -1, float(softcap or 0.0))
            _note("kernel")
            return out, None
        if isinstance(plan, _Padded):
            causal = bool(is_causal and query.shape[2] > 1)
            out = _varlen(query, key, value, *plan, causal, scaling, float(softcap or 0.0))
            _note("varlen")
            return out, None
        bad = ("mask", plan)
    category, detail = bad
    if softcap:
        raise NotImplementedError(
            f"softcap={softcap} with {detail}: SDPA, the fallback, has no softcapping; use "
            "attn_implementation='eager'"
        )
    _note(f"sdpa: {category}", f"flash_pipeline falls back to SDPA: {detail}")
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )
