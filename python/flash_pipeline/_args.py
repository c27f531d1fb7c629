"""The rules for calling ``flash_pipeline._C.forward`` and ``forward_varlen``, written without torch.

Tensors are described by :class:`Meta` (shape, element strides, dtype name,
device string), so the checks and the argument tuple can be tested where
neither torch nor a GPU is present. ``flash_pipeline.ops`` builds the
``Meta`` of real (and fake) tensors and calls these functions.

Layout is FlashAttention's: q is (batch, seqlen_q, heads, head_dim), k and v
are (batch, seqlen_k, kv_heads, head_dim). The extension takes element strides
of (batch, head, seq) and needs the head_dim stride to be 1.
"""

import operator
from typing import NamedTuple, Optional, Sequence, Tuple

# torch dtype name -> the extension's name: the 16-bit dtypes every call takes,
# and FP8, which dense calls take (q, k and v; the output is bfloat16).
DTYPES = {"float16": "f16", "bfloat16": "bf16"}
FP8_DTYPES = {"float8_e4m3fn": "e4m3"}
# Head dims of FP8 inputs (the extension's supported()["e4m3_head_dims"]).
E4M3_HEAD_DIMS = (64, 128, 256)
# FP8 descales: float32 (batch, kv_heads), FA3's names.
DESCALES = ("q_descale", "k_descale", "v_descale")
# What the kernels run when the extension cannot be asked (it is the source of truth: _C.supported()).
DEFAULT_HEAD_DIMS = (64, 96, 128, 192, 256)


class Meta(NamedTuple):
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: str  # torch name without "torch.": "float16", "bfloat16", "float32", ...
    device: str  # "cuda:0", "cpu", ...


def check(q: Meta, k: Meta, v: Meta, head_dims: Sequence[int] = DEFAULT_HEAD_DIMS) -> Tuple[str, Tuple[int, ...]]:
    """Check q, k, v against the kernels' rules.

    Returns (dtype code, dims) with dims = (batch, heads, kv_heads, seqlen_q,
    seqlen_k, head_dim). Raises ValueError naming the value and the rule.
    Strides are not checked here (see :func:`bhs_strides`).
    """
    for name, m in (("q", q), ("k", k), ("v", v)):
        if len(m.shape) != 4:
            raise ValueError(
                f"{name} has {len(m.shape)} dims {tuple(m.shape)}; it must be 4-D (batch, seqlen, nheads, headdim)"
            )
        if not m.device.startswith("cuda"):
            raise ValueError(f"{name} is on {m.device}; the kernels need CUDA tensors")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}; they must be on one CUDA device")
    if q.dtype not in DTYPES and q.dtype not in FP8_DTYPES:
        raise ValueError(f"q dtype is {q.dtype}; the kernels support float16, bfloat16 and float8_e4m3fn")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes are {q.dtype}, {k.dtype}, {v.dtype}; they must be equal")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}; they must be equal")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if bk != b:
        raise ValueError(f"k batch is {bk} but q batch is {b}; they must be equal")
    if dk != d:
        raise ValueError(f"k head dim is {dk} but q head dim is {d}; they must be equal")
    check_head_dim(d, head_dims)
    if q.dtype in FP8_DTYPES and d not in E4M3_HEAD_DIMS:
        raise ValueError(f"q head dim is {d}; float8_e4m3fn inputs take head dims {list(E4M3_HEAD_DIMS)}")
    if hk < 1:
        raise ValueError(f"k has {hk} heads; it needs at least 1")
    if h % hk != 0:
        raise ValueError(f"q has {h} heads and k has {hk}; q heads must be a multiple of kv heads (GQA/MQA)")
    return {**DTYPES, **FP8_DTYPES}[q.dtype], (b, h, hk, sq, sk, d)


def out_dtype(dtype: str) -> str:
    """The output's torch dtype name for inputs of `dtype`: theirs, bfloat16 for FP8 (FA3's)."""
    return "bfloat16" if dtype in FP8_DTYPES else dtype


