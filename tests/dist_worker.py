"""The ranks of tests/test_distributed.py: each scenario runs in every rank of
one process group and records, per rank, None (it passed) or what went wrong.
Scenarios compare with values worked out by hand or with training on the CPU
in one process over the whole batch."""
import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_pjrt  # registers the "tpu" device and its distributed backend

WORLD = 2
TOL = dict(rtol=1e-5, atol=1e-6)


def _eq(a, b, **tol):
    torch.testing.assert_close(a.cpu() if isinstance(a, torch.Tensor) else a, b, **(tol or TOL))


def collectives(rank, dev):
    w = WORLD
    x = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    _eq(x, torch.full((3,), 3.0))
    for op, want in ((dist.ReduceOp.AVG, 1.5), (dist.ReduceOp.MAX, 2.0), (dist.ReduceOp.MIN, 1.0),
                     (dist.ReduceOp.PRODUCT, 2.0)):
        y = torch.full((2, 2), float(rank + 1), device=dev)
        dist.all_reduce(y, op=op)
        _eq(y, torch.full((2, 2), want))
    i = torch.arange(4, device=dev, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(i)
    _eq(i, torch.arange(4) * 3)
    h = torch.full((2,), float(rank + 1), device=dev, dtype=torch.bfloat16)
    dist.all_reduce(h)
    _eq(h, torch.full((2,), 3.0, dtype=torch.bfloat16))
    # A view: the result lands in the viewed storage.
    base = torch.zeros(2, 4, device=dev)
    v = base[:, 1]
    v.fill_(rank + 1.0)
    dist.all_reduce(v)
    _eq(base, torch.tensor([[0.0, 3, 0, 0], [0, 3, 0, 0]]))
    # A parameter (a leaf that requires grad), outside no_grad, as Gloo takes it.
    p = torch.nn.Parameter(torch.full((2,), float(rank + 1), device=dev))
    dist.all_reduce(p, op=dist.ReduceOp.AVG)
    dist.broadcast(p, src=0)
    _eq(p.detach(), torch.full((2,), 1.5))
    assert p.requires_grad and p.grad_fn is None
    c = torch.full((2,), float(rank))  # a CPU tensor in the same group
    dist.all_reduce(c)
    _eq(c, torch.full((2,), 1.0))

    b = torch.arange(5.0, device=dev) if rank == 1 else torch.zeros(5, device=dev)
    dist.broadcast(b, src=1)
    _eq(b, torch.arange(5.0))

    g = [torch.empty(2, device=dev) for _ in range(w)]
    dist.all_gather(g, torch.full((2,), float(rank), device=dev))
    for r in range(w):
        _eq(g[r], torch.full((2,), float(r)))
    out = torch.empty(w * 3, device=dev)
    dist.all_gather_into_tensor(out, torch.arange(3.0, device=dev) + 10 * rank)
    _eq(out, torch.tensor([0.0, 1, 2, 10, 11, 12]))

    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(4.0, device=dev) * (rank + 1))
    _eq(rs, torch.arange(4.0).view(w, 2)[rank] * 3)
    rs_avg = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs_avg, torch.arange(4.0, device=dev) * (rank + 1), op=dist.ReduceOp.AVG)
    _eq(rs_avg, torch.arange(4.0).view(w, 2)[rank] * 1.5)

    rsl = torch.empty(2, device=dev)
    dist.reduce_scatter(rsl, [torch.full((2,), float(r + rank), device=dev) for r in range(w)])
    _eq(rsl, torch.full((2,), float(2 * rank + 1)))  # sum over ranks q of (rank + q)
    a2l = [torch.empty(1, device=dev) for _ in range(w)]
    dist.all_to_all(a2l, [torch.tensor([10.0 * rank + r], device=dev) for r in range(w)])
    _eq(torch.cat(a2l), torch.tensor([10.0 * q + rank for q in range(w)]))
    # Coalesced all-gathers (all_gather_into_tensor_coalesced):
    outs = [torch.empty(2, device=dev) for _ in range(2)]
    with dist._coalescing_manager(async_ops=False):
        for i in range(2):
            dist.all_gather_into_tensor(outs[i], torch.full((1,), float(rank + 10 * i), device=dev))
    _eq(torch.stack(outs), torch.tensor([[0.0, 1], [10, 11]]))

    red = torch.full((2,), float(rank + 1), device=dev)
    dist.reduce(red, dst=0)
    if rank == 0:
        _eq(red, torch.full((2,), 3.0))

    gl = [torch.empty(2, device=dev) for _ in range(w)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank + 5), device=dev), gl, dst=0)
    if rank == 0:
        _eq(torch.stack(gl), torch.tensor([[5.0, 5], [6, 6]]))

    sc = torch.empty(2, device=dev)
    dist.scatter(sc, [torch.full((2,), float(r + 7), device=dev) for r in range(w)] if rank == 0 else None, src=0)
    _eq(sc, torch.full((2,), float(rank + 7)))

    a2a = torch.empty(4, device=dev)
    dist.all_to_all_single(a2a, torch.arange(4.0, device=dev) + 10 * rank)
    want = torch.tensor([[0.0, 1, 10, 11], [2, 3, 12, 13]])[rank]
    _eq(a2a, want)

    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0], device=dev), dst=1)
        dist.send(torch.tensor([9.0], device=dev), dst=1)
    else:
        t = torch.zeros(2, device=dev)
        dist.recv(t, src=0)
        _eq(t, torch.tensor([7.0, 8.0]))
        t = torch.zeros(1, device=dev)
        assert dist.recv(t) == 0  # from any source: returns the sender
        _eq(t, torch.tensor([9.0]))

    # Both ends send first (isend), then receive: must not deadlock.
    nxt, prv = (rank + 1) % w, (rank - 1) % w
    for where in (dev, "cpu"):
        out, got = torch.arange(3.0, device=where) + 10 * rank, torch.zeros(3, device=where)
        req = dist.isend(out, dst=nxt)
        dist.recv(got, src=prv)
        req.wait()
        _eq(got, torch.arange(3.0) + 10 * prv)
    got = torch.zeros(3, device=dev)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), rank + 0.5, device=dev), nxt),
                                        dist.P2POp(dist.irecv, got, prv)]):
        work.wait()
    _eq(got, torch.full((3,), prv + 0.5))

    objs = [{"rank": rank}]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [{"rank": 1}], objs
    dist.barrier()

    try:
        dist.all_reduce(torch.ones(2, device=dev, dtype=torch.int64), op=dist.ReduceOp.AVG)
    except Exception as e:  # noqa: BLE001
        assert "ReduceOp.AVG" in str(e) and "floating" in str(e), str(e)
    else:
        raise AssertionError("AVG of int64 tensors did not raise")


