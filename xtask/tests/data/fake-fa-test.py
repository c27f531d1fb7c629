#!/usr/bin/env python3
"""A stand-in for `fa-test` (kernel-ffi/src/bin/fa-test.rs): the spread test
matrix tested without a GPU. Its matrix is c0…c9 with work 10…1. With
--cases it runs the named cases and writes a TestRun; a case named in
$FA_KERNEL_DIR/die kills it before it writes anything, as a crashed or
killed driver would; a case named in $FA_KERNEL_DIR/drop is left out of
the results, as a driver that lost it would; one named in
$FA_KERNEL_DIR/skip is reported skipped, as an entry the kernel set lacks is
(--list --runnable lists it all the same, as a listing on another GPU would)."""
import json, os, sys

args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None

device = {"name": "Fake GPU", "compute_capability": "9.0", "sm_count": 132, "driver": None,
          "uuid": "GPU-" + os.environ.get("CUDA_VISIBLE_DEVICES", "default")}
if "--info" in args:
    print(json.dumps(device))
    sys.exit(0)
matrix = [{"name": f"c{i}", "work": float(10 - i)} for i in range(10)]
if "--list" in args:
    open(opt("--json"), "w").write(json.dumps(matrix))
    sys.exit(0)
names = [l.strip() for l in open(opt("--cases")) if l.strip()]
die = os.path.join(os.environ.get("FA_KERNEL_DIR", ""), "die")
if os.path.exists(die) and any(n in open(die).read().split(",") for n in names):
    os.kill(os.getpid(), 9)
def names_in(file):
    path = os.path.join(os.environ.get("FA_KERNEL_DIR", ""), file)
    return open(path).read().split(",") if os.path.exists(path) else []
dropped, skipped = names_in("drop"), names_in("skip")
cases = [{"name": n, "dtype": "f16", "batch": 1, "heads": 1, "kv_heads": 1, "seqlen_q": 1, "seqlen_k": 1,
          "head_dim": 64, "causal": False, "layout": "bhsd", "variant": "portable", "block_m": 64,
          "key_groups": 1, "persistent": False, "splits": "auto", "num_splits": 1, "lse": False,
          "reference": "cpu-f64", "rel_l2": 0.001, "max_abs": 0.001, "lse_max_abs": 0.0,
          "tol_rel_l2": 0.01, "tol_max_abs": 0.01, "tol_lse": 0.01, "non_finite": 0,
          "passed": n != os.environ.get("FAIL"), "error": None} for n in names if n not in dropped + skipped]
for i, n in enumerate(names):
    print(f"[{i + 1}/{len(names)}] ok {n} rel_l2 1e-3 max_abs 1e-3", file=sys.stderr)
open(opt("--json"), "w").write(json.dumps({"device": device, "seed": 7, "setup_s": 0.25, "cases": cases,
                                        "skipped": [{"name": n, "why": "no such entry"} for n in names if n in skipped]}))
sys.exit(0 if all(c["passed"] for c in cases) else 1)
