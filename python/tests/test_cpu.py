"""Tests that need no GPU.

The argument rules (flash_pipeline/_args.py) are tested without torch: the
file is loaded on its own, so neither torch nor the compiled extension is
needed. The rest skips where torch (or transformers) is missing: the op's
schema, its fake implementation, the errors of flash_attn_func and the
transformers registration and fallback decisions.

The package is imported as installed (the wheel) when it is, else from this
source tree.
"""

import importlib.util
import pathlib
import sys
import types

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]


def _load_args():
    spec = importlib.util.spec_from_file_location("_flash_pipeline_args", PYTHON_DIR / "flash_pipeline" / "_args.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


A = _load_args()


def meta(shape, dtype="float16", device="cuda:0", stride=None):
    if stride is None:  # contiguous
        stride, n = [], 1
        for s in reversed(shape):
            stride.insert(0, n)
            n *= s
    return A.Meta(tuple(shape), tuple(stride), dtype, device)


def fp():
    """The package, with torch (skips without torch)."""
    pytest.importorskip("torch")
    try:
        import flash_pipeline
    except ImportError:
        sys.path.append(str(PYTHON_DIR))  # after site-packages: an installed wheel wins
        import flash_pipeline
    return flash_pipeline


# ---------------------------------------------------------------- without torch


def test_check_accepts_gqa():
    q, k = meta((2, 7, 8, 64), "bfloat16"), meta((2, 512, 2, 64), "bfloat16")
    assert A.check(q, k, k) == ("bf16", (2, 8, 2, 7, 512, 64))
    assert A.check(meta((1, 3, 4, 128)), meta((1, 3, 4, 128)), meta((1, 3, 4, 128)))[0] == "f16"


@pytest.mark.parametrize(
    "q, k, v, match",
    [
        (meta((2, 7, 8)), meta((2, 7, 8, 64)), meta((2, 7, 8, 64)), r"q has 3 dims .* must be 4-D"),
        (meta((2, 7, 8, 64), device="cpu"), meta((2, 7, 8, 64)), meta((2, 7, 8, 64)), r"q is on cpu; .*CUDA"),
        (meta((2, 7, 8, 64)), meta((2, 7, 8, 64), device="cuda:1"), meta((2, 7, 8, 64), device="cuda:1"), "one CUDA device"),
        (meta((2, 7, 8, 64), "float32"), meta((2, 7, 8, 64), "float32"), meta((2, 7, 8, 64), "float32"), "q dtype is float32"),
        (meta((2, 7, 8, 64)), meta((2, 7, 8, 64), "bfloat16"), meta((2, 7, 8, 64)), "dtypes are float16, bfloat16, float16"),
        (meta((2, 7, 8, 64)), meta((2, 9, 8, 64)), meta((2, 7, 8, 64)), r"k shape \(2, 9, 8, 64\) differs from v shape"),
        (meta((2, 7, 8, 64)), meta((3, 7, 8, 64)), meta((3, 7, 8, 64)), "k batch is 3 but q batch is 2"),
        (meta((2, 7, 8, 64)), meta((2, 7, 8, 128)), meta((2, 7, 8, 128)), "k head dim is 128 but q head dim is 64"),
        (meta((2, 7, 8, 80)), meta((2, 7, 8, 80)), meta((2, 7, 8, 80)),
         r"q head dim is 80; the kernels support head dims \[64, 96, 128, 192, 256\]"),
        (meta((2, 7, 8, 64)), meta((2, 7, 3, 64)), meta((2, 7, 3, 64)), "q has 8 heads and k has 3"),
        (meta((2, 7, 8, 64)), meta((2, 7, 0, 64)), meta((2, 7, 0, 64)), "k has 0 heads"),
    ],
)
def test_check_rejects(q, k, v, match):
    with pytest.raises(ValueError, match=match):
        A.check(q, k, v)


def test_forward_args_packed_qkv_slice():
    # q, k, v are slices q = qkv[:, :, 0] of a packed (b, s, 3, h, d) tensor: strides pass as they are.
    b, s, h, d = 2, 5, 4, 64
    packed = (s * 3 * h * d, 3 * h * d, d, 1)
    q, k, v = (meta((b, s, h, d), stride=packed) for _ in range(3))
    out = meta((b, s, h, d))
    args = A.forward_args(
        q, k, v, out, ptrs=(10, 20, 30, 40, 0), lens=(100, 90, 80, 70), causal=1, softmax_scale=None,
        device=0, stream=1234, kernel_dir="/k",
    )
    assert args == (
        10, 20, 30, 40, 0, "f16", (b, h, h, s, s, d),
        (s * 3 * h * d, d, 3 * h * d), (s * 3 * h * d, d, 3 * h * d), (s * 3 * h * d, d, 3 * h * d),
        (s * h * d, d, h * d), (100, 90, 80, 70), True, (-1, -1), 0.0, None, 0, 1234, "/k", "f16", (0, 0, 0),
    )
    assert len(args) == 21  # _C.forward's parameter count
    assert A.forward_args(q, k, v, out, ptrs=(1, 2, 3, 4, 5), lens=(1, 1, 1, 1), causal=False, softmax_scale=0.5,
                          device=1, stream=0, kernel_dir="k")[15] == 0.5


def test_fp8_inputs_write_bfloat16_with_fa3_descales():
    b, s, h, hk, d = 2, 5, 4, 2, 128
    q, k = meta((b, s, h, d), "float8_e4m3fn"), meta((b, s, hk, d), "float8_e4m3fn")
    out = meta((b, s, h, d), "bfloat16")
    scale = meta((b, hk), "float32")
    common = dict(lens=(1, 1, 1, 1), causal=False, softmax_scale=None, device=0, stream=0, kernel_dir="k")
    args = A.forward_args(q, k, k, out, ptrs=(1, 2, 3, 4, 0), descales=(scale, None, scale), descale_ptrs=(7, 8, 9), **common)
    assert args[5] == "e4m3" and args[19:] == ("bf16", (7, 0, 9))
    with pytest.raises(ValueError, match="out is .* it must be q's shape, bfloat16"):
        A.forward_args(q, k, k, meta((b, s, h, d), "float8_e4m3fn"), ptrs=(1, 2, 3, 4, 0), **common)
    with pytest.raises(ValueError, match=r"k_descale has shape \(2, 4\); it must be \(batch, nheads_k\) = \(2, 2\)"):
        A.forward_args(q, k, k, out, ptrs=(1, 2, 3, 4, 0), descales=(None, meta((b, h), "float32"), None), **common)
    with pytest.raises(ValueError, match="v_descale dtype is bfloat16; descales are float32"):
        A.forward_args(q, k, k, out, ptrs=(1, 2, 3, 4, 0), descales=(None, None, meta((b, hk), "bfloat16")), **common)
    with pytest.raises(ValueError, match="q_descale strides are"):
        A.forward_args(q, k, k, out, ptrs=(1, 2, 3, 4, 0), descales=(meta((b, hk), "float32", stride=(1, b)), None, None), **common)
    bf = meta((b, s, h, d), "bfloat16")
    with pytest.raises(ValueError, match="q_descale is given but q is bfloat16; descales dequantise float8_e4m3fn"):
        A.forward_args(bf, bf, bf, bf, ptrs=(1, 2, 3, 4, 0), descales=(scale, None, None), **common)
    q96 = meta((b, s, h, 96), "float8_e4m3fn")
    with pytest.raises(ValueError, match=r"head dim is 96; float8_e4m3fn inputs take head dims \[64, 128, 256\]"):
        A.check(q96, q96, q96)
    with pytest.raises(ValueError, match="serving calls take float16 and bfloat16"):
        A.serving_view("q", meta((9, 6, 64), "float8_e4m3fn"), packed=True)


def test_windows_and_softcaps_as_flash_attn_takes_them():
    assert A.check_window((-1, -1)) == (-1, -1)
    assert A.check_window([4096, 0]) == (4096, 0)
    assert A.check_window((-5, 3)) == (-1, 3)  # any negative is unbounded, as flash-attn
    for bad in [(1,), (1, 2, 3), None, ("a", 0)]:
        with pytest.raises(ValueError, match="it must be a pair"):
            A.check_window(bad)
    with pytest.raises(ValueError, match="window_size right is 4294967296"):
        A.check_window((0, 2**32))
    with pytest.raises(ValueError, match="it must be a pair"):
        A.check_window((2.7, 0))  # not an int: refused, not truncated
    assert A.check_softcap(50) == 50.0 and A.check_softcap(0) == 0.0 and A.check_softcap(-3.0) == 0.0
    for bad in [float("nan"), float("inf"), 1e39]:
        with pytest.raises(ValueError, match="must be finite in float32"):
            A.check_softcap(bad)
    with pytest.raises(ValueError, match="underflows float32"):
        A.check_softcap(1e-40)


def test_forward_args_rejects_head_dim_stride_and_bad_out():
    q = meta((1, 4, 2, 64), stride=(512, 128, 64, 2))
    k = meta((1, 4, 2, 64))
    common = dict(ptrs=(1, 2, 3, 4, 0), lens=(1, 1, 1, 1), causal=False, softmax_scale=None, device=0, stream=0, kernel_dir="k")
    with pytest.raises(ValueError, match="q head-dim stride is 2; it must be 1"):
        A.forward_args(q, k, k, meta((1, 4, 2, 64)), **common)
    with pytest.raises(ValueError, match="out is"):
        A.forward_args(k, k, k, meta((1, 4, 2, 64), "bfloat16"), **common)


# ---------------------------------------------------------------- serving rules, without torch


def test_serving_views_map_flash_attention_layouts():
    # Packed (total, heads, head_dim): one batch of total rows.
    assert A.serving_view("q", meta((10, 4, 64)), True) == ((1, 4, 10, 64), (0, 64, 256))
    # Paged (pages, page_size, heads, head_dim): a batch of pages.
    assert A.serving_view("k", meta((7, 16, 2, 128)), False) == ((7, 2, 16, 128), (4096, 128, 256))
    with pytest.raises(ValueError, match="must be 3-D"):
        A.serving_view("q", meta((1, 10, 4, 64)), True)
    with pytest.raises(ValueError, match="head-dim stride is 2"):
        A.serving_view("k", meta((7, 16, 2, 64), stride=(4096, 256, 128, 2)), False)
    with pytest.raises(ValueError, match="q is on cpu"):
        A.serving_view("q", meta((10, 4, 64), device="cpu"), True)
    with pytest.raises(ValueError, match="k dtype is float32"):
        A.serving_view("k", meta((10, 4, 64), "float32"), True)


def test_serving_index_rules():
    A.check_index("cu_seqlens_q", meta((5,), "int32"), "cuda:0")
    A.check_index("seqused_k", meta((1,), "int32", stride=(7,)), "cuda:0")  # one entry: any stride
    for m, match in [
        (meta((5,), "int64"), "cu_seqlens_q dtype is int64; it must be int32"),
        (meta((5,), "int32", "cuda:1"), "one CUDA device"),
        (meta((5, 1), "int32"), "must be 1-D"),
        (meta((5,), "int32", stride=(2,)), "contiguous"),
    ]:
        with pytest.raises(ValueError, match=match):
            A.check_index("cu_seqlens_q", m, "cuda:0")
    A.check_index("block_table", meta((3, 8), "int32", stride=(16, 1)), "cuda:0", rank=2)  # a slice of a wider table
    with pytest.raises(ValueError, match="block_table rows are not contiguous"):
        A.check_index("block_table", meta((3, 8), "int32", stride=(1, 3)), "cuda:0", rank=2)


@pytest.mark.parametrize(
    "q, k, match",
    [
        (meta((9, 6, 64)), meta((9, 4, 64)), "q has 6 heads and k has 4"),
        (meta((9, 6, 80)), meta((9, 6, 80)), r"head dim is 80; the kernels support head dims \[64, 96, 128, 192, 256\]"),
        (meta((9, 6, 64)), meta((9, 6, 128)), "k head dim is 128 but q head dim is 64"),
        (meta((9, 6, 64)), meta((9, 6, 64), "bfloat16"), "dtypes are float16, bfloat16"),
        (meta((9, 6, 64)), meta((9, 6, 64), device="cuda:1"), "k is on cuda:1 but q is on cuda:0"),
    ],
)
def test_serving_tensor_rules(q, k, match):
    with pytest.raises(ValueError, match=match):
        A.check_serving(q, k, k)


def test_serving_sequence_count_rules():
    q, k = meta((20, 8, 64)), meta((30, 2, 64))
    cu = lambda n: meta((n,), "int32")  # noqa: E731
    assert A.serving_seqs(q, k, cu(4), cu(4), None, None) == 3
    assert A.serving_seqs(q, k, cu(1), cu(1), None, None) == 0  # no sequences
    dense_q, cache = meta((3, 1, 8, 64)), meta((3, 512, 2, 64))
    assert A.serving_seqs(dense_q, cache, None, None, cu(3), None) == 3
    pages = meta((9, 16, 2, 64))
    assert A.serving_seqs(q, pages, cu(4), None, cu(3), meta((3, 5), "int32")) == 3
    for args, match in [
        ((q, k, cu(0), cu(1), None, None), "cu_seqlens_q is empty"),
        ((q, k, cu(4), cu(5), None, None), r"cu_seqlens_k holds 5 offsets but cu_seqlens_q holds 4 .*must hold 4"),
        ((q, pages, cu(4), None, cu(2), meta((3, 5), "int32")), "seqused_k holds 2 lengths .* it must hold 3"),
        ((q, pages, cu(4), None, None, meta((2, 5), "int32")), "block_table has 2 rows .* one per sequence"),
        ((q, pages, cu(4), cu(4), None, meta((3, 5), "int32")), "block_table and cu_seqlens_k are both given"),
        ((q, meta((9, 0, 2, 64)), cu(4), None, None, meta((3, 5), "int32")), "page size and page slots"),
        ((q, pages, cu(4), None, None, meta((3, 0), "int32")), "page size and page slots"),
        ((dense_q, meta((2, 512, 2, 64)), None, None, None, None), "k has batch 2 but q has batch 3"),
    ]:
        with pytest.raises(ValueError, match=match):
            A.serving_seqs(*args)


def test_serving_counts_and_new_keys():
    A.check_counts(max_seqlen_q=0, max_seqlen_k=5, num_splits=0)
    with pytest.raises(ValueError, match="num_splits=-1; it must be 0 or more"):
        A.check_counts(max_seqlen_q=1, num_splits=-1)
    q, cache = meta((3, 2, 8, 64)), meta((3, 100, 2, 64))
    new = meta((3, 2, 2, 64))
    A.check_new_keys(q, cache, new, new)
    for k, v, match in [
        (meta((3, 2, 2)), meta((3, 2, 2)), "k has 3 dims"),
        (meta((3, 2, 2, 64), "bfloat16"), new, "k is bfloat16 on cuda:0 but k_cache is float16"),
        (new, meta((3, 3, 2, 64)), "differs from v shape"),
        (meta((2, 2, 2, 64)), meta((2, 2, 2, 64)), r"batch 3, seqlen_new, 2, 64"),
        (meta((3, 2, 4, 64)), meta((3, 2, 4, 64)), "k_cache's heads and head dim"),
    ]:
        with pytest.raises(ValueError, match=match):
            A.check_new_keys(q, cache, k, v)


def test_append_positions_host_check():
    A.check_append([0, 5, 98], 2, 100)
    A.check_append([7], 0, 7)  # nothing appended
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] = 99: appending 2 keys writes positions 99..100, .*0..99"):
        A.check_append([0, 5, 99], 2, 100)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = -1"):
        A.check_append([-1], 1, 100)
    table = [[4, 2, -1], [0, 1, 3]]  # page size 16, 5 pages
    A.check_append([31, 40], 1, 48, table, page_size=16, num_pages=5)
    with pytest.raises(ValueError, match=r"block_table\[0\]\[2\] = -1: sequence 0's appended keys go on it"):
        A.check_append([31, 40], 2, 48, table, page_size=16, num_pages=5)
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\] = 3"):
        A.check_append([31, 40], 1, 48, table, page_size=16, num_pages=3)


