"""GPU tests: the kernels through flash_attn_func, the serving calls (flash_attn_varlen_func,
flash_attn_with_kvcache), torch.compile, CUDA graphs and transformers.

Skipped without torch or without CUDA. Needs the installed wheel (the compiled
extension and its kernels), or a source tree with them and FA_KERNEL_DIR.

Reference: float64 math on the very inputs the kernel saw (already rounded to
fp16/bf16; FP8's dequantised, see assert_fp8_out), so the only errors measured are the kernel's own: P rounded to
the input dtype before P·V (relative 2^-11 for fp16, 2^-8 for bf16, on
outputs that average many values of |v| ~ 1, so well under 1e-3 / 4e-3) and
the final rounding of out (half an ulp: about 2.4e-4 / 2e-3 for |out| <= 1,
and relative beyond). Tolerances: fp16 2e-3 abs + 2e-3 rel, bf16 1.6e-2 abs +
1.6e-2 rel, i.e. about 4 ulps of the dtype at magnitude 1. lse is float32
from float32 scores (exp2 with the scale folded into log2 e): 2e-3 abs +
1e-3 rel, and exactly -inf for rows that see no key.
"""

import itertools
import os
import pathlib
import random
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

try:
    import flash_pipeline as fa
except ImportError:
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
    import flash_pipeline as fa

DEV = "cuda"
TOL = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
LSE_TOL = dict(atol=2e-3, rtol=1e-3)


def reference(q, k, v, causal, scale=None, window=(-1, -1), softcap=0.0, p_e4m3=False):
    """out (b, sq, h, d) and lse (b, h, sq) in float64; rows seeing no key: out 0, lse -inf.
    p_e4m3: P rounded to float8_e4m3fn as FA3 quantises it, 2^8 · exp(s - the row max), before P·V
    (the denominator exact): the FP8 entries' error floor."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    qf = q.double().transpose(1, 2)
    kf = k.double().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.double().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    # bottom-right aligned: query i's diagonal is key i + sk - sq
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    right = 0 if causal else right
    if right >= 0:
        s = s.masked_fill(j > i + right, float("-inf"))
    if left >= 0:
        s = s.masked_fill(j < i - left, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    if p_e4m3:
        p = torch.exp(s - s.amax(-1, keepdim=True)).nan_to_num(0.0)
        rounded = (p * 256).float().to(torch.float8_e4m3fn).double() / 256
        return (rounded @ vf / p.sum(-1, keepdim=True)).nan_to_num(0.0).transpose(1, 2), lse
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # fully masked rows: -inf - -inf
    return (p @ vf).transpose(1, 2), lse


def check(out, lse, q, k, v, causal, scale=None, **mask):
    ref_out, ref_lse = reference(q, k, v, causal, scale, **mask)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, **TOL[q.dtype])
    torch.testing.assert_close(lse.double(), ref_lse, **LSE_TOL)


def rand(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=dtype)


# (batch, heads, kv_heads, seqlen_q, seqlen_k)
SHAPES = [
    (1, 8, 8, 128, 128),
    (2, 8, 2, 1, 512),  # decode
    (3, 8, 2, 7, 512),
    (2, 8, 2, 128, 512),  # chunked prefill after a cache
    (1, 8, 2, 512, 512),
    (2, 8, 2, 128, 64),  # sq > sk: causal rows before the diagonal see nothing
    (1, 4, 1, 33, 77),  # MQA, odd lengths
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, causal, d, dtype):
    torch.manual_seed(0)
    b, h, hk, sq, sk = shape
    q, k, v = rand(b, sq, h, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype)
    with torch.no_grad():
        out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert s_dmask is None
    check(out, lse, q, k, v, causal)


# (window_size, causal, softcap): bands inside a tile and across many, one-sided ones, a softcap alone
# and with each mask
MASKS = [
    ((0, 0), False, 0.0),
    ((40, 0), False, 0.0),
    ((300, 9), False, 0.0),
    ((129, -1), True, 0.0),
    ((-1, 70), False, 0.0),
    ((-1, -1), False, 5.0),
    ((-1, -1), True, 50.0),
    ((100, 0), True, 30.0),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: f"w{m[0][0]}_{m[0][1]}{'-causal' if m[1] else ''}-cap{m[2]:g}")
@pytest.mark.parametrize("shape", [(2, 8, 2, 300, 700), (1, 4, 4, 1000, 1000), (2, 8, 2, 5, 513)],
                         ids=["300x700", "1000", "decode5"])
def test_window_and_softcap_match_reference(shape, mask, d, dtype):
    b, h, hk, sq, sk = shape
    window, causal, softcap = mask
    q, k, v = rand(b, sq, h, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype)
    out, lse, _ = fa.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                     return_attn_probs=True)
    check(out, lse, q, k, v, causal, window=window, softcap=softcap)


# FP8: float8_e4m3fn inputs with FA3's descales, against the float64 reference of
# the dequantised inputs rounded to bfloat16. The e4m3 entries quantise P to
# e4m3, each p off by up to 2^-4 of itself, so an element of out by up to
# 2^-4 · max |v| where those roundings align (a row of few keys). Over a call
# the roundings average no better than out does where v has mean 0: about 2%
# relative L2 on these N(0,1) inputs, the format's own floor, which the
# reference with P rounded (reference(p_e4m3=True)) measures; the kernel's may
# be FP8_FLOOR times that (it rounds 2^6 · p against a kept max). Their scores
# are exact on the portable kernel; the Hopper kernel's FP8 wgmma sums them with
# about 13 significand bits, so a score is off by up to about 2^-10 of its row's
# largest scale·Σ|q·k| (kernel-ffi's check::E4M3_WGMMA_QK_EPS): the row's lse
# by that plus atol 1e-2, its p by as much relatively, its out by twice that
# times max |v|.
FP8_FLOOR = 1.5
FP8_LSE_TOL = dict(atol=1e-2, rtol=1e-3)
FP8_QK_EPS = 2.0**-10


def score_magnitudes(q, k):
    """(b, h, sq): scale · max over keys of Σ_d |q_d · k_d| (q (b, sq, h, d), k (b, sk, hk, d)).
    Over every key, masked or not: a bound at least as wide as the rows' own."""
    h, hk, d = q.shape[2], k.shape[2], q.shape[3]
    qa = q.double().abs().transpose(1, 2)
    ka = k.double().abs().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    return (qa @ ka.transpose(-1, -2)).amax(-1) * d**-0.5


def assert_fp8_lse(lse, ref_lse, q, k):
    """lse within FP8_LSE_TOL plus each row's FP8 wgmma score error."""
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite), "lse is -inf exactly where no key is seen"
    err = (lse.double() - ref_lse).abs()[finite]
    bound = (FP8_LSE_TOL["atol"] + FP8_LSE_TOL["rtol"] * ref_lse.abs() + FP8_QK_EPS * score_magnitudes(q, k))[finite]
    assert bool((err <= bound).all()), f"lse off by {err.max().item():.3g}, over its bound by {(err - bound).max().item():.3g}"


