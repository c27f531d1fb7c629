#!/usr/bin/env python3
"""Sliding windows and softcaps: ours against the same-run anchors, timed by
bench_torch.py's method in one process (ours through the flash_pipeline wheel's
flash_attn_func, so every implementation pays the same Python launch path).

- a sliding window (fa-bench `B,H,S,D,causal,window=W`: FlashAttention's
  window_size (W, 0)) by FlexAttention with the same block mask (compiled),
  and ours on the same shape fully causal, whose TF/s the band's should match;
- a softcap (`B,H,S,D[,causal],softcap=C`) by FlexAttention with a tanh
  score_mod, and ours and FlexAttention without it.

TF/s count the FLOPs of the pairs each mask keeps (fa_schema::shape::kept_pairs).

Usage: python3 ci/bench_masks.py [--window 1,16,32768,128,4096] [--softcap 2,16,4096,128,50,causal] --json out.json
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serving import DTYPES, add_anchor_args, timed, write_results  # noqa: E402


def kept_pairs(sq, sk, left, right):
    """fa_schema::shape::kept_pairs: keys row i sees, i + sk - sq - left … i + sk - sq + right; None unbounded."""
    total = 0
    for i in range(sq):
        diag = i + sk - sq
        lo = 0 if left is None else max(diag - left, 0)
        hi = sk - 1 if right is None else min(diag + right, sk - 1)
        total += max(hi - lo + 1, 0)
    return total


def flex_attention():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention as flex

    return torch.compile(flex, dynamic=False), create_block_mask


def ours():
    try:
        import flash_pipeline as fp
    except ImportError:
        return None
    return fp


def bench_window(results, spec, dtype, dname, args, flush):
    b, h, s, d, w = map(int, spec.split(","))
    name = f"{dname}-b{b}h{h}s{s}d{d}-causal-w{w}"
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
    band = 4.0 * b * h * d * kept_pairs(s, s, w, 0)
    causal = 4.0 * b * h * d * kept_pairs(s, s, None, 0)
    fp = ours()
    if fp is not None:
        timed(results, name, "ours-python", lambda: fp.flash_attn_func(q, k, v, causal=True, window_size=(w, 0)),
              args, flush, flops=band)
        timed(results, name.replace(f"-w{w}", ""), "ours-python", lambda: fp.flash_attn_func(q, k, v, causal=True),
              args, flush, flops=causal)
    flex, create_block_mask = flex_attention()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def sliding(b_, h_, qi, ki):
        return (ki <= qi) & (qi - ki <= w)

    def is_causal(b_, h_, qi, ki):
        return ki <= qi

    for impl, mod, flops, label in (("torch-flex", sliding, band, name),
                                    ("torch-flex", is_causal, causal, name.replace(f"-w{w}", ""))):
        try:
            mask = create_block_mask(mod, None, None, s, s, device="cuda")
        except Exception as e:  # reported, not fatal
            print(f"{label:<40} {impl:<22} not available: {str(e).splitlines()[0][:120]}", flush=True)
            continue
        timed(results, label, impl, lambda: flex(qt, kt, vt, block_mask=mask), args, flush, flops=flops)


def bench_softcap(results, spec, dtype, dname, args, flush):
    parts = spec.split(",")
    b, h, s, d, c = map(int, parts[:5])
    causal = len(parts) > 5 and parts[5] == "causal"
    base = f"{dname}-b{b}h{h}s{s}d{d}" + ("-causal" if causal else "")
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
    flops = 4.0 * b * h * d * kept_pairs(s, s, None, 0 if causal else None)
    fp = ours()
    if fp is not None:
        timed(results, f"{base}-cap{c}", "ours-python",
              lambda: fp.flash_attn_func(q, k, v, causal=causal, softcap=float(c)), args, flush, flops=flops)
        timed(results, base, "ours-python", lambda: fp.flash_attn_func(q, k, v, causal=causal), args, flush,
              flops=flops)
    flex, create_block_mask = flex_attention()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = create_block_mask(lambda b_, h_, qi, ki: ki <= qi, None, None, s, s, device="cuda") if causal else None

    def capped(score, b_, h_, qi, ki):
        return c * torch.tanh(score / c)

    timed(results, f"{base}-cap{c}", "torch-flex", lambda: flex(qt, kt, vt, score_mod=capped, block_mask=mask),
          args, flush, flops=flops)
    timed(results, base, "torch-flex", lambda: flex(qt, kt, vt, block_mask=mask), args, flush, flops=flops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", action="append", help="B,H,S,D,W: causal with window_size (W, 0)")
    ap.add_argument("--softcap", action="append", help="B,H,S,D,C[,causal]")
    add_anchor_args(ap)
    args = ap.parse_args()
    windows = args.window or ["1,16,32768,128,4096"]
    softcaps = args.softcap or ["2,16,4096,128,50,causal", "1,8,16384,128,50"]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    results = []
    for dname in args.dtype.split(","):
        for spec in windows:
            bench_window(results, spec, DTYPES[dname], dname, args, flush)
        for spec in softcaps:
            bench_softcap(results, spec, DTYPES[dname], dname, args, flush)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
