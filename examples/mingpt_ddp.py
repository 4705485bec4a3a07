"""Train minGPT with DistributedDataParallel on "tpu", one process per device,
then check the losses against one CPU process training on the whole batch.

    .venv/bin/torchrun --nproc_per_node=2 examples/mingpt_ddp.py --steps 20

Each rank trains on its slice of the same global batch, so the ranks' mean
loss is the whole batch's loss and DDP's averaged gradients are its
gradients: rank 0 then trains the same steps on the CPU, in one process, and
compares.  The script is written as for CUDA: LOCAL_RANK picks the device,
init_process_group() picks the accelerator's backend ("tpu").
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from mingpt import GPT, GPTConfig, dataset, get_batch, train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16, help="global batch, split across the ranks")
    ap.add_argument("--compile", action="store_true", help="torch.compile(backend='tpu') the model, then DDP")
    args = ap.parse_args()

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of the {world} ranks")
    torch.tpu.set_device(local_rank)
    device = torch.device("tpu", local_rank)

    cfg = GPTConfig()
    data, cfg.vocab_size = dataset(cfg.block_size)
    torch.manual_seed(1337)  # the seed and order of train() in mingpt.py
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ddp = DDP(torch.compile(model, backend="tpu") if args.compile else model, device_ids=[local_rank])
    gen = torch.Generator().manual_seed(1337)
    shard = args.batch_size // world
    losses = []
    for step in range(args.steps):
        x, y = get_batch(data, cfg.block_size, args.batch_size, gen)
        x, y = x[rank * shard : (rank + 1) * shard].to(device), y[rank * shard : (rank + 1) * shard].to(device)
        _, loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"  step {step:4d}  loss {losses[-1]:.4f}", flush=True)

    status = 0
    if rank == 0:
        cpu = train("cpu", args.steps, GPTConfig(), batch_size=args.batch_size)
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, cpu))
        ok = worst <= 1e-4
        print(f"{world} ranks on tpu vs 1 process on cpu: largest relative loss difference {worst:.2e} "
              f"({'OK' if ok else 'MISMATCH'}, tolerance 1e-4)")
        status = 0 if ok else 1
    dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