def check_descale(name: str, m: Optional[Meta], q: Meta, batch: int, kv_heads: int) -> None:
    """A descale of FP8 inputs: float32 (batch, kv_heads) on q's device, contiguous."""
    if m is None:
        return
    if q.dtype not in FP8_DTYPES:
        raise ValueError(f"{name} is given but q is {q.dtype}; descales dequantise float8_e4m3fn inputs")
    if m.dtype != "float32":
        raise ValueError(f"{name} dtype is {m.dtype}; descales are float32")
    if tuple(m.shape) != (batch, kv_heads):
        raise ValueError(f"{name} has shape {tuple(m.shape)}; it must be (batch, nheads_k) = ({batch}, {kv_heads})")
    if m.device != q.device:
        raise ValueError(f"{name} is on {m.device}; it must be on q's device {q.device}")
    if kv_heads > 1 and m.stride[1] != 1 or batch > 1 and m.stride[0] != kv_heads:
        raise ValueError(f"{name} strides are {tuple(m.stride)}; it must be contiguous (make it .contiguous())")


def check_head_dim(d: int, head_dims: Sequence[int]) -> None:
    """A head dim the kernels run, dense and serving calls alike."""
    if d not in tuple(head_dims):
        raise ValueError(f"q head dim is {d}; the kernels support head dims {sorted(head_dims)}")


def bhs_strides(name: str, m: Meta) -> Tuple[int, int, int]:
    """Element strides of (batch, head, seq) of a (batch, seq, head, head_dim) tensor."""
    if m.stride[3] != 1:
        raise ValueError(f"{name} head-dim stride is {m.stride[3]}; it must be 1 (make it .contiguous())")
    return (m.stride[0], m.stride[2], m.stride[1])


def forward_args(
    q: Meta,
    k: Meta,
    v: Meta,
    out: Meta,
    *,
    ptrs: Tuple[int, int, int, int, int],
    lens: Tuple[int, int, int, int],
    causal: bool,
    softmax_scale: Optional[float],
    device: int,
    stream: int,
    kernel_dir: str,
    head_dims: Sequence[int] = DEFAULT_HEAD_DIMS,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    descales: Tuple[Optional[Meta], Optional[Meta], Optional[Meta]] = (None, None, None),
    descale_ptrs: Tuple[int, int, int] = (0, 0, 0),
) -> tuple:
    """The positional arguments of ``_C.forward``, in its order.

    ptrs are the device addresses (q, k, v, out, lse; lse 0 = not wanted),
    lens the elements reachable from the q, k, v, out addresses; descales
    (FP8 inputs only) those of q_descale, k_descale, v_descale (0: none).
    """
    dtype, dims = check(q, k, v, head_dims)
    window = check_window(window_size)
    softcap = check_softcap(softcap)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != out_dtype(q.dtype) or out.device != q.device:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}; it must be q's shape, {out_dtype(q.dtype)}, on q's device"
        )
    for name, m in zip(DESCALES, descales):
        check_descale(name, m, q, dims[0], dims[2])
    strides = tuple(bhs_strides(n, m) for n, m in (("q", q), ("k", k), ("v", v), ("out", out)))
    scale = None if softmax_scale is None else float(softmax_scale)
    ptrs_d = tuple(p if m is not None else 0 for p, m in zip(descale_ptrs, descales))
    return (
        *ptrs, dtype, dims, *strides, tuple(lens), bool(causal), window, softcap, scale, device, stream, kernel_dir,
        DTYPES[out_dtype(q.dtype)], ptrs_d,
    )


