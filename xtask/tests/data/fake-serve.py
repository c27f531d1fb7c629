#!/usr/bin/env python3
"""A stand-in for `fa-bench --serve` (kernel-ffi/src/schema.rs, ServeRequest):
the gate's orchestration tested without a GPU. Its side's settings come through
the FA_KERNEL_DIR the gate sets: DIR/factor (how much slower this side is).
Call times share one two-level clock through DIR/../clock, as two processes on
one GPU share its power state; --plant-slowdown adds its fraction."""
import json, os, random, sys

side = os.environ["FA_KERNEL_DIR"]
factor = float(open(os.path.join(side, "factor")).read())
plant = float(sys.argv[sys.argv.index("--plant-slowdown") + 1]) if "--plant-slowdown" in sys.argv else 0.0
clock = os.path.join(side, os.pardir, "clock")
rng = random.Random(os.getpid())

def say(obj):
    print(json.dumps(obj), flush=True)

def level():
    # Shared state: the clock hops between two levels now and then.
    try:
        slow = open(clock).read() == "slow"
    except FileNotFoundError:
        slow = False
    if rng.random() < 0.02:
        slow = not slow
        open(clock, "w").write("slow" if slow else "fast")
    return 1.12 if slow else 1.0

device = {"name": "Fake GPU", "compute_capability": "9.0", "sm_count": 132, "driver": None,
          "uuid": "GPU-00000000-0000-0000-0000-000000000000"}
say({"hello": {"protocol": 1, "device": device, "default_shapes": ["1,1,64,64", "2,16,8192,128,causal"]}})
us = None
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "quit":
        break
    if req["op"] == "setup":
        s = req["shape"].split(",")
        us = 1e-4 * int(s[2]) * int(s[3]) / (2 if s[-1] == "causal" else 1)
        method = req.get("method") or ("graph-replay" if us < 30 else "events-cold-l2")
        entry = {"variant": "hopper", "block_m": 128, "key_groups": 1, "persistent": False}
        say({"ready": {"name": req["dtype"] + "-x", "method": method, "estimate_us": us, "flops": 1e9,
                       "entry": entry, "num_splits": 1, "ctas": 132}})
    elif req["op"] == "time":
        t = us * factor * (1 + plant) * level() * (1 + 0.004 * rng.gauss(0, 1))
        say({"timed": {"us": t, "sm_mhz": 1980.0 if req["probe"] else None}})
    else:
        say({"error": {"message": "unknown op"}})
