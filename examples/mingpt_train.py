"""Train minGPT on "tpu" for 200 steps, then the same steps on CPU, and compare.

    make demo            (or: .venv/bin/python examples/mingpt_train.py --steps 200)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from mingpt import GPTConfig, train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    cfg = GPTConfig()
    print(f"device: tpu -> {torch.tpu.get_device_name()}")
    print(f"model: minGPT {cfg.n_layer} layers, {cfg.n_head} heads, d={cfg.n_embd}, block={cfg.block_size}")

    def log(step, loss):
        if step % 20 == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  loss {loss:.4f}", flush=True)

    print(f"training on tpu for {args.steps} steps")
    t0 = time.perf_counter()
    tpu_losses = train("tpu", args.steps, GPTConfig(), batch_size=args.batch_size, log=log)
    torch.tpu.synchronize()
    dt = time.perf_counter() - t0
    tokens = args.steps * args.batch_size * cfg.block_size
    print(f"tpu: {tokens / dt:,.0f} tokens/s ({dt:.1f} s, including compiling each op once)")

    print(f"training on cpu for {args.steps} steps (same seed, same batches)")
    t0 = time.perf_counter()
    cpu_losses = train("cpu", args.steps, GPTConfig(), batch_size=args.batch_size)
    dt = time.perf_counter() - t0
    print(f"cpu: {tokens / dt:,.0f} tokens/s ({dt:.1f} s)")

    print(f"training on tpu with torch.compile(backend='tpu') for {args.steps} steps")
    t0 = time.perf_counter()
    compiled_losses = train("tpu", args.steps, GPTConfig(), batch_size=args.batch_size, compile=True)
    torch.tpu.synchronize()
    dt = time.perf_counter() - t0
    print(f"tpu compiled: {tokens / dt:,.0f} tokens/s ({dt:.1f} s, including compiling)")

    diffs = [abs(a - b) for a, b in zip(tpu_losses, cpu_losses)]
    rel = max(d / abs(b) for d, b in zip(diffs, cpu_losses))
    i = max(range(len(diffs)), key=diffs.__getitem__)
    print(f"final loss: tpu {tpu_losses[-1]:.4f}  cpu {cpu_losses[-1]:.4f}")
    print(f"largest loss difference tpu vs cpu: {diffs[i]:.2e} at step {i} (largest relative {rel:.2e})")
    cdiff = max(abs(a - b) for a, b in zip(compiled_losses, cpu_losses))
    print(f"largest loss difference tpu compiled vs cpu: {cdiff:.2e}")
    m = torch_pjrt.metrics()
    print(f"programs compiled: {m['compiles']} ({m['compile_seconds']:.1f} s), executions: {m['executions']}, "
          f"cache hits: {m['cache_hits']}")


if __name__ == "__main__":
    main()