def assert_fp8_out(out, ref_out, floor_out, q, k, v):
    """out within the e4m3 error model above: each element, and its relative L2 against FP8_FLOOR times
    that of floor_out (the reference with P rounded) plus bfloat16's. q, k, v: the dequantised inputs
    (b, s, heads, d), q times softmax_scale · sqrt(d) where a scale is given."""
    h, hk = q.shape[2], v.shape[2]
    assert bool(out.isfinite().all()), "out has NaN or inf"
    err = out.double() - ref_out
    vmax = v.abs().amax(dim=(1, 3)).repeat_interleave(h // hk, dim=1)[:, None, :, None]  # (b, 1, h, 1)
    p_err = 2.0**-4 + torch.expm1(2 * FP8_QK_EPS * score_magnitudes(q, k)).transpose(1, 2)[..., None]
    bound = vmax * p_err + TOL[torch.bfloat16]["atol"] + TOL[torch.bfloat16]["rtol"] * ref_out.abs()
    assert bool((err.abs() <= bound).all()), f"out off by {err.abs().max().item():.3g}, over its bound by " \
        f"{(err.abs() - bound).max().item():.3g}"
    norm = max(ref_out.norm().item(), 1e-300)  # every row without keys: out must be 0 as well
    rel, floor = err.norm().item() / norm, (floor_out - ref_out).norm().item() / norm
    assert rel <= FP8_FLOOR * floor + 2.0**-8, f"relative L2 {rel:.3g}; P rounded to e4m3 alone: {floor:.3g}"


def dequantised(x8, descale, heads):
    """x8 (b, s, heads, d) float8 times its (batch, kv head) factor, rounded to bfloat16, in float64."""
    per_head = descale.float().repeat_interleave(heads // descale.shape[1], dim=1)
    return (x8.float() * per_head[:, None, :, None]).bfloat16().double()


def fp8_inputs(b, h, hk, sq, sk, d):
    """q8, k8, v8 drawn N(0,1) and cast to float8_e4m3fn, descales (b, hk) from [0.5, 2), and the
    q, k, v dequantised (dequantised)."""
    q8 = rand(b, sq, h, d, dtype=torch.float32).to(torch.float8_e4m3fn)
    k8, v8 = (rand(b, sk, hk, d, dtype=torch.float32).to(torch.float8_e4m3fn) for _ in range(2))
    qd, kd, vd = (torch.rand(b, hk, device=DEV) * 1.5 + 0.5 for _ in range(3))
    deq = (dequantised(q8, qd, h), dequantised(k8, kd, hk), dequantised(v8, vd, hk))
    return (q8, k8, v8), (qd, kd, vd), deq


def needs_fp8():
    if torch.cuda.get_device_capability() not in ((8, 9), (9, 0)):
        pytest.skip("e4m3 entries are built for sm_89 and sm_90")


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 300, 700), (1, 4, 4, 513, 129), (3, 8, 2, 1, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp8_matches_reference_of_dequantised_inputs(shape, causal, d):
    needs_fp8()
    b, h, hk, sq, sk = shape
    torch.manual_seed(d + sq)
    (q8, k8, v8), (qd, kd, vd), (qr, kr, vr) = fp8_inputs(b, h, hk, sq, sk, d)
    out, lse, _ = fa.flash_attn_func(
        q8, k8, v8, causal=causal, return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd
    )
    assert out.shape == q8.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    ref_out, ref_lse = reference(qr, kr, vr, causal)
    assert_fp8_out(out, ref_out, reference(qr, kr, vr, causal, p_e4m3=True)[0], qr, kr, vr)
    assert_fp8_lse(lse, ref_lse, qr, kr)
    # No descales: factors of 1.
    plain = fa.flash_attn_func(q8, k8, v8, causal=causal)
    qp, kp, vp = q8.double(), k8.double(), v8.double()
    ref_plain = reference(qp, kp, vp, causal)[0]
    assert_fp8_out(plain, ref_plain, reference(qp, kp, vp, causal, p_e4m3=True)[0], qp, kp, vp)


def test_fp8_rules_raise_before_any_launch():
    needs_fp8()
    q8 = torch.zeros(2, 16, 4, 128, device=DEV, dtype=torch.float8_e4m3fn)
    k8 = torch.zeros(2, 16, 2, 128, device=DEV, dtype=torch.float8_e4m3fn)
    ones = torch.ones(2, 2, device=DEV)
    with pytest.raises(ValueError, match=r"k_descale has shape \(2, 4\); it must be \(batch, nheads_k\)"):
        fa.flash_attn_func(q8, k8, k8, k_descale=torch.ones(2, 4, device=DEV))
    with pytest.raises(ValueError, match="q_descale dtype is float16; descales are float32"):
        fa.flash_attn_func(q8, k8, k8, q_descale=ones.half())
    bf = torch.zeros(2, 16, 4, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v_descale is given but q is bfloat16"):
        fa.flash_attn_func(bf, bf, bf, v_descale=torch.ones(2, 4, device=DEV))
    x = torch.zeros(1, 4, 2, 96, device=DEV, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"float8_e4m3fn inputs take head dims \[64, 128, 256\]"):
        fa.flash_attn_func(x, x, x)


@pytest.mark.parametrize("sk", [700, 50])  # 700: the Hopper kernel on H100/H200; 50: the portable one
def test_fp8_windows_and_softcap_run_dequantised(sk):
    """No e4m3 entry has a window or softcap: FP8 inputs then run dequantised to
    bfloat16, on either kernel."""
    needs_fp8()
    b, h, hk, sq, d = 2, 8, 2, 300, 128
    torch.manual_seed(7)
    q8 = rand(b, sq, h, d, dtype=torch.float32).to(torch.float8_e4m3fn)
    k8, v8 = (rand(b, sk, hk, d, dtype=torch.float32).to(torch.float8_e4m3fn) for _ in range(2))
    vd = torch.rand(b, hk, device=DEV) + 0.5
    out = fa.flash_attn_func(q8, k8, v8, window_size=(100, 0), softcap=30.0, v_descale=vd)
    ref, _ = reference(q8.double(), k8.double(), dequantised(v8, vd, hk), False, window=(100, 0), softcap=30.0)
    torch.testing.assert_close(out.double(), ref, **TOL[torch.bfloat16])


def test_softmax_scale_and_plain_return():
    torch.manual_seed(1)
    q, k, v = (rand(2, 64, 8, 128, dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        out = fa.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, deterministic=True)
        _, lse, _ = fa.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, return_attn_probs=True)
    assert isinstance(out, torch.Tensor)
    check(out, lse, q, k, v, True, scale=0.3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_strided_inputs(dtype):
    torch.manual_seed(2)
    b, s, h, hk, d = 2, 96, 8, 2, 128
    with torch.no_grad():
        # q, k, v slices of a packed qkv tensor (strides passed as they are)
        qkv = rand(b, s, 3, h, d, dtype=dtype)
        out, lse, _ = fa.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
        check(out, lse, *(qkv[:, :, i].contiguous() for i in range(3)), True)
        # GQA through kvpacked; q a transposed (batch, heads, seq, dim) tensor, as transformers holds it
        q = rand(b, h, s, d, dtype=dtype).transpose(1, 2)
        kv = rand(b, s + 5, 2, hk, d, dtype=dtype)
        out, lse, _ = fa.flash_attn_kvpacked_func(q, kv, causal=True, return_attn_probs=True)
        check(out, lse, q.contiguous(), kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(), True)
        # a storage offset, and a head_dim stride != 1 (copied with .contiguous() first)
        big = rand(b, s + 10, h, d, dtype=dtype)
        q = big[:, 10:]
        k = rand(b, s, d, hk, dtype=dtype).transpose(2, 3)
        v = rand(b, s, hk, d, dtype=dtype)
        out, lse, _ = fa.flash_attn_func(q, k, v, return_attn_probs=True)
        check(out, lse, q.contiguous(), k.contiguous(), v, False)


def test_empty_sizes():
    x = rand(2, 16, 4, 64, dtype=torch.float16)
    with torch.no_grad():
        out, lse, _ = fa.flash_attn_func(x[:, :0], x, x, return_attn_probs=True)
        assert out.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0)
        out, lse, _ = fa.flash_attn_func(x, x[:, :0], x[:, :0], return_attn_probs=True)
        assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())
        out = fa.flash_attn_func(x[:0], x[:0], x[:0])
        assert out.shape == (0, 16, 4, 64)


def test_argument_errors():
    x = rand(1, 16, 4, 64, dtype=torch.float16)
    with torch.no_grad():
        with pytest.raises(ValueError, match="q dtype is float32"):
            fa.flash_attn_func(x.float(), x.float(), x.float())
        with pytest.raises(ValueError, match="dtypes are float16, bfloat16, float16"):
            fa.flash_attn_func(x, x.bfloat16(), x)
        with pytest.raises(ValueError, match="head dim is 80"):
            y = rand(1, 16, 4, 80, dtype=torch.float16)
            fa.flash_attn_func(y, y, y)
        with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
            y = rand(1, 16, 3, 64, dtype=torch.float16)
            fa.flash_attn_func(x, y, y)
        with pytest.raises(ValueError, match="q is on cpu"):
            fa.flash_attn_func(x.cpu(), x, x)
        if torch.cuda.device_count() > 1:
            with pytest.raises(ValueError, match="one CUDA device"):
                fa.flash_attn_func(x, x.to("cuda:1"), x.to("cuda:1"))
        with pytest.raises(NotImplementedError, match="dropout_p"):
            fa.flash_attn_func(x, x, x, dropout_p=0.1)


def test_requires_grad_is_an_error_never_a_wrong_gradient():
    q = rand(1, 32, 4, 64, dtype=torch.bfloat16).requires_grad_()
    k, v = rand(1, 32, 4, 64, dtype=torch.bfloat16), rand(1, 32, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa.flash_attn_func(q, k, v)
    # the op itself runs forward, and its backward raises
    out, lse = torch.ops.flash_pipeline.fwd(q, k, v, None, True, -1, -1, 0.0)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="no backward"):
        out.float().sum().backward()
    assert q.grad is None


def test_torch_compile_fullgraph():
    torch.manual_seed(3)

    def f(q, k, v):
        out, lse, _ = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True)  # fails on any graph break
    with torch.no_grad():
        for sq in (64, 96, 128):  # the second length recompiles with a dynamic seqlen: the fake impl on SymInts
            q = rand(2, sq, 8, 128, dtype=torch.bfloat16)
            k, v = rand(2, 256, 2, 128, dtype=torch.bfloat16), rand(2, 256, 2, 128, dtype=torch.bfloat16)
            out, lse = compiled(q, k, v)
            ref_out, ref_lse = f(q, k, v)
            torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
            torch.testing.assert_close(lse, ref_lse, atol=0, rtol=0)
        explain = torch._dynamo.explain(f)(q, k, v)
        assert explain.graph_break_count == 0, explain.break_reasons


@pytest.mark.parametrize("shape", [(2, 8, 8, 256, 256), (1, 8, 2, 1, 4096)], ids=["prefill", "decode"])
def test_cuda_graph_capture_and_replay(shape):
    torch.manual_seed(4)
    b, h, hk, sq, sk = shape
    q, k, v = rand(b, sq, h, 128, dtype=torch.float16), rand(b, sk, hk, 128, dtype=torch.float16), rand(b, sk, hk, 128, dtype=torch.float16)
    with torch.no_grad():
        side = torch.cuda.Stream()  # warm up (loads the kernels) off the capture, as PyTorch advises
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fa.flash_attn_func(q, k, v, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse, _ = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        for _ in range(2):
            for t in (q, k, v):
                t.copy_(torch.randn_like(t))
            graph.replay()
            torch.cuda.synchronize()
            eager_out, eager_lse, _ = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
            assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)  # same kernels, same plan
            check(out, lse, q, k, v, True)


# ------------------------------------------------------------------ serving: varlen and KV cache
# Each sequence against `reference` on its own rows and keys (bottom-right causal per sequence,
# GQA by repeat_interleave, LSE the logsumexp of its scores). Paged caches hold their keys on
# shuffled pages, NaN everywhere else: a kernel that read past a sequence's keys would show it.


def offsets(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=DEV)


def seqs_of(lens, heads, d, dtype, shift=0.0):
    return [torch.randn(n, heads, d, device=DEV, dtype=dtype) + shift for n in lens]


def paged(ks, vs, page_size, spare=0, seed=0):
    """A paged cache with sequence i's keys and values on shuffled pages (room for `spare`
    more keys each), and its block table; unused slots are -1, unused pages and rows NaN."""
    hk, d, dtype = ks[0].shape[1], ks[0].shape[2], ks[0].dtype
    counts = [-(-(k.shape[0] + spare) // page_size) for k in ks]
    pages = sum(counts) + 2  # two pages no sequence uses
    order = iter(torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist())
    k_cache = torch.full((pages, page_size, hk, d), float("nan"), dtype=dtype, device=DEV)
    v_cache = k_cache.clone()
    table = torch.full((len(ks), max(counts) + 1), -1, dtype=torch.int32)  # a slot no sequence uses
    for i, (k, v) in enumerate(zip(ks, vs)):
        for slot in range(counts[i]):
            page = table[i, slot] = next(order)
            rows = slice(slot * page_size, (slot + 1) * page_size)
            k_cache[page, : k[rows].shape[0]] = k[rows]
            v_cache[page, : v[rows].shape[0]] = v[rows]
    return k_cache, v_cache, table.to(DEV)


def cache_of(ks, vs, page_size, slots=1024):
    """A cache holding sequence i's keys and values first: dense (batch, slots, nheads_k, headdim)
    with random keys past each length, which must be ignored, or paged (page_size not None)."""
    if page_size is not None:
        return paged(ks, vs, page_size, seed=page_size)
    k0 = ks[0]
    k_cache = torch.randn(len(ks), slots, k0.shape[1], k0.shape[2], device=DEV, dtype=k0.dtype)
    v_cache = torch.randn_like(k_cache)
    for i, (k, v) in enumerate(zip(ks, vs)):
        k_cache[i, :len(k)], v_cache[i, :len(v)] = k, v
    return k_cache, v_cache, None


def check_sequences(out_of, lse_of, qs, ks, vs, causal, scale=None, **mask):
    """Sequence i's rows of out (seqlen_q, nheads, headdim) and of the LSE (nheads, seqlen_q)."""
    for i, (q, k, v) in enumerate(zip(qs, ks, vs)):
        ref_out, ref_lse = reference(q[None], k[None], v[None], causal, scale, **mask)
        torch.testing.assert_close(out_of(i).double(), ref_out[0], **TOL[q.dtype])
        torch.testing.assert_close(lse_of(i).double(), ref_lse[0], **LSE_TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_varlen_matches_reference(heads, causal, d, dtype):
    torch.manual_seed(20)
    h, hk = heads
    # ragged: no query rows, one row, no keys (rows give 0 and lse -inf), fewer keys than rows
    lens_q, lens_k = [0, 1, 77, 130, 5, 9, 64], [3, 1, 200, 130, 0, 4, 64]
    qs, ks, vs = seqs_of(lens_q, h, d, dtype), seqs_of(lens_k, hk, d, dtype), seqs_of(lens_k, hk, d, dtype, 0.5)
    cq, ck = offsets(lens_q), offsets(lens_k)
    with torch.no_grad():
        out, lse, s_dmask = fa.flash_attn_varlen_func(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck,
                                                      max(lens_q), max(lens_k), causal=causal, return_attn_probs=True)
        plain = fa.flash_attn_varlen_func(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, max(lens_q),
                                          max(lens_k), causal=causal)
    assert s_dmask is None and torch.equal(plain, out)
    assert out.shape == (sum(lens_q), h, d) and out.dtype == dtype
    assert lse.shape == (h, sum(lens_q)) and lse.dtype == torch.float32  # flash-attn's (nheads, total_q)
    c = cq.tolist()
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, causal)
    assert bool((lse[:, c[4]:c[5]] == float("-inf")).all())  # the sequence without keys


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("mask", [((40, 0), True, 0.0), ((-1, -1), True, 30.0), ((100, 8), False, 20.0)],
                         ids=["w40-causal", "causal-cap30", "w100_8-cap20"])
def test_varlen_and_kvcache_windows_and_softcap(mask, d):
    """Windows and softcaps in the serving calls, each sequence aligned to its own lengths:
    ragged packed sequences, and decode and chunks against dense and paged caches."""
    torch.manual_seed(26)
    window, causal, softcap = mask
    dtype, h, hk = torch.bfloat16, 8, 2
    lens_q, lens_k = [0, 1, 77, 130, 5, 300], [3, 1, 200, 130, 0, 1100]
    qs, ks, vs = seqs_of(lens_q, h, d, dtype), seqs_of(lens_k, hk, d, dtype), seqs_of(lens_k, hk, d, dtype, 0.5)
    cq, ck = offsets(lens_q), offsets(lens_k)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    with torch.no_grad():
        out, lse, _ = fa.flash_attn_varlen_func(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, max(lens_q),
                                                max(lens_k), return_attn_probs=True, **kw)
    c = cq.tolist()
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, causal,
                    window=window, softcap=softcap)
    lens = [1000, 1, 0, 257]
    ks, vs = seqs_of(lens, hk, d, dtype), seqs_of(lens, hk, d, dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    for seqlen_q in (1, 5):
        q = torch.randn(len(lens), seqlen_q, h, d, device=DEV, dtype=dtype)
        for page_size in (None, 16, 256):
            k_cache, v_cache, table = cache_of(ks, vs, page_size)
            with torch.no_grad():
                o, l = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                  return_softmax_lse=True, **kw)
            check_sequences(lambda i: o[i], lambda i: l[i], list(q), ks, vs, causal, window=window, softcap=softcap)


def test_varlen_scale_and_strided_q():
    torch.manual_seed(21)
    lens = [17, 40]
    big = torch.randn(sum(lens), 8, 3 * 64, device=DEV, dtype=torch.bfloat16)
    q, k, v = big[..., :64], big[..., 64:128], big[..., 128:]  # head-dim stride 1, row stride 3·8·64
    cu = offsets(lens)
    with torch.no_grad():
        out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, softmax_scale=0.2, causal=True,
                                                return_attn_probs=True)
    c = cu.tolist()
    split = lambda t: [t[c[i]:c[i + 1]] for i in range(2)]  # noqa: E731
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], split(q), split(k), split(v),
                    True, scale=0.2)


