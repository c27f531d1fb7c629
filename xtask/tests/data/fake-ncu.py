#!/usr/bin/env python3
"""A stand-in for `ncu --csv --page raw --metrics M,… BENCH --launches-only 1
--shape S …`: one flash_fwd row per --shape, in order, after some program
output. Its side's DIR/factor (through FA_KERNEL_DIR, as fake-serve.py reads
it) scales the duration and the `wait` stall, so a slower side's profile says
what moved."""
import os, sys

args = sys.argv[1:]
metrics = args[args.index("--metrics") + 1].split(",")
shapes = [args[i + 1] for i, a in enumerate(args) if a == "--shape"]
factor = float(open(os.path.join(os.environ["FA_KERNEL_DIR"], "factor")).read())

def value(metric):
    if metric == "gpu__time_duration.sum":
        return f"{1000 * factor:,.0f}"
    if "issue_stalled_wait" in metric:
        return f"{1.0 + 20 * (factor - 1):.3f}"
    if "issue_stalled" in metric:
        return "0.5"
    if metric.startswith("launch__"):
        return "128"
    return "50"

print("==PROF== Connected to process")
print('"ID","Kernel Name",' + ",".join(f'"{m}"' for m in metrics))
print('"","",' + ",".join('"ns"' if m.startswith("gpu__time") else '""' for m in metrics))
for i, _ in enumerate(shapes):
    print(f'"{i}","flash_fwd_hopper_f16_d64",' + ",".join(f'"{value(m)}"' for m in metrics))
