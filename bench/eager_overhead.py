"""Eager dispatch overhead: microseconds per small op on "tpu" (warm program
cache) next to PyTorch CPU eager and CPU Inductor, measured in the same run.

    .venv/bin/python bench/eager_overhead.py [--iters N] [--no-inductor]

Prints one JSON object.  The machine is shared and noisy: read the ratios,
and tpu_thread_cpu_us (the dispatching thread's CPU time per op), rather than
the absolute wall times.  Target (issue 2): a warm small op on tpu <= 25 us.
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: E402


def per_op_us(fn, args, iters, sync):
    """(wall us, calling-thread CPU us) per op, best of 5 rounds (the least
    disturbed by other load).  The CPU time of the thread that dispatches is
    what the op costs the Python program, and it hardly moves when other
    processes compete for the cores; wall time includes waiting for them."""
    for _ in range(20):
        fn(*args)
    sync()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            fn(*args)
        sync()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
        best_cpu = min(best_cpu, (time.thread_time() - c0) / iters * 1e6)
    return best, best_cpu


CASES = {
    "add_64x64": (lambda a, b: a + b, lambda: (torch.randn(64, 64), torch.randn(64, 64))),
    "matmul_64x64": (lambda a, b: a @ b, lambda: (torch.randn(64, 64), torch.randn(64, 64))),
    "layer_norm_32x64": (lambda x, w, b: F.layer_norm(x, (64,), w, b),
                         lambda: (torch.randn(32, 64), torch.randn(64), torch.randn(64))),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args()
    results = {}
    # Eager first, for every case: importing and running Inductor leaves
    # threads and a larger Python heap behind that slow every later call.
    for name, (fn, make) in CASES.items():
        cpu_args = make()
        tpu_args = tuple(a.to("tpu") for a in cpu_args)
        r = results[name] = {}
        r["tpu_us"], r["tpu_thread_cpu_us"] = per_op_us(fn, tpu_args, args.iters, torch.tpu.synchronize)
        r["cpu_eager_us"], _ = per_op_us(fn, cpu_args, args.iters, lambda: None)
        r["tpu_over_cpu_eager"] = r["tpu_us"] / r["cpu_eager_us"]
    if not args.no_inductor:
        for name, (fn, make) in CASES.items():
            compiled = torch.compile(fn, backend="inductor")
            results[name]["cpu_inductor_us"], _ = per_op_us(compiled, make(), args.iters, lambda: None)
    results = {name: {k: round(v, 3) for k, v in r.items()} for name, r in results.items()}
    out = {
        "benchmark": "eager_overhead",
        "device": torch.tpu.get_device_name(),
        "torch": torch.__version__,
        "target_tpu_us": 25,
        "results": results,
        "metrics": {k: v for k, v in torch_pjrt.metrics().items() if k != "cpu_fallbacks"},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
