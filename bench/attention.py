"""scaled_dot_product_attention on "tpu", eager: the fused overrideable backend
(torch_pjrt/_attention.py) against the math backend, next to PyTorch CPU eager
and CPU Inductor, all measured in this run.

    .venv/bin/python bench/attention.py [--iters N]

Prints one JSON object:
- "step": forward + backward of one causal grouped-query attention call
  ([8, 8, L, 64] queries on 4 kv heads), milliseconds per call, median of the
  rounds, the modes taking turns (the machine is shared: read the ratios);
- "decode": programs each new key length adds in eager decoding (a KV
  cache grown by cat, one query token attending to it), per mode.
"""
import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import torch_pjrt  # noqa: E402


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def inputs(length, device):
    g = torch.Generator().manual_seed(0)
    shapes = [(8, 8, length, 64), (8, 4, length, 64), (8, 4, length, 64)]
    return [torch.randn(*s, generator=g).to(device).requires_grad_() for s in shapes]


def step_fn(fn, ins, sync):
    def run():
        out = fn(*ins)
        out.backward(torch.ones_like(out))
        for t in ins:
            t.grad = None
        sync()
    return run


def time_steps(modes, iters, rounds=7):
    """{mode: median ms per call}; each round runs every mode `iters` times in turn."""
    for run, ctx in modes.values():
        with ctx():
            for _ in range(3):
                run()
    times = {name: [] for name in modes}
    for _ in range(rounds):
        for name, (run, ctx) in modes.items():
            with ctx():
                t0 = time.perf_counter()
                for _ in range(iters):
                    run()
                times[name].append((time.perf_counter() - t0) / iters * 1e3)
    return {name: round(statistics.median(ts), 3) for name, ts in times.items()}


def decode_programs(ctx, steps=6):
    """Programs added per new key length in an eager decode loop (after a warm-up step)."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, 4, 8, 64, generator=g).to("tpu")
    v = torch.randn(1, 4, 8, 64, generator=g).to("tpu")
    added = []
    with ctx(), torch.no_grad():
        for i in range(steps + 1):
            before = torch_pjrt.metrics()["cached_programs"]
            q = torch.randn(1, 8, 1, 64, generator=g).to("tpu")
            k = torch.cat([k, torch.randn(1, 4, 1, 64, generator=g).to("tpu")], dim=2)
            v = torch.cat([v, torch.randn(1, 4, 1, 64, generator=g).to("tpu")], dim=2)
            attention(q, k, v).sum().item()
            if i:
                added.append(torch_pjrt.metrics()["cached_programs"] - before)
    return statistics.median(added)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    default, math = contextlib.nullcontext, lambda: sdpa_kernel(SDPBackend.MATH)
    result = {"benchmark": "attention", "device": torch.tpu.get_device_name(), "torch": torch.__version__,
              "step": {}}
    for length in (128, 512):
        tpu_ins, cpu_ins = inputs(length, "tpu"), inputs(length, "cpu")
        inductor = torch.compile(attention)
        modes = {
            "tpu_fused": (step_fn(attention, tpu_ins, torch.tpu.synchronize), default),
            "tpu_math": (step_fn(attention, tpu_ins, torch.tpu.synchronize), math),
            "cpu_eager": (step_fn(attention, cpu_ins, lambda: None), default),
            "cpu_inductor": (step_fn(inductor, cpu_ins, lambda: None), default),
        }
        ms = time_steps(modes, args.iters)
        ms["ratios"] = {
            "tpu_math_over_tpu_fused": round(ms["tpu_math"] / ms["tpu_fused"], 3),
            "tpu_fused_over_cpu_eager": round(ms["tpu_fused"] / ms["cpu_eager"], 3),
            "tpu_fused_over_inductor": round(ms["tpu_fused"] / ms["cpu_inductor"], 3),
        }
        result["step"][f"L{length}_ms"] = ms
    result["decode"] = {"programs_per_new_length_fused": decode_programs(default),
                        "programs_per_new_length_math": decode_programs(math)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