# ---------------------------------------------------------------- with torch, no GPU


def test_op_schema():
    fp()
    import torch

    schema = str(torch.ops.flash_pipeline.fwd.default._schema)
    assert schema.startswith(
        "flash_pipeline::fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale, bool causal, SymInt window_left, "
        "SymInt window_right, float softcap, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None)"
    )
    assert schema.endswith("-> (Tensor, Tensor)")


def test_fake_impl_shapes():
    fp()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():
            q = torch.empty(3, 7, 8, 128, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(3, 512, 2, 128, dtype=torch.bfloat16, device="cuda")
            qkv = torch.empty(3, 7, 3, 8, 128, dtype=torch.bfloat16, device="cuda")
            out, lse = torch.ops.flash_pipeline.fwd(q, k, k, None, True, 64, -1, 30.0)
            out2, _ = torch.ops.flash_pipeline.fwd(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], 0.1, False, -1, -1, 0.0)
            q8, k8 = (torch.empty(3, s, h, 128, dtype=torch.float8_e4m3fn, device="cuda") for s, h in ((7, 8), (512, 2)))
            ds = torch.ones(3, 2, device="cuda")
            out8, _ = torch.ops.flash_pipeline.fwd(q8, k8, k8, None, False, -1, -1, 0.0, ds, None, ds)
            with pytest.raises(ValueError, match="head dim is 80"):
                x = torch.empty(1, 4, 2, 80, dtype=torch.float16, device="cuda")
                torch.ops.flash_pipeline.fwd(x, x, x, None, False, -1, -1, 0.0)
    except (RuntimeError, AssertionError) as e:  # torch builds that cannot make fake CUDA tensors
        if "CUDA" not in str(e) and "cuda" not in str(e):
            raise
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    assert out.shape == (3, 7, 8, 128) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    assert out8.shape == (3, 7, 8, 128) and out8.dtype == torch.bfloat16
    assert out.is_contiguous()
    assert lse.shape == (3, 8, 7) and lse.dtype == torch.float32
    assert out2.shape == (3, 7, 8, 128) and out2.is_contiguous()


