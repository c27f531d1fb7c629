#!/usr/bin/env python3
"""The serving shapes' same-run anchors, timed by bench_torch.py's method:

- the GPU's device-to-device copy bandwidth (bytes read + written per second),
  the roofline a decode call's K/V reads are measured against;
- varlen prefill (fa-bench `varlen:B,H,HKV,S,D,causal`: the same lengths) by
  torch.nn.attention.varlen.varlen_attn;
- paged decode (fa-bench `paged:B,H,HKV,S,D,PAGE`: the same cache lengths) by
  FlexAttention over a paged cache (torch.nn.attention.experimental's
  PagedAttention, compiled) and by SDPA on the same cache laid out densely
  (padded to the longest, a key-padding mask);
- and, where the flash_pipeline wheel is importable, ours through its
  flash_attn_varlen_func / flash_attn_with_kvcache, in the same process.

Usage: python3 ci/bench_serving.py [--varlen 16,32,8,8192,128,causal] [--paged 64,32,8,32768,128,16] --json out.json
       [--page-runs G] [--ours-only]   (a page-size or page-locality sweep of ours alone)
Shapes named with --varlen or --paged replace both default sets.
"""
import argparse
import inspect
import json
import math
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import quantile, time_case  # noqa: E402

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def rounded(x):
    return math.floor(x + 0.5)


def varlen_lengths(b, s):
    """fa_schema::shape::Shape::lengths for varlen: 1 + (S - 1)·(i / (B - 1))³."""
    return [1 + rounded((s - 1) * (i / (b - 1) if b > 1 else 1.0) ** 3) for i in range(b)]


