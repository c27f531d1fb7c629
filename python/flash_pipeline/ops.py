"""The torch custom op ``flash_pipeline::fwd`` over the compiled kernels.

``torch.ops.flash_pipeline.fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
q_descale=None, k_descale=None, v_descale=None) -> (out, lse)``

* q (batch, seqlen_q, heads, head_dim), k and v (batch, seqlen_k, kv_heads,
  head_dim): CUDA, float16, bfloat16 or float8_e4m3fn, one dtype and one
  device, heads a multiple of kv_heads (GQA/MQA: q head h reads kv head
  h // (heads // kv_heads)).
* float8_e4m3fn inputs (head dims 64, 128, 256) may come with FA3's
  descales, float32 (batch, kv_heads), positive: the scores are
  q_descale · k_descale · q·kᵀ·scale, the output v_descale · softmax · v, in
  bfloat16. They run on e4m3 entries (no mask or causal): the portable
  kernel's (sm_89 and sm_90) and, at head dims 128 and 256, the Hopper kernel's
  (H100/H200); else dequantised to bfloat16 for the 16-bit entries (the
  Hopper kernel's head dim 64; windows and softcap on either kernel).
* Any strides are passed to the kernels as they are, except that a tensor
  whose last (head_dim) stride is not 1 is first copied with ``.contiguous()``
  (as flash-attn's ``maybe_contiguous``).
* out is a new contiguous (batch, seqlen_q, heads, head_dim) tensor of q's
  dtype (bfloat16 for float8_e4m3fn); lse is a new float32 (batch, heads, seqlen_q) tensor, the log-sum-exp
  of each row of q·kᵀ·scale. ``causal`` masks bottom-right aligned (as
  FlashAttention >= 2.1), and so does the sliding window (window_left,
  window_right), FlashAttention's ``window_size`` (-1: unbounded); a softcap
  c > 0 makes the scores c·tanh(q·kᵀ·scale / c) (0: off). Rows that see no key
  get out = 0 and lse = -inf.
* The work is enqueued on PyTorch's current stream of q's device: nothing
  synchronises, so the op works under ``torch.compile`` (it is opaque to
  Dynamo, with a fake implementation for tracing) and in CUDA graphs. Warm up
  before capturing a graph (as PyTorch asks anyway): the first call on a device
  loads the kernels, and the first causal call of a new geometry on the Hopper
  kernel uploads its schedule and waits for that copy, which a capture forbids.
  A call's temporaries (split-KV partials, float8 inputs dequantised or V
  transposed) are allocated and freed in the stream's order from the
  extension's own memory pool, outside PyTorch's caching allocator; the pool
  keeps what calls have needed (``release_scratch`` gives it back).
* Forward only: the registered autograd formula raises NotImplementedError
  when a backward reaches it, so no tensor ever gets a wrong gradient.

Rule violations raise ValueError naming the value and the rule, before any
launch. The kernels are loaded from ``$FA_KERNEL_DIR`` when set, else from
the ``kernels`` folder inside this package.
"""

import functools
import os
from typing import Optional, Tuple

import torch

from . import _args

_PACKAGE_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")


def kernel_dir() -> str:
    """Folder with the kernel fatbins: ``$FA_KERNEL_DIR``, else ``flash_pipeline/kernels``."""
    return os.environ.get("FA_KERNEL_DIR") or _PACKAGE_KERNELS


@functools.lru_cache(maxsize=None)
def _ext():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "flash_pipeline._C, the compiled extension, is not importable: build the wheel with "
            "`cargo xtask wheel` and pip install target/wheels/flash_pipeline-*.whl"
        ) from e
    return _C


def release_scratch() -> None:
    """Give the memory the extension keeps for calls' temporaries back to the driver, as
    ``torch.cuda.empty_cache()`` does for PyTorch's cached blocks (that call does not reach
    this pool). Memory that queued work still uses stays until it is done; the next call that
    needs temporaries allocates them again. A no-op before the first call."""
    _ext().release_scratch()


def supported() -> dict:
    """What the kernels run, from the extension: {"head_dims": [...], "dtypes": ["f16", "bf16",
    "e4m3"], "e4m3_head_dims": [...]}; the head dims serve dense and serving calls alike, e4m3
    (float8_e4m3fn) dense calls at its own head dims."""
    return dict(_ext().supported())


@functools.lru_cache(maxsize=None)
def _head_dims_from_ext() -> Tuple[int, ...]:
    return tuple(supported()["head_dims"])


def head_dims() -> Tuple[int, ...]:
    """Head dims the kernels support (a default when the extension is not built)."""
    try:
        return _head_dims_from_ext()
    except ImportError:
        return _args.DEFAULT_HEAD_DIMS


def _meta(t: torch.Tensor) -> _args.Meta:
    return _args.Meta(tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""), str(t.device))