@pytest.mark.parametrize("page_size", [1, 16, 100])
@pytest.mark.parametrize("lengths_from", ["cu_seqlens_k", "seqused_k"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_paged_matches_reference(causal, lengths_from, page_size):
    torch.manual_seed(22)
    dtype, h, hk, d = torch.bfloat16, 8, 2, 128
    lens_q, lens_k = [5, 1, 40, 0, 3], [60, 1, 300, 7, 0]
    qs, ks, vs = seqs_of(lens_q, h, d, dtype), seqs_of(lens_k, hk, d, dtype), seqs_of(lens_k, hk, d, dtype)
    k_cache, v_cache, table = paged(ks, vs, page_size, seed=page_size)
    cq = offsets(lens_q)
    if lengths_from == "cu_seqlens_k":
        lengths = dict(cu_seqlens_k=offsets(lens_k))
    else:
        lengths = dict(cu_seqlens_k=None, seqused_k=torch.tensor(lens_k, dtype=torch.int32, device=DEV))
    with torch.no_grad():
        out, lse, _ = fa.flash_attn_varlen_func(torch.cat(qs), k_cache, v_cache, cu_seqlens_q=cq,
                                                max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=causal,
                                                return_attn_probs=True, block_table=table, **lengths)
    c = cq.tolist()
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, causal)


def test_varlen_no_keys_and_no_sequences():
    q = torch.randn(6, 4, 64, device=DEV, dtype=torch.float16)
    none = q[:0, :2]
    cu_q, cu_k = offsets([2, 4]), offsets([0, 0])
    with torch.no_grad():
        out, lse, _ = fa.flash_attn_varlen_func(q, none, none, cu_q, cu_k, 4, 0, causal=True, return_attn_probs=True)
        assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())
        out = fa.flash_attn_varlen_func(q[:0], q[:0], q[:0], offsets([]), offsets([]), 0, 0)
        assert out.shape == (0, 4, 64)


