"""Time one prefill forward of a random-init Llama-style model: flash_pipeline vs SDPA.

    python bench_model.py --json out.json                      # 8 layers, hidden 4096, 32/8 heads, seq 4096
    python bench_model.py --layers 2 --hidden 1024 --heads 8 --kv-heads 2 --seq 1024   # smaller

One model is built (bf16, on the GPU) and its attention switched between
backends with ``model.set_attn_implementation``: the same weights, the same
input. The backends are timed interleaved (ours, sdpa, none, ours, sdpa,
none, ...) with CUDA events around ``model(ids)`` after warm-up runs; the
table gives medians and interquartile ranges.

Attention share, by subtraction: "none" is the same model whose attention
function returns zeros of the output's shape without reading q, k, v (one
memset). attention time = median(backend) - median(none) and share =
attention time / median(backend). It counts all the time attention adds
(kernel, launch and Python overhead), not only kernel time, and it is a
difference of medians, so it carries the noise of both.
"""

import argparse
import json
import statistics
import sys

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import flash_pipeline
import flash_pipeline.transformers as fpt

NONE = "no_attention"


def no_attention(module, query, key, value, attention_mask, **kwargs):
    b, h, sq, d = query.shape
    return query.new_zeros(b, sq, h, d), None


def summary(ms):
    q1, med, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return {"median_ms": med, "q1_ms": q1, "q3_ms": q3, "iqr_ms": q3 - q1, "samples_ms": ms}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if a.samples < 2:
        p.error("--samples must be at least 2")
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]

    ours = fpt.register()
    AttentionInterface.register(NONE, no_attention)
    AttentionMaskInterface.register(NONE, sdpa_mask)

    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=max(a.seq, 2048),
    )
    head_dim = a.hidden // a.heads
    if head_dim not in flash_pipeline.supported()["head_dims"]:
        p.error(f"head dim {head_dim} (hidden / heads) is not one the kernels run")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype).eval()
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def forward(impl):
        model.set_attn_implementation(impl)
        return model(ids, use_cache=False, logits_to_keep=1).logits

    impls = [ours, "sdpa", NONE]
    with torch.inference_mode():
        fpt.stats.clear()
        logits = {impl: forward(impl).float() for impl in impls}
        if set(fpt.stats) != {"kernel"}:
            sys.exit(f"flash_pipeline did not run every layer on its kernel: {fpt.stats}")
        max_diff = (logits[ours] - logits["sdpa"]).abs().max().item()
        for _ in range(a.warmup):
            for impl in impls:
                forward(impl)
        ms = {impl: [] for impl in impls}
        for _ in range(a.samples):
            for impl in impls:
                model.set_attn_implementation(impl)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(ids, use_cache=False, logits_to_keep=1)
                end.record()
                end.synchronize()
                ms[impl].append(start.elapsed_time(end))

    results = {impl: summary(v) for impl, v in ms.items()}
    base = results[NONE]["median_ms"]
    attention = {}
    for impl in (ours, "sdpa"):
        t = results[impl]["median_ms"]
        attention[impl] = {"ms": t - base, "share": (t - base) / t}

    print(f"{torch.cuda.get_device_name()}  {a.layers} layers, hidden {a.hidden}, heads {a.heads}/{a.kv_heads} "
          f"(head dim {head_dim}), batch {a.batch} x seq {a.seq}, {a.dtype}, {a.samples} samples")
    print(f"{'attention':<14}{'median ms':>11}{'IQR ms':>9}{'attn ms':>9}{'attn share':>12}")
    for impl in impls:
        r = results[impl]
        extra = f"{attention[impl]['ms']:>9.2f}{attention[impl]['share']:>11.1%}" if impl in attention else ""
        print(f"{impl:<14}{r['median_ms']:>11.2f}{r['iqr_ms']:>9.2f}{extra}")
    speedup = results["sdpa"]["median_ms"] / results[ours]["median_ms"]
    print(f"model speedup over sdpa: {speedup:.3f}x; last-token logits max |diff| vs sdpa: {max_diff:.4g}")

    if a.json:
        out = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "flash_pipeline": flash_pipeline.__version__,
            "config": {k: v for k, v in vars(a).items() if k != "json"},
            "head_dim": head_dim,
            "method": "CUDA events around model(ids, use_cache=False, logits_to_keep=1), backends interleaved; "
                      "attention = median(backend) - median(no_attention)",
            "results": results,
            "attention": attention,
            "speedup_vs_sdpa": speedup,
            "logits_max_abs_diff_vs_sdpa": max_diff,
        }
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