def _inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    # Only the head_dim stride must be 1; every other stride goes to the kernels as is.
    q, k, v = (t.contiguous() if t.dim() == 4 and t.stride(-1) != 1 else t for t in (q, k, v))
    dtype, dims = _args.check(_meta(q), _meta(k), _meta(v), head_dims())
    return q, k, v, dims


def _outputs(q: torch.Tensor, dims) -> Tuple[torch.Tensor, torch.Tensor]:
    b, h, _, sq, _, d = dims
    out = q.new_empty((b, sq, h, d), dtype=getattr(torch, _args.out_dtype(_meta(q).dtype)))
    lse = q.new_empty((b, h, sq), dtype=torch.float32)
    return out, lse


def _extent(t: torch.Tensor) -> int:
    """Elements of t's storage from t.data_ptr() on."""
    return t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()


@torch.library.custom_op("flash_pipeline::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    window_left, window_right = _args.check_window((window_left, window_right))
    softcap = _args.check_softcap(softcap)
    q, k, v, dims = _inputs(q, k, v)
    descales = _descales(q, dims, (q_descale, k_descale, v_descale))
    out, lse = _outputs(q, dims)
    if out.numel() == 0:  # no batch, no heads or no queries: nothing to compute
        return out, lse
    if dims[4] == 0:  # no keys: every row sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    device = q.device
    with torch.cuda.device(device):
        args = _args.forward_args(
            _meta(q),
            _meta(k),
            _meta(v),
            _meta(out),
            ptrs=(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()),
            lens=(_extent(q), _extent(k), _extent(v), _extent(out)),
            causal=causal,
            window_size=(window_left, window_right),
            softcap=softcap,
            softmax_scale=softmax_scale,
            device=device.index,
            stream=torch.cuda.current_stream(device).cuda_stream,
            kernel_dir=kernel_dir(),
            head_dims=head_dims(),
            descales=tuple(None if t is None else _meta(t) for t in descales),
            descale_ptrs=tuple(0 if t is None else t.data_ptr() for t in descales),
        )
        _ext().forward(*args)
    return out, lse


def _descales(q: torch.Tensor, dims, descales) -> tuple:
    """FP8 descales checked (float32 (batch, kv_heads) on q's device), made contiguous."""
    checked = []
    for name, t in zip(_args.DESCALES, descales):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a float32 torch.Tensor or None, not {type(t).__name__}")
        t = None if t is None else t.contiguous()
        _args.check_descale(name, None if t is None else _meta(t), _meta(q), dims[0], dims[2])
        checked.append(t)
    return tuple(checked)


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, q_descale=None, k_descale=None, v_descale=None):
    q, k, v, dims = _inputs(q, k, v)
    _descales(q, dims, (q_descale, k_descale, v_descale))
    return _outputs(q, dims)


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, grad_out, grad_lse):
    raise NotImplementedError(
        "flash_pipeline::fwd is forward-only: it has no backward. Run it under torch.no_grad() or "
        "torch.inference_mode(), or detach q, k, v; for training use an attention with a backward."
    )


fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- serving --
#
# ``torch.ops.flash_pipeline.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
# block_table, max_seqlen_q, max_seqlen_k, softmax_scale, causal, num_splits, window_left=-1,
# window_right=-1, softcap=0.0) -> (out, lse)``
# is the one op under flash_attn_varlen_func and flash_attn_with_kvcache: the
# kernel-ffi serving call (``Attention::forward_varlen_on``) on the current
# stream, as opaque to Dynamo as ``fwd`` and with a fake implementation.


def validate_indices() -> bool:
    """``FLASH_PIPELINE_VALIDATE=1``: check every offset, length and page on the host first
    (a synchronising copy; not while capturing a CUDA graph)."""
    return os.environ.get("FLASH_PIPELINE_VALIDATE", "") not in ("", "0")


def check_index_types(**tensors) -> None:
    """Index arguments are int32 tensors or None: a TypeError naming the one that is not."""
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be an int32 torch.Tensor, not {type(t).__name__}")


def _index_meta(name: str, t) -> Optional[_args.Meta]:
    check_index_types(**{name: t})
    return None if t is None else _meta(t)


def check_index(name: str, t, q: torch.Tensor, rank: int = 1) -> None:
    """An int32 index tensor of the call: on q's device, `rank`-D, its last dim contiguous."""
    _args.check_index(name, _index_meta(name, t), str(q.device), rank)