@pytest.mark.parametrize("page_size", [None, 16, 256], ids=["dense", "page16", "page256"])
@pytest.mark.parametrize("seqlen_q", [1, 5], ids=["decode", "chunk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_kvcache_appends_then_attends(dtype, seqlen_q, page_size):
    torch.manual_seed(23)
    b, h, hk, d = 3, 8, 2, 64
    cached = [7, 300, 0]  # keys already in the cache; seqlen_q new ones are appended to each
    ks = seqs_of([n + seqlen_q for n in cached], hk, d, dtype)
    vs = seqs_of([n + seqlen_q for n in cached], hk, d, dtype)
    q = torch.randn(b, seqlen_q, h, d, device=DEV, dtype=dtype)
    new_k = torch.stack([k[n:] for k, n in zip(ks, cached)])
    new_v = torch.stack([v[n:] for v, n in zip(vs, cached)])
    old_k, old_v = [k[:n] for k, n in zip(ks, cached)], [v[:n] for v, n in zip(vs, cached)]
    if page_size is None:
        k_cache = torch.full((b + 1, 512, hk, d), float("nan"), device=DEV, dtype=dtype)  # batch_cache > batch
        v_cache = k_cache.clone()
        for i, n in enumerate(cached):
            k_cache[i, :n], v_cache[i, :n] = old_k[i], old_v[i]
        table, at = None, lambda i, p: (i, p)
    else:
        k_cache, v_cache, table = paged(old_k, old_v, page_size, spare=seqlen_q, seed=seqlen_q)
        at = lambda i, p: (int(table[i, p // page_size]), p % page_size)  # noqa: E731
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i, n in enumerate(cached):
        for j in range(seqlen_q):
            want_k[at(i, n + j)], want_v[at(i, n + j)] = new_k[i, j], new_v[i, j]
    seqlens = torch.tensor(cached, dtype=torch.int32, device=DEV)
    with torch.no_grad():
        out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens,
                                              block_table=table, causal=True, num_splits=3, return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (b, h, seqlen_q) and lse.dtype == torch.float32
    check_sequences(lambda i: out[i], lambda i: lse[i], list(q), ks, vs, True)
    assert torch.equal(seqlens, torch.tensor(cached, dtype=torch.int32, device=DEV))  # lengths are not updated
    # the appended keys are in the caches, and nothing else changed
    torch.testing.assert_close(k_cache, want_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, want_v, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("d", [96, 128, 192, 256])
@pytest.mark.parametrize("page_size", [None, 16, 256], ids=["dense", "page16", "page256"])
@pytest.mark.parametrize("seqlen_q", [1, 5], ids=["decode", "chunk"])
def test_kvcache_attends_without_append(seqlen_q, page_size, d):
    torch.manual_seed(24)
    dtype, b, h, hk = torch.bfloat16, 4, 16, 4
    lens = [1000, 1, 0, 257]  # a sequence without keys: rows of 0, lse -inf
    ks, vs = seqs_of(lens, hk, d, dtype), seqs_of(lens, hk, d, dtype)
    q = torch.randn(b, seqlen_q, h, d, device=DEV, dtype=dtype)
    k_cache, v_cache, table = cache_of(ks, vs, page_size)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    with torch.no_grad():
        out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                              causal=True, return_softmax_lse=True)
        split = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                           causal=True, num_splits=4)
    check_sequences(lambda i: out[i], lambda i: lse[i], list(q), ks, vs, True)
    check_sequences(lambda i: split[i], lambda i: lse[i], list(q), ks, vs, True)


def test_kvcache_int_lengths_and_whole_cache():
    torch.manual_seed(25)
    q = torch.randn(2, 1, 4, 128, device=DEV, dtype=torch.float16)
    k, v = (torch.randn(3, 70, 4, 128, device=DEV, dtype=torch.float16) for _ in range(2))
    with torch.no_grad():
        whole = fa.flash_attn_with_kvcache(q, k, v)  # the first 2 of 3 cache entries, every key
        first = fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=33, softmax_scale=0.1)
    torch.testing.assert_close(whole.double(), reference(q, k[:2], v[:2], False)[0], **TOL[torch.float16])
    torch.testing.assert_close(first.double(), reference(q, k[:2, :33], v[:2, :33], False, 0.1)[0],
                               **TOL[torch.float16])


def test_kvcache_decode_in_a_cuda_graph():
    """Paged decode with its append, captured once and replayed as the lengths grow on the device."""
    torch.manual_seed(28)
    dtype, b, h, hk, d, steps = torch.bfloat16, 2, 8, 2, 128, 3
    lens = [30, 100]
    ks = seqs_of([n + steps for n in lens], hk, d, dtype)
    vs = seqs_of([n + steps for n in lens], hk, d, dtype)
    k_cache, v_cache, table = paged([k[:n] for k, n in zip(ks, lens)], [v[:n] for v, n in zip(vs, lens)], 16,
                                    spare=steps)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.zeros(b, 1, h, d, device=DEV, dtype=dtype)
    new_k, new_v = torch.zeros(b, 1, hk, d, device=DEV, dtype=dtype), torch.zeros(b, 1, hk, d, device=DEV, dtype=dtype)

    def step():
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens, block_table=table,
                                          causal=True, return_softmax_lse=True)

    with torch.no_grad():
        side = torch.cuda.Stream()  # warm up off the capture (loads the kernels); it appends zeros, overwritten below
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = step()
        for t in range(steps):
            q.copy_(torch.randn_like(q))
            new_k.copy_(torch.stack([k[n + t] for k, n in zip(ks, lens)])[:, None])
            new_v.copy_(torch.stack([v[n + t] for v, n in zip(vs, lens)])[:, None])
            graph.replay()
            torch.cuda.synchronize()
            seen = [n + t + 1 for n in lens]
            check_sequences(lambda i: out[i], lambda i: lse[i], list(q), [k[:n] for k, n in zip(ks, seen)],
                            [v[:n] for v, n in zip(vs, seen)], True)
            seqlens += 1


def test_serving_num_splits():
    """The op's num_splits: forced splits agree with one split and with the reference."""
    torch.manual_seed(26)
    lens_q, lens_k = [3, 1], [4000, 1500]
    qs = seqs_of(lens_q, 8, 128, torch.float16)
    ks, vs = seqs_of(lens_k, 2, 128, torch.float16), seqs_of(lens_k, 2, 128, torch.float16)
    cq, ck = offsets(lens_q), offsets(lens_k)
    args = (torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, None, None, 3, 4000, None, True)
    with torch.no_grad():
        runs = {n: torch.ops.flash_pipeline.varlen_fwd(*args, n) for n in (1, 2, 7, 0)}
    c = cq.tolist()
    for out, lse in runs.values():
        check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, True)


def test_release_scratch_between_split_calls():
    """Temporaries given back between calls are allocated again: the same result."""
    torch.manual_seed(28)
    lens_q, lens_k = [3, 1], [4000, 1500]
    qs = seqs_of(lens_q, 8, 128, torch.float16)
    ks, vs = seqs_of(lens_k, 2, 128, torch.float16), seqs_of(lens_k, 2, 128, torch.float16)
    args = (torch.cat(qs), torch.cat(ks), torch.cat(vs), offsets(lens_q), offsets(lens_k), None, None, 3, 4000,
            None, True, 7)
    with torch.no_grad():
        before = torch.ops.flash_pipeline.varlen_fwd(*args)
        fa.release_scratch()
        after = torch.ops.flash_pipeline.varlen_fwd(*args)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def test_serving_torch_compile_fullgraph():
    torch.manual_seed(27)
    lens = [3, 9]
    cu = offsets(lens)
    q = torch.randn(12, 4, 64, device=DEV, dtype=torch.float16)
    k = torch.randn(12, 2, 64, device=DEV, dtype=torch.float16)
    k_pages, v_pages, table = paged([k[:3], k[3:]], [k[:3], k[3:]], 16, spare=2)
    qd = torch.randn(2, 2, 4, 64, device=DEV, dtype=torch.float16)
    new = torch.randn(2, 2, 2, 64, device=DEV, dtype=torch.float16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)

    def f(q, k, qd, new, k_pages, v_pages, seqlens):
        a, lse, _ = fa.flash_attn_varlen_func(q, k, k, cu, cu, 9, 9, causal=True, return_attn_probs=True)
        b = fa.flash_attn_varlen_func(q, k_pages, v_pages, cu, cu, 9, 9, block_table=table)
        c, lse_c = fa.flash_attn_with_kvcache(qd, k_pages, v_pages, new, new, cache_seqlens=seqlens, block_table=table,
                                             causal=True, return_softmax_lse=True)
        return a * 2, lse, b, c, lse_c

    with torch.no_grad():
        caches = (k_pages.clone(), v_pages.clone())
        eager = f(q, k, qd, new, *caches, seqlens)
        compiled = torch.compile(f, fullgraph=True)  # fails on any graph break
        got = compiled(q, k, qd, new, k_pages, v_pages, seqlens)
    for x, y in zip(eager, got):
        torch.testing.assert_close(x, y, atol=0, rtol=0, equal_nan=True)
    for x, y in zip(caches, (k_pages, v_pages)):  # the compiled append wrote the caches as the eager one
        torch.testing.assert_close(x, y, atol=0, rtol=0, equal_nan=True)


def test_serving_errors(monkeypatch):
    q = torch.randn(4, 2, 64, device=DEV, dtype=torch.float16)
    cu = offsets([4])
    with torch.no_grad():
        with pytest.raises(ValueError, match="cu_seqlens_q dtype is int64; it must be int32"):
            fa.flash_attn_varlen_func(q, q, q, cu.long(), cu, 4, 4)
        with pytest.raises(ValueError, match="cu_seqlens_k is on cpu"):
            fa.flash_attn_varlen_func(q, q, q, cu, cu.cpu(), 4, 4)
        with pytest.raises(ValueError, match="q has 2 heads and k has 3"):
            kv = torch.randn(4, 3, 64, device=DEV, dtype=torch.float16)
            fa.flash_attn_varlen_func(q, kv, kv, cu, cu, 4, 4)
        with pytest.raises(ValueError, match="head dim is 80"):
            x = torch.randn(4, 2, 80, device=DEV, dtype=torch.float16)
            fa.flash_attn_varlen_func(x, x, x, cu, cu, 4, 4)
        # offsets past q's rows: wrong rows, never a fault; with FLASH_PIPELINE_VALIDATE=1 a ValueError
        bad = torch.tensor([0, 9], dtype=torch.int32, device=DEV)
        fa.flash_attn_varlen_func(q, q, q, bad, cu, 9, 4)
        monkeypatch.setenv("FLASH_PIPELINE_VALIDATE", "1")
        with pytest.raises(ValueError, match=r"cu_seqlens_q\[1\] = 9 is past q's 4 rows"):
            fa.flash_attn_varlen_func(q, q, q, bad, cu, 9, 4)
        cache = torch.zeros(1, 8, 2, 64, device=DEV, dtype=torch.float16)
        new = torch.ones(1, 2, 2, 64, device=DEV, dtype=torch.float16)
        with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 7: appending 2 keys"):
            fa.flash_attn_with_kvcache(q[None, :1], cache, cache.clone(), new, new, cache_seqlens=7)
        assert not cache.any()  # refused before the append
    q.requires_grad_()
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4)
    out, _ = torch.ops.flash_pipeline.varlen_fwd(q, q.detach(), q.detach(), cu, cu, None, None, 4, 4, None, False, 0)
    with pytest.raises(NotImplementedError, match="no backward"):
        out.float().sum().backward()


