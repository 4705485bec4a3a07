"""Single convolutions on "tpu" against PyTorch CPU (oneDNN) and Inductor, in
one run (issue 42; the model training steps the issue also asks for are not
written yet).

    .venv/bin/python bench/conv.py [--rounds 5]

Four convolutions (float32, batch 8): 3x3 64->64 at 56x56, 1x1 256->64 at
56x56, 7x7 stride 2 3->64 at 224x224, depthwise 3x3 of 128 channels at 56x56;
each forward (no grad) and forward + backward (input and weight gradients),
as CPU eager, CPU Inductor, "tpu" eager and "tpu" compiled.  Prints one JSON
object: milliseconds, the median of the rounds (the modes take turns: the
machine is shared, read the ratios), and tpu / CPU-eager ratios.
"""
import argparse
import datetime
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: F401,E402

CONVS = {
    "3x3_64_64_56": ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    "1x1_256_64_56": ((8, 256, 56, 56), (64, 256, 1, 1), {}),
    "7x7_s2_3_64_224": ((8, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
    "depthwise_3x3_128_56": ((8, 128, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=128)),
}


def make(xs, ws, kw, device, compiled, backward):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*xs, generator=g).to(device).requires_grad_(backward)
    w = torch.randn(*ws, generator=g).to(device).requires_grad_(backward)

    def fwd(a, b):
        return F.conv2d(a, b, **kw)
    f = torch.compile(fwd, backend="tpu" if device == "tpu" else "inductor") if compiled else fwd

    def run():
        if backward:
            x.grad = w.grad = None
            f(x, w).sum().backward()
            out = x.grad
        else:
            with torch.no_grad():
                out = f(x, w)
        if device == "tpu":
            torch.tpu.synchronize()
        return out
    return run


MODES = {"cpu_eager": ("cpu", False), "cpu_inductor": ("cpu", True), "tpu_eager": ("tpu", False),
         "tpu_compiled": ("tpu", True)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    out = {"date": datetime.date.today().isoformat(), "rounds": a.rounds, "unit": "ms", "convs": {}}
    torch._dynamo.config.cache_size_limit = 64  # one function, compiled per case and mode
    for name, (xs, ws, kw) in CONVS.items():
        for backward in (False, True):
            torch._dynamo.reset()
            runs = {m: make(xs, ws, kw, d, c, backward) for m, (d, c) in MODES.items()}
            for r in runs.values():
                r()  # compiles
            times = {m: [] for m in runs}
            for _ in range(a.rounds):
                for m, r in runs.items():
                    t0 = time.perf_counter()
                    r()
                    times[m].append((time.perf_counter() - t0) * 1e3)
            med = {m: round(statistics.median(v), 2) for m, v in times.items()}
            med["tpu_eager_over_cpu"] = round(med["tpu_eager"] / med["cpu_eager"], 2)
            med["tpu_compiled_over_cpu"] = round(med["tpu_compiled"] / med["cpu_eager"], 2)
            out["convs"][name + ("_fwd_bwd" if backward else "_fwd")] = med
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