def _serving_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
                    num_splits):
    """Checks a serving call before anything runs; returns q, k, v (head-dim stride 1), their
    [batch, heads, seq, head_dim] views and the number of sequences."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    # As fwd: only the head-dim stride must be 1.
    q, k, v = (t.contiguous() if t.dim() >= 3 and t.stride(-1) != 1 else t for t in (q, k, v))
    mq, mk, mv = _meta(q), _meta(k), _meta(v)
    views = (_args.serving_view("q", mq, cu_seqlens_q is not None),
             _args.serving_view("k", mk, cu_seqlens_k is not None),
             _args.serving_view("v", mv, cu_seqlens_k is not None))
    _args.check_serving(mq, mk, mv, head_dims())
    index = {}
    for name, t, rank in (("cu_seqlens_q", cu_seqlens_q, 1), ("cu_seqlens_k", cu_seqlens_k, 1),
                          ("seqused_k", seqused_k, 1), ("block_table", block_table, 2)):
        index[name] = _index_meta(name, t)
        _args.check_index(name, index[name], mq.device, rank)
    seqs = _args.serving_seqs(mq, mk, **index)
    _args.check_counts(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, num_splits=num_splits)
    return q, k, v, views, seqs


def _serving_outputs(q: torch.Tensor, packed_q: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """out in q's shape; lse (nheads, total_q) packed, else (batch, nheads, seqlen_q), float32:
    the kernel's [batch, heads, rows], and FlashAttention's layouts."""
    out = q.new_empty(q.shape)
    if packed_q:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


def _array(t: Optional[torch.Tensor]) -> Tuple[int, int]:
    """(device address, elements) of an index tensor; (0, 0) for none."""
    return (0, 0) if t is None else (t.data_ptr(), t.numel() if t.dim() == 1 else _extent(t))


def check_append(q, k_cache, v_cache, k, v, cache_seqlens, block_table, max_seqlen_k, num_splits) -> None:
    """Every rule of flash_attn_with_kvcache's call and of its append, checked before the caches
    change; with FLASH_PIPELINE_VALIDATE=1 also where each appended key goes (host copies)."""
    _serving_inputs(q, k_cache, v_cache, None, None, cache_seqlens, block_table, q.shape[1], max_seqlen_k, num_splits)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    _args.check_new_keys(_meta(q), _meta(k_cache), _meta(k), _meta(v))
    if validate_indices():
        table = None if block_table is None else block_table.tolist()
        _args.check_append(cache_seqlens.tolist(), k.shape[1], max_seqlen_k, table, k_cache.shape[1], k_cache.shape[0])


@torch.library.custom_op("flash_pipeline::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    num_splits: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A serving call: q packed (total_q, nheads, headdim) with cu_seqlens_q or dense
    (batch, seqlen_q, nheads, headdim); k and v packed with cu_seqlens_k, paged
    (num_pages, page_size, nheads_k, headdim) with block_table, or dense; seqused_k the keys
    each sequence uses; num_splits 0 lets the planner choose; a window and softcap as ``fwd``'s,
    aligned to each sequence's own lengths. Returns (out in q's shape, lse).
    Packed rows that no sequence covers are left unwritten (as FlashAttention's)."""
    window = _args.check_window((window_left, window_right))
    softcap = _args.check_softcap(softcap)
    q, k, v, (qv, kv, vv), seqs = _serving_inputs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, num_splits
    )
    packed_q = cu_seqlens_q is not None
    out, lse = _serving_outputs(q, packed_q)
    if out.numel() == 0 or seqs == 0:  # nothing to compute
        return out, lse
    if k.numel() == 0:  # no keys at all (paged k has pages, checked above): every row sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    device = q.device
    ov = _args.serving_view("out", _meta(out), packed_q)
    table = (0, 0, 0, 0)
    if block_table is not None:
        # A size-1 dim's stride is arbitrary in torch: one row's stride is its width.
        stride = block_table.stride(0) if block_table.shape[0] > 1 else block_table.shape[1]
        table = (*_array(block_table), block_table.shape[1], stride)
    with torch.cuda.device(device):
        _ext().forward_varlen(
            (q.data_ptr(), *qv, _extent(q)),
            (k.data_ptr(), *kv, _extent(k)),
            (v.data_ptr(), *vv, _extent(v)),
            (out.data_ptr(), *ov, _extent(out)),
            (lse.data_ptr(), lse.numel()),
            _args.DTYPES[_meta(q).dtype],
            _array(cu_seqlens_q),
            _array(cu_seqlens_k),
            _array(seqused_k),
            table,
            seqs,
            int(max_seqlen_q),
            int(max_seqlen_k),
            bool(causal),
            window,
            softcap,
            None if softmax_scale is None else float(softmax_scale),
            int(num_splits),
            validate_indices(),
            device.index,
            torch.cuda.current_stream(device).cuda_stream,
            kernel_dir(),
        )
    return out, lse


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      num_splits, window_left=-1, window_right=-1, softcap=0.0):
    q, *_ = _serving_inputs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, num_splits
    )
    return _serving_outputs(q, cu_seqlens_q is not None)


def _varlen_backward(ctx, grad_out, grad_lse):
    raise NotImplementedError(
        "flash_pipeline::varlen_fwd is forward-only: it has no backward. Run it under torch.no_grad() or "
        "torch.inference_mode(), or detach q, k, v."
    )


varlen_fwd.register_autograd(_varlen_backward, setup_context=_setup_context)