# ------------------------------------------------------------------ random calls

# Each case draws one call from its own seed: dense (FP8 too), packed varlen, or a
# dense or paged KV cache, with sizes near tile edges or anywhere up to a few
# thousand, any head dim, GQA, a window, a softcap and a scale, checked as the
# tests above check theirs. FA_FUZZ_SEED and FA_FUZZ_CASES draw other calls; a
# failure prints its draw, and `-k` of its id reruns it alone.
FUZZ_SEED = int(os.environ.get("FA_FUZZ_SEED", "0"))
FUZZ_CASES = int(os.environ.get("FA_FUZZ_CASES", "48"))
EDGES = [1, 2, 7, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 511, 513]
SCORES = 4e7  # a call's (query, key) pairs per head, times heads and batch, at most: the f64 reference's size


def draw_length(rng, most, zero=False):
    r = rng.random()
    if zero and r < 0.1:
        return 0
    if r < 0.5:
        return min(rng.choice(EDGES), most)
    return rng.randint(1, most)


def draw_call(i):
    """The call of case i: a dict of what it takes, all from random.Random(f"{FUZZ_SEED}-{i}")."""
    rng = random.Random(f"{FUZZ_SEED}-{i}")
    hk, kinds = rng.choice([1, 2, 4, 8]), ["dense", "dense", "varlen", "kvcache", "paged"]
    c = dict(kind=rng.choice(kinds), dtype=rng.choice(["float16", "bfloat16"]), d=rng.choice(fa.supported()["head_dims"]),
             hk=hk, h=hk * rng.choice([1, 2, 3, 4, 8]), causal=rng.random() < 0.5, window=(-1, -1), softcap=0.0,
             scale=None, fp8=False)
    if rng.random() < 0.3:
        c["window"] = (rng.choice([-1, 0, rng.randint(1, 700)]), rng.choice([-1, 0, rng.randint(1, 90)]))
    if rng.random() < 0.25:
        c["softcap"] = rng.choice([5.0, 30.0, 50.0])
    if rng.random() < 0.25:
        c["scale"] = round(rng.uniform(0.03, 0.3), 4)
    if c["kind"] == "dense":
        c["b"] = rng.randint(1, 4)
        c["sq"], c["sk"] = draw_length(rng, 2100), draw_length(rng, 2100)
        c["fp8"] = c["d"] in fa.supported()["e4m3_head_dims"] and rng.random() < 0.3
    elif c["kind"] == "varlen":
        n = rng.randint(1, 6)
        c["lens_k"] = [draw_length(rng, 1500, zero=True) for _ in range(n)]
        same = rng.random() < 0.5  # self-attention prefill, or queries of their own lengths
        c["lens_q"] = list(c["lens_k"]) if same else [draw_length(rng, 600, zero=True) for _ in range(n)]
    else:
        c["lens_k"] = [draw_length(rng, 3000, zero=True) for _ in range(rng.randint(1, 4))]
        c["sq"] = rng.choice([1, 1, rng.randint(2, 16)])
        c["splits"] = rng.choice([0, 1, 3])
        c["page"] = rng.choice([1, 16, 64, 100, 256]) if c["kind"] == "paged" else None
    if c["kind"] == "dense":
        pairs = c["h"] * c["b"] * c["sq"] * c["sk"]
    else:  # a cache's calls: seqlen_q rows a sequence
        pairs = c["h"] * sum(q * k for q, k in zip(c.get("lens_q") or [c["sq"]] * len(c["lens_k"]), c["lens_k"]))
    if pairs > SCORES:  # fewer heads, then fewer kv heads
        c["h"] = max(c["hk"], c["h"] // -(-pairs // int(SCORES)) // c["hk"] * c["hk"])
    return c


@pytest.mark.parametrize("i", range(FUZZ_CASES), ids=lambda i: f"seed{FUZZ_SEED}-{i}")
def test_random_calls_match_reference(i):
    c = draw_call(i)
    print("draw:", c)
    torch.manual_seed(i)
    dtype, d, h, hk = getattr(torch, c["dtype"]), c["d"], c["h"], c["hk"]
    mask = dict(window=c["window"], softcap=c["softcap"])
    kw = dict(causal=c["causal"], softmax_scale=c["scale"], window_size=c["window"], softcap=c["softcap"])
    with torch.no_grad():
        if c["kind"] == "dense" and c["fp8"]:
            needs_fp8()
            b, sq, sk = c["b"], c["sq"], c["sk"]
            (q8, k8, v8), (qd, kd, vd), (qr, kr, vr) = fp8_inputs(b, h, hk, sq, sk, d)
            out, lse, _ = fa.flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=qd, k_descale=kd,
                                             v_descale=vd, **kw)
            ref_out, ref_lse = reference(qr, kr, vr, c["causal"], c["scale"], **mask)
            floor_out = reference(qr, kr, vr, c["causal"], c["scale"], p_e4m3=True, **mask)[0]
            scaled = qr * (1.0 if c["scale"] is None else c["scale"] * d**0.5)
            # windows and softcaps run dequantised to bfloat16 (no e4m3 entry has them), well inside these
            assert_fp8_out(out, ref_out, floor_out, scaled, kr, vr)
            assert_fp8_lse(lse, ref_lse, scaled, kr)
        elif c["kind"] == "dense":
            b, sq, sk = c["b"], c["sq"], c["sk"]
            q, k, v = rand(b, sq, h, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype)
            out, lse, _ = fa.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
            check(out, lse, q, k, v, c["causal"], c["scale"], **mask)
        elif c["kind"] == "varlen":
            lens_q, lens_k = c["lens_q"], c["lens_k"]
            qs, ks, vs = seqs_of(lens_q, h, d, dtype), seqs_of(lens_k, hk, d, dtype), seqs_of(lens_k, hk, d, dtype)
            cq, ck = offsets(lens_q), offsets(lens_k)
            out, lse, _ = fa.flash_attn_varlen_func(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, max(lens_q),
                                                    max(lens_k), return_attn_probs=True, **kw)
            at = cq.tolist()
            check_sequences(lambda j: out[at[j]:at[j + 1]], lambda j: lse[:, at[j]:at[j + 1]], qs, ks, vs,
                            c["causal"], c["scale"], **mask)
        else:
            lens = c["lens_k"]
            ks, vs = seqs_of(lens, hk, d, dtype), seqs_of(lens, hk, d, dtype)
            q = torch.randn(len(lens), c["sq"], h, d, device=DEV, dtype=dtype)
            k_cache, v_cache, table = cache_of(ks, vs, c["page"], slots=max(lens) + 5)
            out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=table, num_splits=c["splits"],
                                                  cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEV),
                                                  return_softmax_lse=True, **kw)
            check_sequences(lambda j: out[j], lambda j: lse[j], list(q), ks, vs, c["causal"], c["scale"], **mask)