def test_flash_attn_func_unsupported_arguments():
    fa = fp()
    import torch

    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    cases = [
        (dict(dropout_p=0.1), "dropout_p=0.1"),
        (dict(alibi_slopes=torch.zeros(2)), "alibi_slopes.*not supported yet"),
    ]
    for kwargs, match in cases:
        with pytest.raises(NotImplementedError, match=match):
            fa.flash_attn_func(q, q, q, **kwargs)
    # windows and softcaps are checked before the tensors
    with pytest.raises(ValueError, match=r"window_size=\(16,\): it must be a pair"):
        fa.flash_attn_func(q, q, q, window_size=(16,))
    with pytest.raises(ValueError, match="softcap is nan; it must be finite"):
        fa.flash_attn_func(q, q, q, softcap=float("nan"))
    # accepted: deterministic (the forward is deterministic), negative softcap/window (= off, as
    # flash-attn), windows and softcaps; these then fail only on the device rule, checked by the op
    for kwargs in (dict(softcap=-1.0, window_size=(-2, -1)), dict(softcap=30.0, window_size=(16, 0))):
        with pytest.raises(ValueError, match="q is on cpu"):
            fa.flash_attn_func(q, q, q, deterministic=True, return_attn_probs=True, **kwargs)


def test_flash_attn_func_requires_grad_raises():
    fa = fp()
    import torch

    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa.flash_attn_func(q, q, q)
    with torch.no_grad(), pytest.raises(ValueError, match="q is on cpu"):
        fa.flash_attn_func(q, q, q)  # passes the grad rule, then meets the device rule


