"""SDPA's flash backend on these kernels, through PyTorch's provider registry
(``torch.nn.attention.register_flash_attention_impl``, PyTorch >= 2.11).

    import flash_pipeline.sdpa
    from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl
    flash_pipeline.sdpa.register()                 # makes "flash_pipeline" available; activates nothing
    activate_flash_attention_impl("flash_pipeline")
    ...  F.scaled_dot_product_attention(...) where SDPA picks its flash backend ...
    restore_flash_attention_impl()                 # aten's own flash kernels again

Activated, ``aten::_scaled_dot_product_flash_attention`` (what SDPA's flash
backend calls, in BHSD layout) runs ``flash_pipeline::fwd`` where the kernels
can: fp16/bf16, head dim 64 or 128, heads a multiple of the key-value heads,
and ``is_causal`` only where seqlen_q == seqlen_k. Other head dims, and a
direct call of the aten op with ``is_causal`` and unequal lengths (SDPA's
semantics align that mask top-left, these kernels bottom-right; SDPA itself
never sends it to its flash backend), are computed by a plain float32 math
path here instead (correct, not fast); dropout and a debug mask raise. SDPA chooses its backend
before this runs: ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``
makes sure it is this one.

Forward only: SDPA's backward through the flash backend
(``aten::_scaled_dot_product_flash_attention_backward``) raises
NotImplementedError while this is active, so a training step fails loudly
instead of getting a wrong gradient; restore the default to train.
"""

import dataclasses
import math
from typing import Optional

import torch
from torch.library import Library

from . import ops

NAME = "flash_pipeline"


@dataclasses.dataclass
class _Handle:
    """Keeps the registrations alive; dropping the library restores aten's kernels."""

    library: Optional[Library]

    def remove(self) -> None:
        self.library = None


def register(name: str = NAME) -> str:
    """Makes the kernels available to ``activate_flash_attention_impl(name)``; returns the name."""
    from torch.nn.attention import register_flash_attention_impl

    register_flash_attention_impl(name, register_fn=_install)
    return name


def _install() -> _Handle:
    lib = Library("aten", "IMPL", "CUDA")  # noqa: TOR901 (an SDPA provider overrides aten's CUDA kernels)
    lib.impl("_scaled_dot_product_flash_attention", _forward, "CUDA")
    lib.impl("_scaled_dot_product_flash_attention_backward", _backward, "CUDA")
    return _Handle(lib)


def _kernels_run(query, key, dropout_p, is_causal, return_debug_mask) -> bool:
    b, h, sq, d = query.shape
    hk, sk = key.shape[1], key.shape[2]
    return (
        dropout_p == 0.0
        and not return_debug_mask
        and query.dtype in (torch.float16, torch.bfloat16)
        and d in ops.head_dims()
        and hk > 0
        and h % hk == 0
        and not (is_causal and sq != sk)
    )


def _math(query, key, value, is_causal, scale):
    """out (BHSD, query's dtype) and lse (b, h, sq) in float32, SDPA's semantics (causal top-left)."""
    h, hk = query.shape[1], key.shape[1]
    k = key.float().repeat_interleave(h // hk, dim=1) if hk != h else key.float()
    v = value.float().repeat_interleave(h // hk, dim=1) if hk != h else value.float()
    s = query.float() @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    if is_causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v).to(query.dtype), lse


def _forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    sq, sk = query.shape[2], key.shape[2]
    if _kernels_run(query, key, dropout_p, is_causal, return_debug_mask):
        out, lse = torch.ops.flash_pipeline.fwd(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scale, is_causal, -1, -1, 0.0
        )
        out = out.transpose(1, 2)  # BHSD view of the (b, s, h, d) buffer: aten's flash output layout
    else:
        if dropout_p != 0.0 or return_debug_mask:
            raise NotImplementedError(
                f"flash_pipeline's SDPA provider: dropout_p={dropout_p} and return_debug_mask="
                f"{return_debug_mask} are not supported; restore_flash_attention_impl() to use them"
            )
        out, lse = _math(query, key, value, is_causal, scale)
        # aten's flash output layout (its meta function's strides): a BHSD view of (b, s, h, d)
        b, h, _, d = query.shape
        out = torch.empty((b, sq, h, d), dtype=out.dtype, device=out.device).transpose(1, 2).copy_(out)
    device = query.device
    rng_state = torch.zeros(2, dtype=torch.uint64, device=device)
    unused = torch.empty((), dtype=torch.uint64, device=device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=device)
    return out, lse, None, None, sq, sk, rng_state, unused, debug_mask


def _backward(*args, **kwargs):
    raise NotImplementedError(
        "flash_pipeline's SDPA provider is forward-only: it has no backward. Run inference under "
        "torch.no_grad(), or call torch.nn.attention.restore_flash_attention_impl() to train."
    )