# ------------------------------------------------------------------ transformers models

try:
    from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    import flash_pipeline.transformers as fpt
except ImportError:
    fpt = None
needs_transformers = pytest.mark.skipif(fpt is None, reason="needs transformers")
NAME = fpt.register() if fpt else None
SMALL = dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
CONFIGS = {
    "llama-d64": lambda: LlamaConfig(head_dim=64, **SMALL),
    "llama-d128": lambda: LlamaConfig(head_dim=128, **SMALL),
    "llama-d96": lambda: LlamaConfig(head_dim=96, **SMALL),  # Phi-3's head dim
    "llama-d192": lambda: LlamaConfig(head_dim=192, **SMALL),
    "qwen2": lambda: Qwen2Config(**SMALL),  # q/k/v biases; head dim 512 / 8 = 64
    "mistral": lambda: MistralConfig(head_dim=64, sliding_window=4096, **SMALL),  # window wider than the text
    # windows that cut the text (96-token prompts, 48-token generations): the kernel's sliding window
    "mistral-window": lambda: MistralConfig(head_dim=64, sliding_window=24, **SMALL),
    # Gemma 2: logit softcapping in every layer, sliding and global layers alternating
    "gemma2": lambda: Gemma2Config(head_dim=128, query_pre_attn_scalar=128, sliding_window=24,
                                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **SMALL),
    # Gemma 2's own head dim (the portable kernel's D=256 entries on every GPU)
    "gemma2-d256": lambda: Gemma2Config(head_dim=256, query_pre_attn_scalar=256, sliding_window=24,
                                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **SMALL),
}
# The backend the kernel is compared with: SDPA, or eager where SDPA lacks a feature (softcapping).
REFERENCE = {"gemma2": "eager", "gemma2-d256": "eager"}
_models = {}