def check_window(window_size) -> Tuple[int, int]:
    """FlashAttention's window_size: two key counts, negative (-1) for unbounded."""
    try:
        left, right = (operator.index(x) for x in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size={window_size!r}: it must be a pair (left, right) of ints, -1 for unbounded")
    for name, x in (("left", left), ("right", right)):
        if x >= 2**32:
            raise ValueError(f"window_size {name} is {x}; it must be below 2^32 (or -1, unbounded)")
    return max(left, -1), max(right, -1)


def check_softcap(softcap) -> float:
    """FlashAttention's softcap: a finite cap > 0, or off (0.0; negative is off too, as flash-attn)."""
    c = float(softcap)
    if c != c or abs(c) > 3.4e38:  # the kernels take it as a float32
        raise ValueError(f"softcap is {softcap}; it must be finite in float32 (0.0: off)")
    if 0.0 < c < 1.2e-38:
        raise ValueError(f"softcap is {softcap}; a cap that small underflows float32 (0.0: off)")
    return max(c, 0.0)


# ---------------------------------------------------------------- serving --
# ``_C.forward_varlen`` takes each tensor as [batch, heads, seq, head_dim] with
# element strides of (batch, head, seq). FlashAttention's serving layouts map
# onto that view: packed (total, heads, head_dim) is one batch of total rows,
# dense (batch, seqlen, heads, head_dim) is itself, and a paged cache
# (num_pages, page_size, heads, head_dim) is a batch of pages.


def serving_view(name: str, m: Meta, packed: bool) -> Tuple[Tuple[int, int, int, int], Tuple[int, int, int]]:
    """(dims, strides) of a packed (rank 3) or dense/paged (rank 4) tensor."""
    rank = 3 if packed else 4
    if len(m.shape) != rank:
        want = "(total, nheads, headdim)" if packed else "(batch, seqlen, nheads, headdim)"
        raise ValueError(f"{name} has {len(m.shape)} dims {tuple(m.shape)}; it must be {rank}-D {want}")
    if not m.device.startswith("cuda"):
        raise ValueError(f"{name} is on {m.device}; the kernels need CUDA tensors")
    if m.dtype not in DTYPES:
        raise ValueError(f"{name} dtype is {m.dtype}; serving calls take float16 and bfloat16")
    if m.stride[-1] != 1:
        raise ValueError(f"{name} head-dim stride is {m.stride[-1]}; it must be 1 (make it .contiguous())")
    if packed:
        total, h, d = m.shape
        return (1, h, total, d), (0, m.stride[1], m.stride[0])
    b, s, h, d = m.shape
    return (b, h, s, d), (m.stride[0], m.stride[2], m.stride[1])


def check_index(name: str, m: Optional[Meta], device: str, rank: int = 1) -> None:
    """An int32 index tensor (offsets, lengths, block table) on the tensors' device."""
    if m is None:
        return
    if m.dtype != "int32":
        raise ValueError(f"{name} dtype is {m.dtype}; it must be int32 (use .int())")
    if m.device != device:
        raise ValueError(f"{name} is on {m.device} but q is on {device}; they must be on one CUDA device")
    if len(m.shape) != rank:
        raise ValueError(f"{name} has shape {tuple(m.shape)}; it must be {rank}-D")
    if rank == 1 and m.stride[0] != 1 and m.shape[0] > 1:
        raise ValueError(f"{name} has stride {m.stride[0]}; it must be contiguous (use .contiguous())")
    if rank == 2 and m.stride[1] != 1 and m.shape[1] > 1:
        raise ValueError(f"{name} rows are not contiguous (stride {m.stride[1]}); use .contiguous()")


def check_serving(q: Meta, k: Meta, v: Meta, head_dims: Sequence[int] = DEFAULT_HEAD_DIMS) -> None:
    """The rules the tensors of a serving call share: one device and dtype, k and v alike,
    a supported head dim, q heads a multiple of k heads."""
    for name, m in (("k", k), ("v", v)):
        if m.device != q.device:
            raise ValueError(f"{name} is on {m.device} but q is on {q.device}; they must be on one CUDA device")
        if m.dtype != q.dtype:
            raise ValueError(f"q, k, v dtypes are {q.dtype}, {k.dtype}, {v.dtype}; they must be equal")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}; they must be equal")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k head dim is {k.shape[-1]} but q head dim is {q.shape[-1]}; they must be equal")
    check_head_dim(q.shape[-1], head_dims)
    h, hk = q.shape[-2], k.shape[-2]
    if hk < 1 or h % hk != 0:
        raise ValueError(f"q has {h} heads and k has {hk}; q heads must be a multiple of kv heads (GQA/MQA)")