def paged_lengths(b, s):
    """fa_schema::shape::Shape::lengths for paged: S/32 … S spread, order mixed."""
    lo = max(1, s // 32)
    return [lo + rounded((s - lo) * (((i * 7) % b) / (b - 1) if b > 1 else 1.0)) for i in range(b)]


def offsets(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def record(results, name, impl, method, xs, flops=0.0, kv_bytes=0.0, moved=0.0):
    med = quantile(xs, 0.5)
    r = {"name": name, "implementation": impl, "method": method, "samples": len(xs), "median_us": med,
         "q1_us": quantile(xs, 0.25), "q3_us": quantile(xs, 0.75)}
    line = f"{name:<40} {impl:<22} {med:10.2f} us"
    if flops:
        r["tflops"] = flops / (med * 1e-6) / 1e12
        line += f" {r['tflops']:8.1f} TFLOP/s"
    if kv_bytes:
        r["kv_tbps"] = kv_bytes / (med * 1e-6) / 1e12
        line += f" {r['kv_tbps']:6.2f} TB/s of K/V"
    if moved:
        r["tbps"] = moved / (med * 1e-6) / 1e12
        line += f" {r['tbps']:6.2f} TB/s read+write"
    print(line, flush=True)
    results.append(r)


def timed(results, name, impl, fn, args, flush, **amounts):
    try:
        method, xs = time_case(fn, args, flush)
    except Exception as e:  # an anchor that cannot run here is reported, not fatal
        print(f"{name:<40} {impl:<22} not available: {str(e).splitlines()[0][:120]}", flush=True)
        results.append({"name": name, "implementation": impl, "error": str(e).splitlines()[0]})
        return
    record(results, name, impl, method, xs, **amounts)


def copy_bandwidth(results, args, flush):
    n = 1 << 30  # 1 GiB each way: far past L2
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    timed(results, "copy-1GiB", "torch-copy", lambda: dst.copy_(src), args, flush, moved=2.0 * n)


def bench_varlen(results, spec, dtype, dname, args, flush):
    parts = spec.split(",")
    b, h, hkv, s, d = map(int, parts[:5])
    causal = len(parts) > 5 and parts[5] == "causal"
    lens = varlen_lengths(b, s)
    total = sum(lens)
    name = f"{dname}-varlen-b{b}h{h}kv{hkv}s{s}d{d}" + ("-causal" if causal else "")
    flops = sum(4 * h * n * n * d / (2 if causal else 1) for n in lens)
    q = torch.randn(total, h, d, device="cuda", dtype=dtype)
    k = torch.randn(total, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(total, hkv, d, device="cuda", dtype=dtype)
    cu = offsets(lens)
    print(f"{name}: {b} sequences, {total} tokens, lengths {lens}", flush=True)
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        print(f"varlen_attn not available: {e}")
        varlen_attn = None
    if varlen_attn is not None and not args.ours_only:
        params = inspect.signature(varlen_attn).parameters
        kw, kk, vv = {}, k, v
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        elif hkv != h:  # expanded outside the timed call
            kk, vv = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))
        if causal:
            if "is_causal" in params:
                kw["is_causal"] = True
            else:
                kw["window_size"] = (-1, 0)
        timed(results, name, "torch-varlen_attn", lambda: varlen_attn(q, kk, vv, cu, cu, s, s, **kw), args, flush,
              flops=flops)
    ours = flash_pipeline()
    if ours is not None:
        timed(results, name, "ours-python", lambda: ours.flash_attn_varlen_func(q, k, v, cu, cu, s, s, causal=causal),
              args, flush, flops=flops)


def block_table(pages, runs):
    """A block table for sequences of `pages` pages: a sequence's pages lie in
    runs of `runs` consecutive physical pages, the runs in a fixed shuffled
    order (1: every page shuffled, as a serving cache hands them out; 0: all in
    order). Returns the table on the GPU and the pages the cache needs."""
    g = max(runs, 1)
    counts = [-(-n // g) for n in pages]
    total = sum(counts)
    order = torch.arange(total) if runs == 0 else torch.randperm(total, generator=torch.Generator().manual_seed(17))
    table = torch.zeros(len(pages), max(pages), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        slots = torch.arange(n)
        table[i, :n] = (order[at + slots // g] * g + slots % g).to(torch.int32)
        at += counts[i]
    return table.cuda(), total * g


def bench_paged(results, spec, dtype, dname, args, flush):
    b, h, hkv, s, d, ps = map(int, spec.split(","))
    lens = paged_lengths(b, s)
    name = f"{dname}-paged{ps}-b{b}h{h}kv{hkv}s{s}d{d}"
    kv_bytes = 2.0 * 2 * sum(lens) * hkv * d
    flops = sum(4.0 * h * n * d for n in lens)
    pages = [-(-n // ps) for n in lens]
    table, n_pages = block_table(pages, args.page_runs)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype)
    k_pages = torch.randn(n_pages, ps, hkv, d, device="cuda", dtype=dtype)
    v_pages = torch.randn(n_pages, ps, hkv, d, device="cuda", dtype=dtype)
    print(f"{name}: {b} sequences, {sum(lens)} cached keys ({kv_bytes / 1e9:.2f} GB of K/V), {n_pages} pages",
          flush=True)

    cache = SimpleNamespace(q=q, k_pages=k_pages, v_pages=v_pages, table=table, seqlens=seqlens, lens=lens,
                            pages=pages, page_size=ps, n_pages=n_pages, longest=s)
    if not args.ours_only:
        paged_anchors(results, name, args, flush, cache, flops=flops, kv_bytes=kv_bytes)
    ours = flash_pipeline()
    if ours is not None:
        timed(results, name, "ours-python",
              lambda: ours.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table),
              args, flush, flops=flops, kv_bytes=kv_bytes)


def paged_anchors(results, name, args, flush, c, flops, kv_bytes):
    """SDPA on the cache `c` (bench_paged's) laid out densely, and paged FlexAttention over it."""
    b, _, _, d = c.q.shape
    hkv, s, ps, width, dtype = c.k_pages.shape[2], c.longest, c.page_size, max(c.pages), c.q.dtype
    table, pages, k_pages, v_pages = c.table, c.pages, c.k_pages, c.v_pages
    qt = c.q.transpose(1, 2)  # [B, H, 1, D]
    # SDPA on the same cache laid out densely: [B, Hkv, longest, D] and a key-padding mask.
    dense_k = torch.zeros(b, hkv, s, d, device="cuda", dtype=dtype)
    dense_v = torch.zeros_like(dense_k)
    for i, n in enumerate(c.lens):
        rows = table[i, :pages[i]].long()
        dense_k[i, :, :n] = k_pages[rows].reshape(-1, hkv, d)[:n].transpose(0, 1)
        dense_v[i, :, :n] = v_pages[rows].reshape(-1, hkv, d)[:n].transpose(0, 1)
    mask = (torch.arange(s, device="cuda")[None, :] < c.seqlens[:, None])[:, None, None, :]
    timed(results, name, "torch-sdpa-dense",
          lambda: F.scaled_dot_product_attention(qt, dense_k, dense_v, attn_mask=mask, enable_gqa=True), args, flush,
          flops=flops, kv_bytes=kv_bytes)
    del dense_k, dense_v

    # FlexAttention over the paged cache.
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        pa = PagedAttention(c.n_pages, ps, b)
        pa.page_table[:, :width] = table.long()
        pa.page_table[:, width:] = -1
        for i, n in enumerate(pages):
            pa.physical_to_logical[i, table[i, :n].long()] = torch.arange(n, device="cuda")
        pa.capacity[:] = torch.tensor(pages, device="cuda") * ps
        k_cache = k_pages.permute(2, 0, 1, 3).reshape(1, hkv, c.n_pages * ps, d)
        v_cache = v_pages.permute(2, 0, 1, 3).reshape(1, hkv, c.n_pages * ps, d)

        def causal_free(b_, h_, q_idx, kv_idx):
            return kv_idx >= 0

        logical = create_block_mask(causal_free, b, None, 1, width * ps, device="cuda", BLOCK_SIZE=(128, ps))
        physical = pa.convert_logical_block_mask(logical, kv_len=c.seqlens.long())
        flex = torch.compile(flex_attention, dynamic=False)
        timed(results, name, "torch-flex-paged",
              lambda: flex(qt, k_cache, v_cache, block_mask=physical, enable_gqa=True), args, flush, flops=flops,
              kv_bytes=kv_bytes)
    except Exception as e:
        print(f"{name:<40} torch-flex-paged       not available: {str(e).splitlines()[0][:160]}", flush=True)
        results.append({"name": name, "implementation": "torch-flex-paged", "error": str(e).splitlines()[0]})


def flash_pipeline():
    try:
        import flash_pipeline as fp
    except ImportError:
        return None
    return fp if hasattr(fp, "flash_attn_with_kvcache") else None


def add_anchor_args(ap):
    """The dtype, output and timing flags every anchor script takes."""
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--json", required=True)
    ap.add_argument("--budget-ms", type=int, default=2000)
    ap.add_argument("--target-spread", type=float, default=0.002)
    ap.add_argument("--min-samples", type=int, default=30)
    ap.add_argument("--graph-below-us", type=float, default=0.0)


def write_results(path, results):
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                  indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--varlen", action="append", help="B,H,HKV,S,D[,causal] as fa-bench's varlen:")
    ap.add_argument("--paged", action="append", help="B,H,HKV,S,D,PAGE as fa-bench's paged:")
    ap.add_argument("--page-runs", type=int, default=1,
                    help="a sequence's pages in runs of this many consecutive physical pages (1: shuffled; 0: in order)")
    ap.add_argument("--ours-only", action="store_true", help="time only ours (and the copy bandwidth), no anchors")
    add_anchor_args(ap)
    args = ap.parse_args()
    named = args.varlen or args.paged  # else the shapes
    varlen = args.varlen or ([] if named else ["16,32,8,8192,128,causal"])
    paged = args.paged or ([] if named else ["64,32,8,32768,128,16", "64,32,8,32768,128,128"])
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    results = []
    copy_bandwidth(results, args, flush)
    for dname in args.dtype.split(","):
        for spec in varlen:
            bench_varlen(results, spec, DTYPES[dname], dname, args, flush)
        for spec in paged:
            bench_paged(results, spec, DTYPES[dname], dname, args, flush)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
