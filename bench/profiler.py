"""What torch.profiler costs on "tpu" (issue 41): eager loops without a
profiler, under a CPU-only profile and under a profile with device events,
beside PyTorch CPU eager, in one run.

    .venv/bin/python bench/profiler.py [--rounds 5]

Two loops: 200 in-place adds on a 64-element tensor (dispatch-bound: the
per-op cost is what a profiler adds to) and 20 steps of a small MLP's
training (forward, backward, AdamW).  Each is timed as the median of the
rounds, in ms per loop; ratios are against the same loop on "tpu" without a
profiler.  Prints one JSON object.
"""
import argparse
import datetime
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_pjrt  # noqa: F401,E402


def adds(device):
    x = torch.zeros(64, device=device)

    def run():
        for _ in range(200):
            x.add_(1.0)
        x.sum().item()
    return run


def mlp(device):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def run():
        for _ in range(20):
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        loss.item()
    return run


def timed(fn, rounds, activities=None):
    fn()  # warm-up: compiles, caches
    ts = []
    for _ in range(rounds):
        if activities is None:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        else:
            with profile(activities=activities):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    out = {"date": datetime.date.today().isoformat(), "rounds": args.rounds, "ms_per_loop": {}}
    cpu_only = [ProfilerActivity.CPU]
    both = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    for name, make in (("add_200x", adds), ("mlp_train_20_steps", mlp)):
        cpu = timed(make("cpu"), args.rounds)
        run = make("tpu")
        off = timed(run, args.rounds)
        r = {"cpu_eager": round(cpu, 2), "tpu_no_profiler": round(off, 2),
             "tpu_profile_cpu_only": round(timed(run, args.rounds, cpu_only), 2),
             "tpu_profile_with_device": round(timed(run, args.rounds, both), 2)}
        r["profile_with_device_over_no_profiler"] = round(r["tpu_profile_with_device"] / off, 2)
        r["profile_cpu_only_over_no_profiler"] = round(r["tpu_profile_cpu_only"] / off, 2)
        r["tpu_no_profiler_over_cpu_eager"] = round(off / cpu, 2)
        out["ms_per_loop"][name] = r
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