def serving_seqs(
    q: Meta,
    k: Meta,
    cu_seqlens_q: Optional[Meta],
    cu_seqlens_k: Optional[Meta],
    seqused_k: Optional[Meta],
    block_table: Optional[Meta],
) -> int:
    """The sequences of a serving call (cu_seqlens_q's length - 1 when q is packed, else q's
    batch), checked against every array with an entry per sequence and against k's layout.
    The index tensors' ranks are checked first (:func:`check_index`)."""
    if cu_seqlens_q is not None:
        if cu_seqlens_q.shape[0] < 1:
            raise ValueError("cu_seqlens_q is empty; it holds batch + 1 offsets into q's rows, from 0")
        seqs = cu_seqlens_q.shape[0] - 1
        what = f"cu_seqlens_q holds {seqs + 1} offsets ({seqs} sequences)"
    else:
        seqs = q.shape[0]
        what = f"q has batch {seqs}"
    if cu_seqlens_k is not None and cu_seqlens_k.shape[0] != seqs + 1:
        raise ValueError(f"cu_seqlens_k holds {cu_seqlens_k.shape[0]} offsets but {what}; it must hold {seqs + 1}")
    if seqused_k is not None and seqused_k.shape[0] != seqs:
        raise ValueError(f"seqused_k holds {seqused_k.shape[0]} lengths but {what}; it must hold {seqs}")
    if block_table is not None:
        if cu_seqlens_k is not None:
            raise ValueError(
                "block_table and cu_seqlens_k are both given: paged k and v take each sequence's length from "
                "seqused_k; pass cu_seqlens_k=None"
            )
        if block_table.shape[0] != seqs:
            raise ValueError(f"block_table has {block_table.shape[0]} rows but {what}; it needs one per sequence")
        if block_table.shape[1] < 1 or k.shape[0] < 1 or k.shape[1] < 1:
            raise ValueError(
                f"paged k has shape {tuple(k.shape)} and block_table {tuple(block_table.shape)}: pages, "
                "page size and page slots must all be at least 1"
            )
    elif cu_seqlens_k is None and k.shape[0] != seqs:
        raise ValueError(
            f"k has batch {k.shape[0]} but {what}; without cu_seqlens_k or block_table, k holds one sequence "
            "per batch entry"
        )
    return seqs


def check_counts(**counts: int) -> None:
    """max_seqlen_q, max_seqlen_k, num_splits: whole numbers from 0 (num_splits 0: the planner's)."""
    for name, n in counts.items():
        if n < 0:
            raise ValueError(f"{name}={n}; it must be 0 or more")


def check_new_keys(q: Meta, k_cache: Meta, k: Meta, v: Meta) -> None:
    """k and v that flash_attn_with_kvcache appends: (batch, seqlen_new, nheads_k, headdim)
    with q's batch and the cache's heads, head dim, dtype and device."""
    for name, m in (("k", k), ("v", v)):
        if len(m.shape) != 4:
            raise ValueError(
                f"{name} has {len(m.shape)} dims {tuple(m.shape)}; "
                "it must be 4-D (batch, seqlen_new, nheads_k, headdim)"
            )
        if m.dtype != k_cache.dtype or m.device != k_cache.device:
            raise ValueError(
                f"{name} is {m.dtype} on {m.device} but k_cache is {k_cache.dtype} on {k_cache.device}; they must match"
            )
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}; they must be equal")
    if len(k_cache.shape) != 4 or k.shape[0] != q.shape[0] or tuple(k.shape[2:]) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"k has shape {tuple(k.shape)}; the appended keys must be (batch {q.shape[0]}, seqlen_new, "
            f"{', '.join(map(str, k_cache.shape[2:]))}): q's batch, k_cache's heads and head dim"
        )


def check_append(
    cache_seqlens: Sequence[int],
    seqlen_new: int,
    capacity: int,
    block_table: Optional[Sequence[Sequence[int]]] = None,
    page_size: int = 1,
    num_pages: int = 0,
) -> None:
    """The host check (FLASH_PIPELINE_VALIDATE=1) of where flash_attn_with_kvcache appends:
    each sequence's positions cache_seqlens[b] .. + seqlen_new - 1 lie in its `capacity` slots
    and, when paged, on pages 0..num_pages - 1 of the cache."""
    for b, start in enumerate(cache_seqlens):
        if start < 0 or start + seqlen_new > capacity:
            raise ValueError(
                f"cache_seqlens[{b}] = {start}: appending {seqlen_new} keys writes positions {start}.."
                f"{start + seqlen_new - 1}, and a sequence's cache holds positions 0..{capacity - 1}"
            )
        if block_table is None or seqlen_new == 0:
            continue
        for slot in range(start // page_size, (start + seqlen_new - 1) // page_size + 1):
            page = block_table[b][slot]
            if not 0 <= page < num_pages:
                raise ValueError(
                    f"block_table[{b}][{slot}] = {page}: sequence {b}'s appended keys go on it, and the cache "
                    f"has pages 0..{num_pages - 1}"
                )
