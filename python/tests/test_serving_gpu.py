"""GPU tests of the serving functions: flash_attn_varlen_func (packed, paged) and
flash_attn_with_kvcache (dense and paged caches, decode and chunks, appended
keys), each sequence against a float64 reference on its own rows and keys
(test_gpu.py's ``reference``). Skipped without torch or CUDA."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
from test_gpu import LSE_TOL, TOL, fa, reference  # noqa: E402

DEV = "cuda"


def offsets(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)


def paged(seqs_k, seqs_v, page_size, gen):
    """A shuffled paged cache holding each sequence's keys and values, and its block table."""
    hk, d = seqs_k[0].shape[1], seqs_k[0].shape[2]
    counts = [-(-k.shape[0] // page_size) for k in seqs_k]
    width = max(counts + [1]) + 1  # a slot no sequence uses
    order = torch.randperm(sum(counts) + 2, generator=gen).tolist()
    k_cache = torch.full((sum(counts) + 2, page_size, hk, d), float("nan"), dtype=seqs_k[0].dtype, device=DEV)
    v_cache = k_cache.clone()
    table = torch.full((len(seqs_k), width), -1, dtype=torch.int32)
    at = 0
    for i, (k, v) in enumerate(zip(seqs_k, seqs_v)):
        for slot in range(counts[i]):
            page = order[at]
            at += 1
            table[i, slot] = page
            rows = slice(slot * page_size, min((slot + 1) * page_size, k.shape[0]))
            n = rows.stop - rows.start
            k_cache[page, :n] = k[rows]
            v_cache[page, :n] = v[rows]
    return k_cache, v_cache, table.to(DEV)


def check_sequences(out_of, lse_of, qs, ks, vs, causal):
    """Sequence i's rows of out (seqlen, nheads, headdim) and of the LSE (nheads, seqlen)
    against the reference on its own q, k, v."""
    for i, (q, k, v) in enumerate(zip(qs, ks, vs)):
        if q.shape[0] == 0:
            continue
        ref_out, ref_lse = reference(q[None], k[None], v[None], causal)
        got_out, got_lse = out_of(i), lse_of(i)
        torch.testing.assert_close(got_out.double(), ref_out[0], **TOL[q.dtype])
        torch.testing.assert_close(got_lse.double(), ref_lse[0], **LSE_TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 1), (3, 3)])
def test_varlen_packed(dtype, d, causal, heads):
    h, hk = heads
    lens_q, lens_k = [0, 1, 77, 130, 5], [3, 1, 200, 130, 0]
    qs = [torch.randn(n, h, d, dtype=dtype, device=DEV) for n in lens_q]
    ks = [torch.randn(n, hk, d, dtype=dtype, device=DEV) for n in lens_k]
    vs = [torch.randn(n, hk, d, dtype=dtype, device=DEV) + 0.5 for n in lens_k]
    cq, ck = offsets(lens_q), offsets(lens_k)
    out, lse, _ = fa.flash_attn_varlen_func(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, max(lens_q),
                                            max(lens_k), causal=causal, return_attn_probs=True)
    assert out.shape == (sum(lens_q), h, d) and lse.shape == (h, sum(lens_q))
    c = cq.tolist()
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, causal)


@pytest.mark.parametrize("page_size", [1, 16, 100])
def test_varlen_paged(page_size):
    gen = torch.Generator().manual_seed(page_size)
    dtype, h, hk, d = torch.bfloat16, 8, 2, 128
    lens_q, lens_k = [5, 1, 40], [60, 1, 300]
    qs = [torch.randn(n, h, d, dtype=dtype, device=DEV) for n in lens_q]
    ks = [torch.randn(n, hk, d, dtype=dtype, device=DEV) for n in lens_k]
    vs = [torch.randn(n, hk, d, dtype=dtype, device=DEV) for n in lens_k]
    k_cache, v_cache, table = paged(ks, vs, page_size, gen)
    cq, ck = offsets(lens_q), offsets(lens_k)
    out, lse, _ = fa.flash_attn_varlen_func(torch.cat(qs), k_cache, v_cache, cq, ck, max(lens_q), max(lens_k),
                                            causal=True, return_attn_probs=True, block_table=table)
    c = cq.tolist()
    check_sequences(lambda i: out[c[i]:c[i + 1]], lambda i: lse[:, c[i]:c[i + 1]], qs, ks, vs, True)