def _data():
    torch.manual_seed(1)
    return torch.randn(8, 8), torch.randn(8, 4)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _train(model, x, y, steps=3, mean_over_ranks=False):
    """AdamW steps on (x, y); the losses, averaged over the ranks if asked."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        loss = loss.detach().clone()
        if mean_over_ranks:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def _cpu_reference(steps=3):
    m = _mlp()
    losses = _train(m, *_data(), steps)
    return m.state_dict(), losses


def _train_shard(model, rank, dev, steps=3):
    """Each rank trains on its half of the batch; the mean of the halves'
    losses is the whole batch's loss."""
    X, Y = _data()
    return _train(model, X.chunk(WORLD)[rank].to(dev), Y.chunk(WORLD)[rank].to(dev), steps, mean_over_ranks=True)


def _check_against_cpu(state, losses):
    ref_state, ref_losses = _cpu_reference(len(losses))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")


def ddp(rank, dev):
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = _mlp()
    if rank == 1:  # DDP broadcasts rank 0's parameters at construction
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
    m = DDP(m.to(dev), device_ids=[dev.index])
    losses = _train_shard(m, rank, dev)
    _check_against_cpu({k.removeprefix("module."): v.cpu() for k, v in m.state_dict().items()}, losses)


def ddp_options(rank, dev):
    """DDP's options that take other paths through its reducer: the used-
    parameter map (find_unused_parameters, static_graph: staged through
    pinned memory), gradients as bucket views, tiny buckets, a compression
    hook, and no_sync() accumulation."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    for kw in (dict(find_unused_parameters=True), dict(static_graph=True), dict(gradient_as_bucket_view=True),
               dict(bucket_cap_mb=1e-4)):
        m = DDP(_mlp().to(dev), device_ids=[dev.index], **kw)
        losses = _train_shard(m, rank, dev)
        _check_against_cpu({k.removeprefix("module."): v.cpu() for k, v in m.state_dict().items()}, losses)
    m = DDP(_mlp().to(dev), device_ids=[dev.index])
    m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    torch.testing.assert_close(torch.tensor(_train_shard(m, rank, dev)), torch.tensor(_cpu_reference()[1]), rtol=1e-3,
                               atol=1e-4)
    # no_sync: each rank accumulates two microbatches, the second one reduced.
    m = DDP(_mlp().to(dev), device_ids=[dev.index])
    X, Y = _data()
    xs, ys = X.chunk(WORLD)[rank].to(dev), Y.chunk(WORLD)[rank].to(dev)
    with m.no_sync():
        F.mse_loss(m(xs[:2]), ys[:2]).backward()
    F.mse_loss(m(xs[2:]), ys[2:]).backward()
    ref = _mlp()
    (sum(F.mse_loss(ref(a), b) for a, b in zip(X.chunk(4), Y.chunk(4))) / WORLD).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        _eq(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def ddp_compiled(rank, dev):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The module compiled, then wrapped: torch.compile of the DDP wrapper
    # itself compiles no graph in torch 2.13, on the CPU with Gloo as here
    # (Dynamo skips DDP's forward).
    inner = _mlp().to(dev)
    m = DDP(torch.compile(inner, backend="tpu"), device_ids=[dev.index])
    before = torch_pjrt.metrics()["graphs_lowered"]
    losses = _train_shard(m, rank, dev)
    assert torch_pjrt.metrics()["graphs_lowered"] > before, "no graph was compiled"
    _check_against_cpu({k: v.cpu() for k, v in inner.state_dict().items()}, losses)


def fsdp2(rank, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("tpu", (WORLD,))
    m = _mlp().to(dev)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    losses = _train_shard(m, rank, dev)
    assert m[0].weight.to_local().shape == (8, 8), m[0].weight.to_local().shape  # sharded by rows
    _check_against_cpu({k: v.full_tensor().cpu() for k, v in m.state_dict().items()}, losses)


def fsdp2_checkpoint(rank, dev):
    """clip_grad_norm_ over sharded gradients, and a distributed checkpoint
    (torch.distributed.checkpoint) of the sharded model and optimizer saved
    and loaded back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("tpu", (WORLD,))
    m = fully_shard(_mlp().to(dev), mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    X, Y = _data()
    F.mse_loss(m(X.chunk(WORLD)[rank].to(dev)), Y.chunk(WORLD)[rank].to(dev)).backward()
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1).full_tensor()
    ref = _mlp()
    F.mse_loss(ref(X), Y).backward()
    _eq(norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1))
    opt.step()
    saved = {k: v.full_tensor().cpu() for k, v in m.state_dict().items()}
    msd, osd = get_state_dict(m, opt)
    path = os.path.join(_OUT_DIR, "checkpoint")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    msd, osd = get_state_dict(m, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)
    set_state_dict(m, opt, model_state_dict=msd, optim_state_dict=osd)
    for k, v in m.state_dict().items():
        assert torch.equal(v.full_tensor().cpu(), saved[k]), k


