#!/usr/bin/env python3
"""The e4m3 error of fa-run by sequence length: how a kernel's low-precision
sums behave as the key count grows (the Hopper kernel's FP8 wgmma accumulates
with about 13 significand bits; README, "FP8 (e4m3) inputs").

For each length: uniform e4m3 inputs (q, k in ±1.5, v in [-0.5, 1.5]), unit
descales, fa-run with --lse, against torch's float64 attention of the same
e4m3 values. Prints one JSON line per run: relative L2 error of O, max abs
error, bias (mean error over mean |O|) and the LSE's max and mean error.

Usage: python3 ci/fp8_error_by_length.py --fa-run dist/fa-run [--variant hopper]
       [--head-dim 128] [--lengths 1024,4096,16384,32768] [--workdir DIR]
Needs a CUDA GPU of compute capability 8.9 or 9.0, torch and safetensors.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fa-run", required=True)
    ap.add_argument("--variant", default="hopper", choices=["auto", "portable", "hopper"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--lengths", default="1024,4096,16384,32768")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="fp8_len_")
    inp, outp = os.path.join(work, "in.safetensors"), os.path.join(work, "out.safetensors")
    d, h = args.head_dim, args.heads
    failed = False
    for s in (int(x) for x in args.lengths.split(",")):
        torch.manual_seed(d + s)
        q = (torch.rand(1, h, s, d, device="cuda") * 3 - 1.5).to(torch.float8_e4m3fn)
        k = (torch.rand(1, h, s, d, device="cuda") * 3 - 1.5).to(torch.float8_e4m3fn)
        v = (torch.rand(1, h, s, d, device="cuda") * 2 - 0.5).to(torch.float8_e4m3fn)
        save_file({"q": q, "k": k, "v": v}, inp)
        scores = q.double() @ k.double().transpose(-1, -2) / d**0.5
        lse_ref = torch.logsumexp(scores, -1)
        o_ref = torch.softmax(scores, -1) @ v.double()
        del scores
        run = subprocess.run(
            [args.fa_run, "--input", inp, "--output", outp, "--variant", args.variant, "--lse"],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            print(f"fa-run failed at {s} keys: {run.stderr.strip()[-400:]}", file=sys.stderr)
            failed = True
            continue
        got = load_file(outp, device="cuda")
        err = got["out"].double() - o_ref
        lse_err = got["lse"].double() - lse_ref
        row = {
            "variant": args.variant,
            "head_dim": d,
            "keys": s,
            "rel_l2": (err.norm() / o_ref.norm()).item(),
            "max_abs": err.abs().max().item(),
            "bias": (err.mean() / o_ref.abs().mean()).item(),
            "lse_max_abs": lse_err.abs().max().item(),
            "lse_bias": lse_err.mean().item(),
        }
        print(json.dumps(row), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
