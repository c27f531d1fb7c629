#!/usr/bin/env python3
"""Time torch.nn.functional.scaled_dot_product_attention per backend by the same
method as fa-bench, and write the same JSON schema (a list of BenchRun, one per
backend: torch-default, torch-flash, torch-efficient, torch-cudnn).

Method: warm up; estimate one call's GPU time (the median of three batches of ten
warm calls queued behind a GPU sleep, so the CPU's launch cost, which differs per
backend, does not pick the method); calls under --graph-below-us are timed by
replaying a CUDA graph of many calls (per-call time); longer calls are timed with
events around each call, after an L2-flushing memset queued ahead of the start
event. Batches until IQR/median/sqrt(n) < --target-spread or the budget runs out.

Usage: python3 ci/bench_torch.py --shape 4,16,2048,64 [--shape ...] [--dtype f16] --json out.json
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "torch-default": None,
    "torch-flash": SDPBackend.FLASH_ATTENTION,
    "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def quantile(xs, q):
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def converged(xs, min_samples, target):
    if len(xs) < min_samples:
        return False
    med = quantile(xs, 0.5)
    return (quantile(xs, 0.75) - quantile(xs, 0.25)) / med / math.sqrt(len(xs)) < target


def time_case(fn, args, flush):
    ev = lambda: torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    estimates = []
    for _ in range(3):
        a, b = ev(), ev()
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU work queued ahead of the calls
        fn()
        a.record()
        for _ in range(10):
            fn()
        b.record()
        torch.cuda.synchronize()
        estimates.append(a.elapsed_time(b) * 1e3 / 10)
    estimate = quantile(estimates, 0.5)
    samples, start = [], time.time()
    budget = args.budget_ms / 1e3
    if estimate < args.graph_below_us:
        method = "graph-replay"
        per_graph = max(10, min(200, int(200 / max(estimate, 0.5))))
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(per_graph):
                fn()
        g.replay()
        while not converged(samples, args.min_samples, args.target_spread) and time.time() - start < budget:
            events = [ev() for _ in range(21)]
            events[0].record()
            for e in events[1:]:
                g.replay()
                e.record()
            torch.cuda.synchronize()
            samples += [x.elapsed_time(y) * 1e3 / per_graph for x, y in zip(events, events[1:])]
    else:
        method = "events-cold-l2"
        while not converged(samples, args.min_samples, args.target_spread) and time.time() - start < budget:
            pairs = [(ev(), ev()) for _ in range(10)]
            for x, y in pairs:
                flush.zero_()
                x.record()
                fn()
                y.record()
            torch.cuda.synchronize()
            samples += [x.elapsed_time(y) * 1e3 for x, y in pairs]
    return method, samples


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", required=True, help="B,H,S,D[,causal]")
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--json", required=True)
    ap.add_argument("--budget-ms", type=int, default=1500)
    ap.add_argument("--target-spread", type=float, default=0.001)
    ap.add_argument("--min-samples", type=int, default=30)
    ap.add_argument("--graph-below-us", type=float, default=30.0)
    args = ap.parse_args()
    dev = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability()
    device = {"name": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}",
              "sm_count": dev.multi_processor_count, "driver": None}
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    runs = {name: [] for name in BACKENDS}
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        for spec in args.shape:
            parts = spec.split(",")
            b, h, s, d = map(int, parts[:4])
            causal = len(parts) > 4 and parts[4] == "causal"
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
            name = f"{dname}-b{b}h{h}s{s}d{d}" + ("-causal" if causal else "")
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            for backend, which in BACKENDS.items():
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                try:
                    if which is None:
                        method, xs = time_case(fn, args, flush)
                    else:
                        with sdpa_kernel(which):
                            method, xs = time_case(fn, args, flush)
                except RuntimeError as e:
                    print(f"{name} {backend}: not available ({str(e).splitlines()[0][:80]})", flush=True)
                    continue
                med = quantile(xs, 0.5)
                mean = sum(xs) / len(xs)
                sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1))
                runs[backend].append({
                    "name": name, "dtype": dname, "batch": b, "heads": h, "kv_heads": h, "seqlen_q": s,
                    "seqlen_k": s, "head_dim": d, "causal": causal, "method": method, "samples": len(xs),
                    "median_us": med, "q1_us": quantile(xs, 0.25), "q3_us": quantile(xs, 0.75), "min_us": min(xs),
                    "mean_us": mean, "rel_stdev": sd / mean, "tflops": flops / (med * 1e-6) / 1e12,
                    "ctas": 0, "num_splits": 0,
                })
                print(f"{name:<28} {backend:<16} {med:10.2f} us {flops / (med * 1e-6) / 1e12:8.1f} TFLOP/s n={len(xs)} {method}", flush=True)
    out = [{"device": device, "implementation": k, "cases": v} for k, v in runs.items()]
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