def model_for(name, make=None):
    if name not in _models:
        torch.manual_seed(0)
        cfg = (make or CONFIGS[name])()
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=NAME, dtype=torch.bfloat16)
        _models[name] = model.to(DEV).eval()
    return _models[name]


def run(model, impl, fn):
    model.set_attn_implementation(impl)
    fpt.stats.clear()
    with torch.no_grad():
        return fn(), dict(fpt.stats)


def assert_logits_close(got, ref):
    # bf16 model: both backends round every layer's activations to bf16 (2^-8 relative) and differ
    # only in how attention orders its sums; after 2 layers the logits agree to a few bf16 ulps of
    # their largest magnitude (|logits| ~ 2 here, ulp 1/64). 2% of that magnitude + 0.02 covers it.
    got, ref = got.float(), ref.float()
    err, bound = (got - ref).abs().max().item(), 0.02 * ref.abs().max().item() + 0.02
    assert err <= bound, f"max |logits diff| {err:.4g} > {bound:.4g}"
    return bound


@needs_transformers
@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_prefill_logits(name):
    model = model_for(name)
    ids = torch.randint(0, 1000, (2, 96), device=DEV, generator=torch.Generator(DEV).manual_seed(5))
    ref, _ = run(model, REFERENCE.get(name, "sdpa"), lambda: model(ids).logits)
    got, stats = run(model, NAME, lambda: model(ids).logits)
    assert stats == {"kernel": model.config.num_hidden_layers}, stats
    assert_logits_close(got, ref)


@needs_transformers
@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_greedy_generation(name):
    """32 greedy tokens: identical, or, where a token differs, the two backends' logits at that
    step (computed on the same prefix) are close and the top two sdpa logits lie within that
    tolerance of each other: a tie that bf16 noise may break either way, not a kernel error."""
    model = model_for(name)
    prompt = torch.randint(3, 1000, (1, 16), device=DEV, generator=torch.Generator(DEV).manual_seed(6))
    # ids from 3 on: no token equals pad (0), bos (1) or eos (2), so generate builds no padding mask
    kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    ref, _ = run(model, REFERENCE.get(name, "sdpa"), lambda: model.generate(prompt, **kw))
    got, stats = run(model, NAME, lambda: model.generate(prompt, **kw))
    assert set(stats) == {"kernel"}, stats  # prefill and every decode step on our kernel
    a, b = ref.sequences[0, 16:], got.sequences[0, 16:]
    assert a.shape == b.shape == (32,)
    differ = (a != b).nonzero()
    steps = 32 if len(differ) == 0 else int(differ[0]) + 1
    for t in range(steps):  # same prefix up to and including step t
        bound = assert_logits_close(got.logits[t][0], ref.logits[t][0])
    if len(differ):
        top2 = ref.logits[steps - 1][0].float().topk(2).values
        assert (top2[0] - top2[1]).item() <= bound, f"token {steps - 1} differs without a near tie"