def test_packed_wrappers_check_shapes():
    fa = fp()
    import torch

    with pytest.raises(ValueError, match="qkv has shape"):
        fa.flash_attn_qkvpacked_func(torch.zeros(1, 4, 2, 2, 64))
    with pytest.raises(ValueError, match="kv has shape"):
        fa.flash_attn_kvpacked_func(torch.zeros(1, 4, 2, 64), torch.zeros(1, 4, 3, 2, 64))


def test_op_errors_name_value_and_rule():
    fp()
    import torch

    x = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="q is on cpu"):
        torch.ops.flash_pipeline.fwd(x, x, x, None, False, -1, -1, 0.0)
    with pytest.raises(ValueError, match="q has 3 dims"):
        torch.ops.flash_pipeline.fwd(x[0], x, x, None, False, -1, -1, 0.0)
    with pytest.raises(ValueError, match="window_size left is 4294967296"):
        torch.ops.flash_pipeline.fwd(x, x, x, None, False, 2**32, -1, 0.0)


def fake_cuda():
    """FakeTensorMode for CUDA-shaped fake tensors (skips on torch builds that cannot make them)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    try:
        with mode:
            torch.empty(1, device="cuda")
    except (RuntimeError, AssertionError) as e:
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    return mode


def test_serving_op_schema():
    fp()
    import torch

    schema = str(torch.ops.flash_pipeline.varlen_fwd.default._schema)
    assert schema == (
        "flash_pipeline::varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
        "Tensor? seqused_k, Tensor? block_table, SymInt max_seqlen_q, SymInt max_seqlen_k, float? softmax_scale, "
        "bool causal, SymInt num_splits, SymInt window_left=-1, SymInt window_right=-1, float softcap=0.) "
        "-> (Tensor, Tensor)"
    )


def test_serving_fake_shapes():
    fa = fp()
    import torch

    op = torch.ops.flash_pipeline.varlen_fwd
    with fake_cuda():
        q = torch.empty(11, 8, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(30, 2, 128, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        packed = op(q, k, k, cu, cu, None, None, 5, 20, None, True, 0)
        qd = torch.empty(3, 5, 8, 64, dtype=torch.float16, device="cuda")
        pages = torch.empty(9, 16, 2, 64, dtype=torch.float16, device="cuda")
        table = torch.empty(3, 3, dtype=torch.int32, device="cuda")
        lens = torch.empty(3, dtype=torch.int32, device="cuda")
        paged = op(qd, pages, pages, None, None, lens, table, 5, 48, None, False, 4)
        # the public functions, through their Python paths (lengths from cu_seqlens_k, appends)
        out, lse, none = fa.flash_attn_varlen_func(q[:, :, :64].half(), pages, pages, cu, cu, 5, 48,
                                                   block_table=table, return_attn_probs=True)
        cache = torch.empty(4, 100, 2, 64, dtype=torch.float16, device="cuda")
        new = torch.empty(3, 5, 2, 64, dtype=torch.float16, device="cuda")
        dense = fa.flash_attn_with_kvcache(qd, cache, cache.clone(), new, new, cache_seqlens=7, causal=True,
                                           return_softmax_lse=True)
        paged_append = fa.flash_attn_with_kvcache(qd, pages, pages.clone(), new, new, cache_seqlens=lens,
                                                  block_table=table, num_splits=2)
        with pytest.raises(ValueError, match="seqused_k holds 2 lengths"):
            op(qd, pages, pages, None, None, lens[:2], table, 5, 48, None, False, 0)
        with pytest.raises(ValueError, match="cu_seqlens_k dtype is int64"):
            fa.flash_attn_varlen_func(q.half(), pages, pages, cu, cu.long(), 5, 48, block_table=table)
    assert packed[0].shape == (11, 8, 128) and packed[0].dtype == torch.bfloat16
    assert packed[1].shape == (8, 11) and packed[1].dtype == torch.float32  # flash-attn's (nheads, total_q)
    assert paged[0].shape == (3, 5, 8, 64) and paged[1].shape == (3, 8, 5)  # (batch, nheads, seqlen_q)
    assert out.shape == (11, 8, 64) and lse.shape == (8, 11) and none is None
    assert dense[0].shape == (3, 5, 8, 64) and dense[1].shape == (3, 8, 5) and dense[1].dtype == torch.float32
    assert paged_append.shape == (3, 5, 8, 64)


def test_serving_unsupported_arguments():
    fa = fp()
    import torch

    q, cu = torch.zeros(4, 2, 64, dtype=torch.float16), torch.tensor([0, 4], dtype=torch.int32)
    for kwargs, match in [
        (dict(dropout_p=0.1), "dropout_p=0.1"),
        (dict(alibi_slopes=torch.zeros(2)), "alibi_slopes.*not supported yet"),
    ]:
        with pytest.raises(NotImplementedError, match=match):
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, **kwargs)
    qd, cache = torch.zeros(1, 1, 2, 64, dtype=torch.float16), torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    for kwargs, match in [
        (dict(rotary_cos=torch.zeros(8, 32)), "rotary_cos: not supported yet"),
        (dict(rotary_sin=torch.zeros(8, 32)), "rotary_sin: not supported yet"),
        (dict(cache_batch_idx=torch.zeros(1, dtype=torch.int32)), "cache_batch_idx: not supported yet"),
        (dict(cache_leftpad=torch.zeros(1, dtype=torch.int32)), "cache_leftpad: not supported yet"),
        (dict(alibi_slopes=torch.zeros(2)), "alibi_slopes.*not supported yet"),
    ]:
        with pytest.raises(NotImplementedError, match=match):
            fa.flash_attn_with_kvcache(qd, cache, cache, **kwargs)
    # the off values, windows and softcaps are accepted; these calls then meet the device rule
    with pytest.raises(ValueError, match="q is on cpu"):
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, softcap=-1.0, deterministic=True, return_attn_probs=True)
    with pytest.raises(ValueError, match="q is on cpu"):
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, window_size=(8, 0), softcap=30.0)
    with pytest.raises(ValueError, match="window_size=\\(8,\\): it must be a pair"):
        fa.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=3, window_size=(8,))
    with pytest.raises(ValueError, match="q is on cpu"):
        fa.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=3, rotary_interleaved=False)


def test_serving_argument_errors():
    fa = fp()
    import torch

    q, cu = torch.zeros(4, 2, 64, dtype=torch.float16), torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q is None"):
        fa.flash_attn_varlen_func(q, q, q, None, cu, 4, 4)
    with pytest.raises(ValueError, match="cu_seqlens_k is None; without block_table"):
        fa.flash_attn_varlen_func(q, q, q, cu, None, 4, 4)
    pages = torch.zeros(3, 16, 2, 64, dtype=torch.float16)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="pass cu_seqlens_k or seqused_k"):
        fa.flash_attn_varlen_func(q, pages, pages, cu, None, 4, 32, block_table=table)
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 torch.Tensor, not list"):
        fa.flash_attn_varlen_func(q, q, q, [0, 4], cu, 4, 4)
    with pytest.raises(TypeError, match="cu_seqlens_k must be an int32 torch.Tensor, not list"):
        fa.flash_attn_varlen_func(q, pages, pages, cu, [0, 4], 4, 32, block_table=table)
    with pytest.raises(TypeError, match="seqused_k must be an int32 torch.Tensor, not tuple"):
        fa.flash_attn_varlen_func(q, pages, pages, cu, None, 4, 32, block_table=table, seqused_k=(4,))
    qd, cache = torch.zeros(1, 1, 2, 64, dtype=torch.float16), torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    new = torch.zeros(1, 1, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="pass both or neither"):
        fa.flash_attn_with_kvcache(qd, cache, cache, k=new)
    with pytest.raises(ValueError, match="pass cache_seqlens"):
        fa.flash_attn_with_kvcache(qd, cache, cache, new, new)
    with pytest.raises(ValueError, match="q has 3 dims"):
        fa.flash_attn_with_kvcache(qd[0], cache, cache)
    with pytest.raises(TypeError, match="k_cache must be a torch.Tensor"):
        fa.flash_attn_with_kvcache(qd, None, cache)
    before = cache.clone()
    with pytest.raises(ValueError, match="q is on cpu"):  # every rule is checked before the append
        fa.flash_attn_with_kvcache(qd, cache, cache, new + 1, new + 1, cache_seqlens=2)
    assert torch.equal(cache, before)
    grad = torch.zeros(4, 2, 64, dtype=torch.float16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa.flash_attn_varlen_func(grad, q, q, cu, cu, 4, 4)
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa.flash_attn_with_kvcache(grad[None], cache, cache)


@pytest.mark.parametrize("page_size", [None, 1, 16])
def test_kvcache_append_lands_at_each_sequence_end(page_size):
    """The append of flash_attn_with_kvcache (torch indexing, device-agnostic) on CPU tensors."""
    fa = fp()
    import torch

    g = torch.Generator().manual_seed(0)
    starts, n, hk, d = [0, 5, 17], 3, 2, 8
    new_k, new_v = torch.randn(3, n, hk, d, generator=g), torch.randn(3, n, hk, d, generator=g)
    if page_size is None:
        k_cache, table = torch.zeros(4, 20, hk, d), None  # batch_cache 4 > batch 3: the first three are used
        slot_of = lambda b, p: (b, p)  # noqa: E731
    else:
        slots = -(-20 // page_size)
        perm = torch.randperm(3 * slots + 1, generator=g)
        table = perm[: 3 * slots].view(3, slots).int()
        k_cache = torch.zeros(3 * slots + 1, page_size, hk, d)
        slot_of = lambda b, p: (int(table[b, p // page_size]), p % page_size)  # noqa: E731
    v_cache = torch.zeros_like(k_cache)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for b, start in enumerate(starts):
        for j in range(n):
            expected_k[slot_of(b, start + j)] = new_k[b, j]
            expected_v[slot_of(b, start + j)] = new_v[b, j]
    seqlens = torch.tensor(starts, dtype=torch.int32)
    caches = (k_cache, v_cache) if table is not None else (k_cache[:3], v_cache[:3])
    fa._append_to_cache(*caches, new_k, new_v, seqlens, table)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_kernel_dir_env(monkeypatch):
    fa = fp()
    monkeypatch.setenv("FA_KERNEL_DIR", "/somewhere")
    assert fa.kernel_dir() == "/somewhere"
    monkeypatch.delenv("FA_KERNEL_DIR")
    assert fa.kernel_dir().endswith("kernels") and "flash_pipeline" in fa.kernel_dir()


# ---------------------------------------------------------------- transformers, no GPU


def tf():
    fp()
    pytest.importorskip("transformers")
    import flash_pipeline.transformers as fpt

    return fpt


def test_transformers_registration():
    fpt = tf()
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert fpt.register() == "fa_pipeline"
    assert ALL_ATTENTION_FUNCTIONS["fa_pipeline"] is fpt.attention_forward
    assert "fa_pipeline" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # else transformers drops masks
    with pytest.raises(ValueError, match="contains 'flash'"):
        fpt.register("flash_pipeline")


def test_transformers_mask_patterns():
    fpt = tf()
    import torch

    q = torch.zeros(2, 8, 3, 64)
    kv = torch.zeros(2, 2, 5, 64)
    causal = torch.ones(3, 5, dtype=torch.bool).tril(2).expand(2, 1, 3, 5)
    assert fpt._pattern(q, kv, kv, None, True)[0] is True
    assert fpt._pattern(q[:, :, :1], kv, kv, None, True)[0] is False  # one query row sees every key
    assert fpt._pattern(q, kv, kv, None, False)[0] is False
    assert fpt._pattern(q, kv, kv, causal, True)[0] is True  # chunked prefill after a cache
    assert fpt._pattern(q, kv, kv, torch.ones(2, 1, 3, 5, dtype=torch.bool), True)[0] is False
    padded = causal.clone()
    padded[0, :, :, 0] = False  # left padding in sequence 0: its kept rows, for the serving kernel
    plan = fpt._pattern(q, kv, kv, padded, True)
    assert isinstance(plan, fpt._Padded)
    assert plan.q_keep.tolist() == [[True] * 3] * 2 and plan.k_keep[0].tolist() == [False] + [True] * 4
    holed = causal.clone()
    holed[0, :, 2, 1] = False  # one key hidden from one row: no padding explains it
    assert isinstance(fpt._pattern(q, kv, kv, holed, True), str)
    assert isinstance(fpt._pattern(q, kv, kv, torch.zeros(2, 1, 3, 5), True), str)  # float mask
    # mask None with seqlen_k > seqlen_q > 1: transformers' empty-static-cache prefill, first seqlen_q keys
    causal_flag, left, k, v = fpt._pattern(q, kv, kv, None, True)
    assert causal_flag and left == -1 and k.shape[2] == 3 and v.shape[2] == 3
    # a sliding window of 2 (each row sees itself and 1 key before): the band of window_size (1, 0)
    band = causal & torch.ones(3, 5, dtype=torch.bool).triu(2 - 1)
    assert fpt._pattern(q, kv, kv, band, True, sliding_window=2)[:2] == (True, 1)
    assert isinstance(fpt._pattern(q, kv, kv, band, True, sliding_window=3), str)  # a different window
    assert isinstance(fpt._pattern(q, kv, kv, band, True), str)  # no window named
    # fewer keys than queries, causal, no mask: SDPA aligns top-left, the kernels bottom-right
    assert "top-left" in fpt._pattern(torch.zeros(2, 8, 5, 64), kv[:, :, :3], kv[:, :, :3], None, True)


def test_transformers_cpu_falls_back_to_sdpa():
    fpt = tf()
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=4, training=False)
    q, k, v = torch.randn(2, 8, 6, 64), torch.randn(2, 2, 6, 64), torch.randn(2, 2, 6, 64)
    before = fpt.stats.get("sdpa: device", 0)
    fpt._warned.discard("sdpa: device")
    with pytest.warns(RuntimeWarning, match="falls back to SDPA: inputs on cpu"):
        out, w = fpt.attention_forward(module, q, k, v, None, scaling=0.125)
    ref, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.125)
    assert w is None and out.shape == (2, 6, 8, 64)
    assert torch.equal(out, ref)
    assert fpt.stats["sdpa: device"] == before + 1
    with pytest.raises(NotImplementedError, match="dropout"):
        fpt.attention_forward(module, q, k, v, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="softcap"):
        fpt.attention_forward(module, q, k, v, None, softcap=50.0)


def test_sdpa_provider_registration():
    fp()
    import torch
    if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
        pytest.skip("needs PyTorch >= 2.11")
    import flash_pipeline.sdpa as provider
    from torch.nn.attention import current_flash_attention_impl, list_flash_attention_impls

    assert provider.register() == "flash_pipeline"
    assert "flash_pipeline" in list_flash_attention_impls()
    assert current_flash_attention_impl() != "flash_pipeline"  # registering activates nothing


def test_the_installed_extension_loads_without_torch():
    """The wheel's compiled extension loads and answers, torch or not (CI has no torch)."""
    spec = importlib.util.find_spec("flash_pipeline")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("flash_pipeline is not installed")
    folder = pathlib.Path(list(spec.submodule_search_locations)[0])
    if folder.resolve() == (PYTHON_DIR / "flash_pipeline").resolve():
        pytest.skip("the sources, not an installed wheel")
    built = sorted(folder.glob("_C*.so"))
    assert built, f"no compiled extension in {folder}"
    ext_spec = importlib.util.spec_from_file_location("flash_pipeline._C", built[0])
    ext = importlib.util.module_from_spec(ext_spec)
    ext_spec.loader.exec_module(ext)
    assert ext.supported() == {
        "head_dims": [64, 96, 128, 192, 256],
        "dtypes": ["f16", "bf16", "e4m3"],
        "e4m3_head_dims": [64, 128, 256],
    }
    assert (folder / "kernels" / "kernel-set.json").is_file()
    assert ext.release_scratch() is None  # no kernel set loaded: nothing kept
    with pytest.raises(ValueError, match="unknown dtype"):
        ext.forward(1, 1, 1, 1, 0, "f32", (1, 1, 1, 8, 8, 64), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0),
                    (8, 8, 8, 8), False, (-1, -1), 0.0, None, 0, 0, str(folder / "kernels"), "bf16", (0, 0, 0))
    t = (1, [1, 1, 8, 64], [0, 0, 64], 512)
    varlen = dict(cu_seqlens_q=(0, 0), cu_seqlens_k=(0, 0), seqused_k=(0, 0), block_table=(0, 0, 0, 0), seqs=1,
                  max_seqlen_q=8, max_seqlen_k=8, causal=False, window=(-1, -1), softcap=0.0, scale=None, num_splits=0,
                  validate=False, device=0,
                  stream=0, kernel_dir=str(folder / "kernels"))
    with pytest.raises(ValueError, match="unknown dtype"):
        ext.forward_varlen(t, t, t, t, (0, 0), "f32", **varlen)
    with pytest.raises(ValueError, match="device address is 0"):
        ext.forward_varlen(t, t, t, (0, *t[1:]), (0, 0), "f16", **varlen)
