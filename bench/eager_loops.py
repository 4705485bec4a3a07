"""Eager Python loops over positions on "tpu" against PyTorch CPU eager, in
one run (issue 44).

    .venv/bin/python bench/eager_loops.py [--steps 256] [--rounds 5]

Three loops of `steps` steps each:
- "kv_cache": a static KV cache [steps + window, 8, 64]; step t writes the
  new key at position t and reads the window [t, t + window) (summed);
- "row_update": x[i] = x[i] * 0.5 + 1 over the rows of a [steps, 256] matrix;
- "roll": torch.roll(x, i, 0) of a [steps, 256] matrix.

Prints one JSON object: per loop, the programs the first (cold) loop built
and compiled on "tpu" (the target: one per op shape, not one per step), and
milliseconds per step on each device, the median of the rounds, the devices
taking turns (the machine is shared: read the ratio).
"""
import argparse
import datetime
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt import _C  # noqa: E402

WINDOW = 16


def kv_cache(device, steps):
    cache = torch.zeros(steps + WINDOW, 8, 64, device=device)
    k = torch.randn(8, 64).to(device)

    def run():
        for t in range(steps):
            cache[t] = k
            cache[t:t + WINDOW].sum(0)
    return run, 2  # ops per step that compile: the write, the window's sum


def row_update(device, steps):
    x = torch.randn(steps, 256).to(device)

    def run():
        for i in range(steps):
            x[i] = x[i] * 0.5 + 1
    return run, 3  # mul, add, the copy into the row


def roll(device, steps):
    x = torch.randn(steps, 256).to(device)

    def run():
        for i in range(steps):
            torch.roll(x, i, 0)
    return run, 1


LOOPS = {"kv_cache": kv_cache, "row_update": row_update, "roll": roll}


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    result = {"date": datetime.date.today().isoformat(), "steps": a.steps, "rounds": a.rounds,
              "device": "tpu (XLA CPU PJRT plugin)", "loops": {}}
    for name, make in LOOPS.items():
        runs = {d: make(d, a.steps) for d in ("cpu", "tpu")}
        s0 = _C.stats()
        runs["tpu"][0]()  # the cold loop: everything it compiles
        sync("tpu")
        s1 = _C.stats()
        runs["cpu"][0]()
        times = {"cpu": [], "tpu": []}
        for _ in range(a.rounds):
            for d in ("cpu", "tpu"):
                t0 = time.perf_counter()
                runs[d][0]()
                sync(d)
                times[d].append((time.perf_counter() - t0) * 1e3 / a.steps)
        cpu, tpu = statistics.median(times["cpu"]), statistics.median(times["tpu"])
        result["loops"][name] = {
            "programs_built_cold_loop": s1["cache_misses"] - s0["cache_misses"],
            "xla_compiles_cold_loop": s1["compiles"] - s0["compiles"],
            "op_shapes_per_step": runs["tpu"][1],
            "cpu_ms_per_step": round(cpu, 4),
            "tpu_ms_per_step": round(tpu, 4),
            "tpu_over_cpu": round(tpu / cpu, 2),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
