"""torch.distributed on "tpu" (the Gloo relay, csrc/glue/dist.cpp) against
Gloo on CPU tensors, in the same two-rank group of this run.

    .venv/bin/python bench/distributed.py [--iters N]

Prints one JSON object (rank 0's times; milliseconds, median of the rounds,
the modes taking turns, since the machine is shared: read the ratios):
- "all_reduce": one all_reduce of a float32 tensor per size, tpu and CPU;
- "ddp_step": a DDP training step of minGPT (examples/mingpt.py, batch 16
  split across the ranks, AdamW): tpu eager and compiled, CPU eager and
  Inductor (the module compiled, then wrapped in DDP).
Both ranks share this machine's cores, so the step times are those of two
training processes at once; PyTorch's CPU ops run on one thread per rank, as
under torchrun (OMP_NUM_THREADS=1).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_pjrt  # noqa: E402

WORLD = 2
SIZES = {"4 KiB": 1 << 10, "1 MiB": 1 << 18, "16 MiB": 1 << 22}


def median_ms(modes, iters, rounds=7):
    """{mode: median ms per call}; every round runs each mode `iters` times in turn."""
    for run in modes.values():
        for _ in range(2):
            run()
    times = {name: [] for name in modes}
    for _ in range(rounds):
        for name, run in modes.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            times[name].append((time.perf_counter() - t0) * 1e3 / iters)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def all_reduce_modes(device):
    modes = {}
    for label, n in SIZES.items():
        for where in ("tpu", "cpu"):
            x = torch.ones(n, device=device if where == "tpu" else "cpu")

            def run(x=x, where=where):
                dist.all_reduce(x)
                if where == "tpu":
                    torch.tpu.synchronize()
            modes[(label, where)] = run
    return modes


def ddp_modes(rank, device):
    from mingpt import GPT, GPTConfig, dataset, get_batch

    cfg = GPTConfig()
    data, cfg.vocab_size = dataset(cfg.block_size)
    gen = torch.Generator().manual_seed(0)
    x, y = get_batch(data, cfg.block_size, 16, gen)
    x, y = x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]
    modes = {}
    for where, dev, backend in (("tpu_eager", device, None), ("tpu_compiled", device, "tpu"),
                                ("cpu_eager", torch.device("cpu"), None),
                                ("cpu_inductor", torch.device("cpu"), "inductor")):
        torch.manual_seed(0)
        module = GPT(cfg).to(dev)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        # Compiled: the module compiled, then wrapped (torch.compile(DDP(m))
        # compiles no graph in torch 2.13; docs/architecture.md).
        model = DDP(torch.compile(module, backend=backend) if backend else module,
                    device_ids=[dev.index] if dev.type == "tpu" else None)
        xd, yd = x.to(dev), y.to(dev)

        def step(model=model, opt=opt, xd=xd, yd=yd):
            _, loss = model(xd, yd)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
        modes[where] = step
    return modes


def worker(rank, store, out, iters):
    dist.init_process_group("cpu:gloo,tpu:tpu", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    device = torch.device("tpu", rank)
    torch.tpu.set_device(rank)
    # As torchrun sets OMP_NUM_THREADS=1 for several processes per machine:
    # the CPU modes' ranks do not fight over the cores.
    torch.set_num_threads(1)
    ar = median_ms(all_reduce_modes(device), iters)
    step = median_ms(ddp_modes(rank, device), max(1, iters // 4))
    if rank == 0:
        result = {
            "benchmark": "distributed",
            "device": torch.tpu.get_device_name(),
            "torch": torch.__version__,
            "ranks": WORLD,
            "all_reduce_ms": {label: {"tpu": ar[(label, "tpu")], "cpu_gloo": ar[(label, "cpu")],
                                      "tpu_over_cpu": round(ar[(label, "tpu")] / ar[(label, "cpu")], 3)}
                              for label in SIZES},
            "ddp_step_ms": {"mingpt": {**step,
                                       "tpu_eager_over_cpu_eager": round(step["tpu_eager"] / step["cpu_eager"], 3),
                                       "tpu_compiled_over_inductor":
                                           round(step["tpu_compiled"] / step["cpu_inductor"], 3)}},
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    # One process per rank, each with tpu:<rank> (as under torchrun).
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(WORLD))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        torch.multiprocessing.spawn(worker, args=(os.path.join(d, "store"), out, args.iters), nprocs=WORLD)
        with open(out) as f:
            print(json.dumps(json.load(f), indent=1))


if __name__ == "__main__":
    main()
