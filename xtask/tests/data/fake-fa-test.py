#!/usr/bin/env python3
"""A stand-in for `fa-test` (kernel-ffi/src/bin/fa-test): the spread test
matrix tested without a GPU. Its matrix is c0…c9 with work 10…1. Files in
$FA_KERNEL_DIR steer it, each a comma-separated list of case names:
  die   — asked for one of these, it is killed, as a crashed driver would be
          (`start` in it: it dies before saying it is ready);
  hang  — asked for one of these, it never answers;
  fault — it answers for one of these and ends, as after a CUDA error;
  skip  — it reports these skipped, as an entry the kernel set lacks
          (--list --runnable lists them all the same, as on another GPU).
With --cases it runs the named cases and writes a TestRun; with --worker it
answers the case names on stdin one JSON line each, after a ready line."""
import json, os, sys, time

args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None

def names_in(file):
    path = os.path.join(os.environ.get("FA_KERNEL_DIR", ""), file)
    return open(path).read().split(",") if os.path.exists(path) else []

device = {"name": "Fake GPU", "compute_capability": "9.0", "sm_count": 132, "driver": None,
          "uuid": "GPU-" + os.environ.get("CUDA_VISIBLE_DEVICES", "default")}
if "--info" in args:
    print(json.dumps(device))
    sys.exit(0)
matrix = [{"name": f"c{i}", "work": float(10 - i)} for i in range(10)]
if "--list" in args:
    open(opt("--json"), "w").write(json.dumps(matrix))
    sys.exit(0)

def case(n):
    return {"name": n, "dtype": "f16", "batch": 1, "heads": 1, "kv_heads": 1, "seqlen_q": 1, "seqlen_k": 1,
            "head_dim": 64, "causal": False, "layout": "bhsd", "variant": "portable", "block_m": 64,
            "key_groups": 1, "persistent": False, "splits": "auto", "num_splits": 1, "lse": False,
            "reference": "cpu-f64", "rel_l2": 0.001, "max_abs": 0.001, "lse_max_abs": 0.0,
            "tol_rel_l2": 0.01, "tol_max_abs": 0.01, "tol_lse": 0.01, "non_finite": 0,
            "passed": n != os.environ.get("FAIL"), "error": None, "seconds": 0.01}

die, hang, fault, skipped = names_in("die"), names_in("hang"), names_in("fault"), names_in("skip")
if "--worker" in args:
    if "start" in die:
        sys.exit(3)
    print(json.dumps({"reply": "ready", "device": device, "seed": int(opt("--seed") or 7), "setup_s": 0.25}),
          flush=True)
    for line in sys.stdin:
        n = line.strip()
        if n in die:
            os.kill(os.getpid(), 9)
        if n in hang:
            time.sleep(3600)
        if n not in [c["name"] for c in matrix]:
            reply = {"reply": "unknown", "name": n}
        elif n in skipped:
            reply = {"reply": "skipped", "case": {"name": n, "why": "no such entry"}}
        else:
            reply = {"reply": "ran", "case": case(n), "last": n in fault}
        print(json.dumps(reply), flush=True)
        if reply.get("last"):
            break
    sys.exit(0)

names = [l.strip() for l in open(opt("--cases")) if l.strip()]
if any(n in die for n in names):
    os.kill(os.getpid(), 9)
cases = [case(n) for n in names if n not in skipped]
for i, n in enumerate(names):
    print(f"[{i + 1}/{len(names)}] ok {n} rel_l2 1e-3 max_abs 1e-3", file=sys.stderr)
open(opt("--json"), "w").write(json.dumps({"device": device, "seed": 7, "setup_s": 0.25, "cases": cases,
                                           "skipped": [{"name": n, "why": "no such entry"} for n in names
                                                       if n in skipped]}))
sys.exit(0 if all(c["passed"] for c in cases) else 1)
