#!/usr/bin/env python3
"""Compare fa-run's output with PyTorch's scaled_dot_product_attention on the same
safetensors inputs. Both are measured against a float64 reference of the same
(dtype-rounded) inputs, so the table says how far each is from the truth, and
from each other.

Serving files and FP8 (float8_e4m3fn with descales) files too.

Usage: python3 ci/compare_torch.py --fa-run dist/fa-run [--workdir DIR]
Needs a CUDA GPU, torch and safetensors. Exit 1 if fa-run is outside the
tolerance (the same per-dtype tolerance as `cargo xtask test`).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.nn.attention.bias import causal_lower_right

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}  # relative L2, as in kernel-ffi/src/check.rs

# (dtype, B, H, Hkv, Sq, Sk, D, causal, layout)
CASES = [
    (torch.float16, 2, 8, 8, 512, 512, 64, False, "bhsd"),
    (torch.bfloat16, 2, 8, 8, 512, 512, 64, True, "bhsd"),
    (torch.float16, 1, 16, 4, 1000, 1000, 128, True, "bshd"),
    (torch.bfloat16, 2, 4, 1, 77, 300, 128, True, "bhsd"),
    (torch.float16, 1, 4, 2, 300, 77, 64, True, "bshd"),
    (torch.bfloat16, 4, 16, 16, 2048, 2048, 128, False, "bshd"),
]


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def reference(q, k, v, causal):
    """float64 attention of one sequence: q (Sq, H, D), k and v (Sk, Hkv, D); (out, lse) per head."""
    h, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    qd = q.double().transpose(0, 1)
    kd = k.double().transpose(0, 1).repeat_interleave(h // hkv, 0)
    vd = v.double().transpose(0, 1).repeat_interleave(h // hkv, 0)
    s = qd @ kd.transpose(-1, -2) / d**0.5
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        keep = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(diagonal=sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ vd).transpose(0, 1), torch.logsumexp(s, -1)


def serving(fa_run, work):
    """fa-run on serving files in FlashAttention's layouts: packed varlen
    (cu_seqlens_q/k) and a paged cache (block_table, cache_seqlens) with one
    decode row per sequence; each sequence against the float64 reference."""
    rows = []
    dtype, h, hkv, d = torch.bfloat16, 8, 2, 128
    lens_q, lens_k = [1, 77, 0, 300], [5, 200, 9, 300]
    cu = lambda lens: torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, dtype=dtype)
    k = torch.randn(sum(lens_k), hkv, d, dtype=dtype)
    v = torch.randn(sum(lens_k), hkv, d, dtype=dtype) + 0.5
    ps, seqused = 16, [40, 1, 129]
    pages = [-(-n // ps) for n in seqused]
    perm = torch.randperm(sum(pages)).int()
    table = torch.zeros(len(seqused), max(pages), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at:at + n]
        at += n
    kc = torch.randn(sum(pages), ps, hkv, d, dtype=dtype)
    vc = torch.randn(sum(pages), ps, hkv, d, dtype=dtype) + 0.5
    qc = torch.randn(len(seqused), 1, h, d, dtype=dtype)
    files = {
        "varlen": ({"q": q, "k": k, "v": v, "cu_seqlens_q": cu(lens_q), "cu_seqlens_k": cu(lens_k)}, True),
        "kvcache": ({"q": qc, "k": kc, "v": vc, "cache_seqlens": torch.tensor(seqused, dtype=torch.int32),
                     "block_table": table}, False),
    }
    for name, (tensors, causal) in files.items():
        inp, outp = os.path.join(work, f"{name}.safetensors"), os.path.join(work, f"{name}-out.safetensors")
        save_file(tensors, inp)
        cmd = [fa_run, "--input", inp, "--output", outp, "--layout", "bshd", "--lse"] + (["--causal"] if causal else [])
        subprocess.run(cmd, check=True)
        res = load_file(outp, device="cuda")
        errs, lse_err, good = [], 0.0, True
        if name == "varlen":
            cq, ck = cu(lens_q).tolist(), cu(lens_k).tolist()
            seqs = [(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], res["out"][cq[i]:cq[i + 1]],
                     res["lse"][:, cq[i]:cq[i + 1]]) for i in range(len(lens_q))]
        else:
            seqs = []
            for i, n in enumerate(seqused):
                rows_ = table[i, :pages[i]].long()
                seqs.append((qc[i], kc[rows_].reshape(-1, hkv, d)[:n], vc[rows_].reshape(-1, hkv, d)[:n],
                             res["out"][i], res["lse"][i]))
        for sq_, sk_, sv_, got, got_lse in seqs:
            if sq_.shape[0] == 0:
                continue
            want, want_lse = reference(sq_.cuda(), sk_.cuda(), sv_.cuda(), causal)
            seen = want_lse.transpose(0, 1).isfinite()
            errs.append(rel_l2(got[seen], want[seen]) if seen.any() else 0.0)
            lse_err = max(lse_err, (got_lse[want_lse.isfinite()].double() - want_lse[want_lse.isfinite()]).abs().max().item())
            good &= bool(got.isfinite().all())
        err = max(errs)
        good &= err <= TOL[dtype] and lse_err <= 1e-3
        rows.append(("bfloat16", f"{name} H{h}/{hkv} D{d}", causal, "fa", err, float("nan"), float("nan"), lse_err,
                     "ok" if good else "FAIL"))
    return rows


# FP8: (B, H, Hkv, Sq, Sk, D, causal, layout, out dtype, descales). fa-run reads
# F8_E4M3 q, k, v and F32 descales; the reference is float64 over the
# dequantised inputs rounded to bfloat16 (the route of calls without an e4m3
# entry; e4m3 entries' scores, exact or FP8 wgmma's, meet it too), SDPA's the
# same bf16 inputs.
# Tolerances as python/tests/test_gpu.py's FP8 ones: rel L2 2.5e-2, lse 1e-2.
FP8_CASES = [
    (2, 8, 2, 300, 700, 128, True, "bshd", "bf16", True),
    (1, 4, 4, 512, 512, 64, False, "bhsd", "f16", False),
    (1, 8, 8, 77, 1000, 256, True, "bhsd", "bf16", True),
]


def fp8(fa_run, work):
    """fa-run on float8_e4m3fn files: one row per FP8_CASES entry."""
    rows = []
    for i, (b, h, hkv, sq, sk, d, causal, layout, out_dtype, with_descales) in enumerate(FP8_CASES):
        q8 = torch.randn(b, h, sq, d, device="cuda").to(torch.float8_e4m3fn)
        k8 = torch.randn(b, hkv, sk, d, device="cuda").to(torch.float8_e4m3fn)
        v8 = (torch.randn(b, hkv, sk, d, device="cuda") + 0.5).to(torch.float8_e4m3fn)
        ones = torch.ones(b, hkv, device="cuda")
        qd, kd, vd = (torch.rand(b, hkv, device="cuda") + 0.5 if with_descales else ones for _ in range(3))
        to_file = (lambda t: t.transpose(1, 2).contiguous()) if layout == "bshd" else (lambda t: t.contiguous())
        tensors = {"q": to_file(q8), "k": to_file(k8), "v": to_file(v8)}
        if with_descales:
            tensors.update(q_descale=qd, k_descale=kd, v_descale=vd)
        inp, outp = os.path.join(work, f"fp8in{i}.safetensors"), os.path.join(work, f"fp8out{i}.safetensors")
        save_file(tensors, inp)
        cmd = [fa_run, "--input", inp, "--output", outp, "--layout", layout, "--lse", "--out-dtype", out_dtype]
        subprocess.run(cmd + (["--causal"] if causal else []), check=True)
        res = load_file(outp, device="cuda")
        out = res["out"].transpose(1, 2) if layout == "bshd" else res["out"]
        want = torch.bfloat16 if out_dtype == "bf16" else torch.float16
        deq = lambda x8, f, heads: (x8.float() * f.repeat_interleave(heads // hkv, 1)[:, :, None, None]).bfloat16()
        q, k, v = deq(q8, qd, h), deq(k8, kd, hkv), deq(v8, vd, hkv)
        rep = h // hkv
        s = q.double() @ k.double().repeat_interleave(rep, 1).transpose(-1, -2) / d**0.5
        if causal:
            keep = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(diagonal=sk - sq)
            s = s.masked_fill(~keep, float("-inf"))
        lse_ref = torch.logsumexp(s, -1)
        ref = torch.softmax(s, -1).nan_to_num(0.0) @ v.double().repeat_interleave(rep, 1)
        mask = causal_lower_right(sq, sk) if causal else None
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv != h)
        seen = lse_ref.isfinite()
        fa_err, sdpa_err = rel_l2(out[seen], ref[seen]), rel_l2(sdpa[seen], ref[seen])
        lse_err = (res["lse"][seen].double() - lse_ref[seen]).abs().max().item()
        good = out.dtype == want and fa_err <= 2.5e-2 and lse_err <= 1e-2 and out.isfinite().all().item()
        rows.append((f"e4m3>{out_dtype}", f"B{b} H{h}/{hkv} Sq{sq} Sk{sk} D{d}", causal, layout,
                     fa_err, sdpa_err, rel_l2(out[seen], sdpa[seen]), lse_err, "ok" if good else "FAIL"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fa-run", required=True)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="fa-compare-")
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows, ok = [], True
    for i, (dtype, b, h, hkv, sq, sk, d, causal, layout) in enumerate(CASES):
        q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) + 0.5
        to_file = (lambda t: t.transpose(1, 2).contiguous()) if layout == "bshd" else (lambda t: t.contiguous())
        inp, outp = os.path.join(work, f"in{i}.safetensors"), os.path.join(work, f"out{i}.safetensors")
        save_file({"q": to_file(q), "k": to_file(k), "v": to_file(v)}, inp)
        cmd = [args.fa_run, "--input", inp, "--output", outp, "--layout", layout, "--lse"] + (["--causal"] if causal else [])
        subprocess.run(cmd, check=True)
        res = load_file(outp, device="cuda")
        out = res["out"].transpose(1, 2) if layout == "bshd" else res["out"]
        mask = causal_lower_right(sq, sk) if causal else None
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv != h)
        # float64 reference on the same rounded inputs; rows that see no key are 0.
        rep = h // hkv
        kd, vd = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
        s = q.double() @ kd.transpose(-1, -2) / d**0.5
        if causal:
            keep = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(diagonal=sk - sq)
            s = s.masked_fill(~keep, float("-inf"))
        lse_ref = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        ref = p @ vd
        seen = lse_ref.isfinite()
        fa_err, sdpa_err = rel_l2(out[seen], ref[seen]), rel_l2(sdpa[seen], ref[seen])
        unseen_zero = bool((out[~seen] == 0).all())
        lse_err = (res["lse"][seen].double() - lse_ref[seen]).abs().max().item()
        good = fa_err <= TOL[dtype] and unseen_zero and lse_err <= 1e-3 and out.isfinite().all().item()
        ok &= good
        rows.append((str(dtype).split(".")[1], f"B{b} H{h}/{hkv} Sq{sq} Sk{sk} D{d}", causal, layout,
                     fa_err, sdpa_err, rel_l2(out[seen], sdpa[seen]), lse_err, "ok" if good else "FAIL"))
    for row in serving(args.fa_run, work) + fp8(args.fa_run, work):
        ok &= row[-1] == "ok"
        rows.append(row)
    print(f"{'dtype':9} {'shape':30} {'causal':6} {'layout':6} {'fa vs f64':>10} {'sdpa vs f64':>11} {'fa vs sdpa':>10} {'lse err':>9}  result")
    for r in rows:
        print(f"{r[0]:9} {r[1]:30} {str(r[2]):6} {r[3]:6} {r[4]:10.2e} {r[5]:11.2e} {r[6]:10.2e} {r[7]:9.1e}  {r[8]}")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