@needs_transformers
def test_model_chunked_prefill_uses_kernel_with_mask():
    model = model_for("llama-d64")
    ids = torch.randint(0, 1000, (1, 48), device=DEV, generator=torch.Generator(DEV).manual_seed(7))

    def chunked():
        first = model(ids[:, :32], use_cache=True)
        return model(ids[:, 32:], past_key_values=first.past_key_values).logits  # 16 queries, 48 keys, causal mask

    ref, _ = run(model, "sdpa", chunked)
    got, stats = run(model, NAME, chunked)
    assert stats == {"kernel": 2 * model.config.num_hidden_layers}, stats
    assert_logits_close(got, ref)


@needs_transformers
def test_model_left_padded_batch_runs_the_serving_kernel():
    model = model_for("llama-d64")
    ids = torch.randint(0, 1000, (2, 24), device=DEV, generator=torch.Generator(DEV).manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ref, _ = run(model, "sdpa", lambda: model(ids, attention_mask=mask).logits)
    got, stats = run(model, NAME, lambda: model(ids, attention_mask=mask).logits)
    assert stats == {"varlen": model.config.num_hidden_layers}, stats
    assert_logits_close(got[0, 5:], ref[0, 5:])
    assert_logits_close(got[1], ref[1])


@needs_transformers
def test_model_right_padding_falls_back_to_sdpa():
    """Right-padded queries still see keys (causally), so the mask is no per-sequence
    bottom-right pattern of kept rows: SDPA runs it, exactly."""
    model = model_for("llama-d64")
    ids = torch.randint(0, 1000, (2, 24), device=DEV, generator=torch.Generator(DEV).manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, 19:] = 0
    ref, _ = run(model, "sdpa", lambda: model(ids, attention_mask=mask).logits)
    got, stats = run(model, NAME, lambda: model(ids, attention_mask=mask).logits)
    assert stats == {"sdpa: mask": model.config.num_hidden_layers}, stats
    torch.testing.assert_close(got, ref, atol=0, rtol=0)


@needs_transformers
@pytest.mark.parametrize("name", ["llama-d64", "mistral-window", "gemma2", "gemma2-d256"])
def test_model_generates_a_left_padded_batch_on_the_serving_kernel(name):
    """A batch of two prompts, one left-padded: prefill and every decode step run the
    serving kernel (the padding mask is there each step) and follow the reference's greedy
    tokens. Windowed layers (Mistral's, Gemma 2's sliding ones, the window cutting the text)
    take the dense kernel once the padding has left their window. Gemma 2: softcapped; at
    D=256 the serving entries of that head dim."""
    model = model_for(name)
    ids = torch.randint(3, 1000, (2, 20), device=DEV, generator=torch.Generator(DEV).manual_seed(10))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    ids[1, :7] = 0
    kw = dict(attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    ref, _ = run(model, REFERENCE.get(name, "sdpa"), lambda: model.generate(ids, **kw))
    got, stats = run(model, NAME, lambda: model.generate(ids, **kw))
    windowed = getattr(model.config, "sliding_window", None) is not None
    assert "varlen" in stats and set(stats) <= ({"varlen", "kernel"} if windowed else {"varlen"}), stats
    for row in range(2):
        a, b = ref.sequences[row, 20:], got.sequences[row, 20:]
        differ = (a != b).nonzero()
        steps = 16 if len(differ) == 0 else int(differ[0]) + 1
        for t in range(steps):
            bound = assert_logits_close(got.logits[t][row], ref.logits[t][row])
        if len(differ):
            top2 = ref.logits[steps - 1][row].float().topk(2).values
            assert (top2[0] - top2[1]).item() <= bound, f"row {row} token {steps - 1} differs without a near tie"


@needs_transformers
def test_model_fallbacks():
    # a window that cuts keys: transformers builds the band's mask, which runs the kernel's window
    model = model_for("mistral-sw8", lambda: MistralConfig(head_dim=64, sliding_window=8, **SMALL))
    ids = torch.randint(0, 1000, (1, 32), device=DEV, generator=torch.Generator(DEV).manual_seed(9))
    ref, _ = run(model, "sdpa", lambda: model(ids).logits)
    got, stats = run(model, NAME, lambda: model(ids).logits)
    assert stats == {"kernel": 2}, stats
    assert_logits_close(got, ref)
    # head dim 32: not compiled, SDPA with a warning
    model = model_for("llama-d32", lambda: LlamaConfig(**{**SMALL, "head_dim": 32}))
    fpt._warned.discard("sdpa: head dim")
    with pytest.warns(RuntimeWarning, match="head dims 32"):
        _, stats = run(model, NAME, lambda: model(ids).logits)
    assert stats == {"sdpa: head dim": 2}, stats
    # gradients needed (no torch.no_grad): SDPA, never a wrong gradient
    model = model_for("llama-d64")
    model.set_attn_implementation(NAME)
    fpt.stats.clear()
    model(ids).logits.float().sum().backward()
    assert fpt.stats == {"sdpa: grad": 2}, fpt.stats
    model.zero_grad(set_to_none=True)


needs_provider_registry = pytest.mark.skipif(
    not hasattr(torch.nn.attention, "register_flash_attention_impl"), reason="needs PyTorch >= 2.11"
)


@needs_provider_registry
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("sq,sk,causal", [(256, 256, True), (256, 256, False), (64, 320, True), (64, 320, False)])
def test_sdpa_provider(dtype, d, sq, sk, causal, monkeypatch):
    """Activated, SDPA's flash backend runs the kernels where they can and SDPA's own semantics
    everywhere; backward refuses. SDPA itself never sends causal with unequal lengths to its flash
    backend, so that pair is called on the aten op directly: the math path, causal top-left."""
    from torch.nn.attention import SDPBackend, activate_flash_attention_impl, restore_flash_attention_impl, sdpa_kernel

    import flash_pipeline.sdpa as provider

    calls = []
    real = fa.ops._ext()

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def forward(self, *args):
            calls.append(args)
            return real.forward(*args)

    monkeypatch.setattr(fa.ops, "_ext", lambda: Counting())
    g = torch.Generator(DEV).manual_seed(11)
    q = torch.randn(2, 8, sq, d, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(2, 8, sk, d, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(2, 8, sk, d, device=DEV, dtype=dtype, generator=g)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    provider.register()
    activate_flash_attention_impl(provider.NAME)
    direct = causal and sq != sk
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
            if direct:
                got = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
            else:
                got = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(got.double(), ref, **TOL[dtype])
        on_kernels = d in (64, 128) and not direct
        assert len(calls) == (1 if on_kernels else 0), (len(calls), on_kernels)
        if direct:
            return
        qg = q.clone().requires_grad_()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            y = torch.nn.functional.scaled_dot_product_attention(qg, k, v, is_causal=causal)
        with pytest.raises(NotImplementedError, match="forward-only"):
            y.sum().backward()
    finally:
        restore_flash_attention_impl()