@pytest.mark.parametrize("page_size", [None, 16, 256])
@pytest.mark.parametrize("seqlen_q", [1, 5])
def test_kvcache_appends_then_attends(page_size, seqlen_q):
    gen = torch.Generator().manual_seed(seqlen_q)
    dtype, b, h, hk, d, cap = torch.float16, 3, 8, 2, 64, 512
    cached = [7, 300, 1]
    ks = [torch.randn(n + seqlen_q, hk, d, dtype=dtype, device=DEV) for n in cached]
    vs = [torch.randn(n + seqlen_q, hk, d, dtype=dtype, device=DEV) for n in cached]
    q = torch.randn(b, seqlen_q, h, d, dtype=dtype, device=DEV)
    new_k = torch.stack([k[n:] for k, n in zip(ks, cached)])
    new_v = torch.stack([v[n:] for v, n in zip(vs, cached)])
    if page_size is None:
        k_cache = torch.zeros(b, cap, hk, d, dtype=dtype, device=DEV)
        v_cache = torch.zeros_like(k_cache)
        for i, n in enumerate(cached):
            k_cache[i, :n], v_cache[i, :n] = ks[i][:n], vs[i][:n]
        table = None
    else:  # room in the pages for the appended keys
        k_cache, v_cache, table = paged([torch.cat([k, k]) for k in ks], [torch.cat([v, v]) for v in vs], page_size, gen)
        for i, n in enumerate(cached):  # the appended rows' slots start out as garbage
            pos = torch.arange(n, n + seqlen_q)
            pages = table[i, pos // page_size].long()
            k_cache[pages, pos % page_size] = 0.0
    seqlens = torch.tensor(cached, dtype=torch.int32, device=DEV)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens,
                                          block_table=table, causal=True, num_splits=3, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, seqlen_q)
    check_sequences(lambda i: out[i], lambda i: lse[i], list(q), ks, vs, True)
    # The appended keys are in the cache.
    for i, n in enumerate(cached):
        for j in range(seqlen_q):
            if table is None:
                row = k_cache[i, n + j]
            else:
                row = k_cache[table[i, (n + j) // page_size].long(), (n + j) % page_size]
            torch.testing.assert_close(row, new_k[i, j])


def test_kvcache_decode_without_lengths_reads_the_whole_cache():
    q = torch.randn(2, 1, 4, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(2, 70, 4, 128, dtype=torch.bfloat16, device=DEV)
    v = torch.randn_like(k)
    out = fa.flash_attn_with_kvcache(q, k, v)
    ref, _ = reference(q, k, v, False)
    torch.testing.assert_close(out.double(), ref, **TOL[torch.bfloat16])


def test_compiled_calls_trace_both_ops():
    lens = [3, 9]
    q = torch.randn(12, 4, 64, dtype=torch.float16, device=DEV)
    k = torch.randn(12, 2, 64, dtype=torch.float16, device=DEV)
    cu = offsets(lens)
    cache = torch.randn(2, 32, 2, 64, dtype=torch.float16, device=DEV)
    qd = torch.randn(2, 1, 4, 64, dtype=torch.float16, device=DEV)
    seqlens = torch.tensor([10, 32], dtype=torch.int32, device=DEV)

    def f(q, k, qd, cache, seqlens):
        a = fa.flash_attn_varlen_func(q, k, k, cu, cu, 9, 9, causal=True)
        b = fa.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=seqlens)
        return a, b

    eager = f(q, k, qd, cache, seqlens)
    compiled = torch.compile(f, fullgraph=True)(q, k, qd, cache, seqlens)
    for x, y in zip(eager, compiled):
        torch.testing.assert_close(x, y)


def test_bad_index_tensors_raise_value_errors():
    q = torch.randn(4, 2, 64, dtype=torch.float16, device=DEV)
    cu64 = torch.tensor([0, 4], dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="int32"):
        fa.flash_attn_varlen_func(q, q, q, cu64, cu64, 4, 4)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        fa.flash_attn_varlen_func(q, q[:, :1].expand(4, 3, 64).contiguous(), q[:, :1].expand(4, 3, 64).contiguous(),
                                  cu, cu, 4, 4)
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        fa.flash_attn_with_kvcache(q[None], q[None], q[None], rotary_cos=q)