def tensor_parallel(rank, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (WORLD,))
    m = parallelize_module(_mlp().to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    X, Y = _data()
    losses = _train(m, X.to(dev), Y.to(dev))  # every rank sees the whole batch; the layers are split
    assert m[0].weight.to_local().shape == (8, 8), m[0].weight.to_local().shape
    _check_against_cpu({k: v.full_tensor().cpu() for k, v in m.state_dict().items()}, losses)


def dtensor_ops(rank, dev):
    """DTensor on a tpu mesh: sharded products (one needs a Partial sum),
    reductions and softmax across the sharded dimension, a redistribution."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("tpu", (WORLD,))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    rows, rep = distribute_tensor(a.to(dev), mesh, [Shard(0)]), distribute_tensor(b.to(dev), mesh, [Replicate()])
    cols, brows = distribute_tensor(a.to(dev), mesh, [Shard(1)]), distribute_tensor(b.to(dev), mesh, [Shard(0)])
    _eq((rows @ rep).full_tensor(), a @ b)
    _eq((cols @ brows).full_tensor(), a @ b, rtol=1e-5, atol=1e-5)  # partial sums all-reduced
    _eq(rows.sum().full_tensor(), a.sum(), rtol=1e-5, atol=1e-5)
    _eq(rows.mean(0).full_tensor(), a.mean(0))
    _eq(rows.softmax(0).full_tensor(), a.softmax(0))
    _eq(rows.redistribute(mesh, [Shard(1)]).to_local(), a.chunk(WORLD, 1)[rank])


def compiled_tensor_parallel(rank, dev):
    """A tensor-parallel model through torch.compile: its graphs carry
    DTensor's opaque mesh objects and functional collectives; the parts
    between the collectives run as programs."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (WORLD,))
    m = parallelize_module(_mlp().to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    X, Y = _data()
    before = torch_pjrt.metrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = _train(torch.compile(m, backend="tpu"), X.to(dev), Y.to(dev))
    after = torch_pjrt.metrics()
    assert after["graphs_lowered"] + after["graphs_split"] > before["graphs_lowered"] + before["graphs_split"]
    assert after["graphs_eager"] == before["graphs_eager"], "a graph ran op by op"
    noisy = [str(w.message) for w in caught if "torch-pjrt" in str(w.message)]
    assert not noisy, noisy
    _check_against_cpu({k: v.full_tensor().cpu() for k, v in m.state_dict().items()}, losses)


def compiled_collectives(rank, dev):
    """Collectives in a compiled function run between its programs."""
    import warnings

    import torch.distributed._functional_collectives as fc

    @torch.compile(backend="tpu")
    def f(x):
        y = x * 2
        dist.all_reduce(y)
        return fc.all_gather_tensor(y + 1, 0, dist.group.WORLD) * 3

    before = torch_pjrt.metrics()["graphs_split"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(torch.full((2,), float(rank + 1), device=dev))
    _eq(out, torch.full((4,), 21.0))  # ((1 + 2) * 2 + 1) * 3 on every rank
    assert torch_pjrt.metrics()["graphs_split"] > before, "the graph was not split around the collectives"
    noisy = [str(w.message) for w in caught if "torch-pjrt" in str(w.message)]
    assert not noisy, noisy


def pipeline(rank, dev):
    """Two pipeline stages (torch.distributed.pipelining, GPipe over two
    microbatches): the MLP's first layers on rank 0, its last on rank 1;
    the loss of each microbatch and every gradient against the CPU."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    full = _mlp()
    part = (full[:2] if rank == 0 else full[2:]).to(dev)
    schedule = ScheduleGPipe(PipelineStage(part, rank, WORLD, dev), n_microbatches=2, loss_fn=F.mse_loss)
    X, Y = _data()
    ref = _mlp()
    ref_losses = [F.mse_loss(ref(x), y) for x, y in zip(X.chunk(2), Y.chunk(2))]
    (sum(ref_losses) / 2).backward()  # the schedule averages the microbatches' gradients
    if rank == 0:
        schedule.step(X.to(dev))
    else:
        losses = []
        out = schedule.step(target=Y.to(dev), losses=losses)
        _eq(out, ref(X).detach())
        _eq(torch.stack(losses), torch.stack(ref_losses).detach())
    for p, q in zip(part.parameters(), (ref[:2] if rank == 0 else ref[2:]).parameters()):
        _eq(p.grad, q.grad)


SCENARIOS = {f.__name__: f for f in (collectives, compiled_collectives, ddp, ddp_options, ddp_compiled, fsdp2,
                                      fsdp2_checkpoint, tensor_parallel, compiled_tensor_parallel, dtensor_ops,
                                      pipeline)}


_OUT_DIR = None  # the run's temporary directory (scenarios write files there)


def run(rank, init_file, out_dir, backend="tpu", names=None):
    """Run the scenarios `names` (default: all) in a group made with
    init_process_group(backend) (None: no backend named, as under torchrun)."""
    global _OUT_DIR
    _OUT_DIR = out_dir
    # A scenario that fails in one rank leaves the other waiting in a
    # collective: Gloo's timeout ends it.
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    assert dist.get_backend() == (backend or "undefined"), dist.get_backend()
    torch.tpu.set_device(rank)
    dev = torch.device("tpu", rank)
    results = {}
    for name in names or SCENARIOS:
        try:
            SCENARIOS[name](rank, dev)
            results[name] = None
        except Exception:  # noqa: BLE001
            results[name] = traceback.format_exc()
        dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
