"""The "tpu" device: torch.tpu API, transfers, factories, aliasing, several
devices, errors."""
import copy
import gc
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == int(os.environ["TORCH_PJRT_CPU_DEVICES"])
    assert torch.tpu.current_device() == 0
    name = torch.tpu.get_device_name()
    assert "cpu" in name and "xla_cpu_pjrt" in name  # says which plugin backs it
    torch.tpu.synchronize()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    props = torch.tpu.get_device_properties(0)  # attributes, as torch.cuda's
    assert props.name == name and props.total_memory == total and props.platform == "cpu"
    assert "xla_cpu_pjrt" in props.plugin and "total_memory=" in repr(props)
    t = torch.ones(1 << 18, device="tpu")
    summary = torch.tpu.memory_summary()
    assert "tpu:0" in summary and f"{torch.tpu.memory_allocated() / (1 << 20):,.1f} MiB" in summary
    del t


def test_set_device():
    torch.tpu.set_device(1)
    try:
        assert torch.tpu.current_device() == 1
        t = torch.empty(3, device="tpu")
        assert t.device == torch.device("tpu", 1)
    finally:
        torch.tpu.set_device(0)
    with pytest.raises(RuntimeError):
        torch.tpu.set_device(7)
    with torch.tpu.device_of(torch.ones(1, device="tpu:1")):
        assert torch.tpu.current_device() == 1
    with torch.tpu.device_of(torch.ones(1)):  # a CPU tensor leaves the device alone
        assert torch.tpu.current_device() == 0
    assert torch.tpu.current_device() == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip(dtype):
    x = (torch.randn(5, 7) * 50).to(dtype)
    t = x.to("tpu")
    assert t.device.type == "tpu" and t.dtype == dtype and t.shape == x.shape
    assert torch.equal(t.cpu(), x)


def test_save_and_load_checkpoints(tmp_path):
    """torch.save of tpu tensors keeps their device, views' shared storage and
    dtypes; torch.load restores to tpu, or where map_location says (also
    weights_only); a resumed model and optimizer continue as the CPU does."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(16, 4)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (cpu, tpu)]

    def train_steps(pairs):
        for m, opt, xx in pairs:
            opt.zero_grad()
            m(xx).square().mean().backward()
            opt.step()
    train_steps([(cpu, opts[0], x), (tpu, opts[1], x.to("tpu"))])
    base = torch.arange(12.0).view(3, 4).to("tpu")
    path = tmp_path / "ckpt.pt"
    torch.save({"model": tpu.state_dict(), "opt": opts[1].state_dict(), "base": base, "view": base[:, 1:3],
                "half": torch.randn(5, dtype=torch.bfloat16).to("tpu")}, path)
    for kwargs in ({}, {"weights_only": True}, {"map_location": "tpu:0"}):
        ck = torch.load(path, **kwargs)
        assert ck["view"].device.type == "tpu" and ck["opt"]["state"][0]["exp_avg"].device.type == "tpu"
        assert ck["view"].untyped_storage().data_ptr() == ck["base"].untyped_storage().data_ptr()
        ck["base"][0, 1] = -1.0  # a write through the base shows in the loaded view
        assert ck["view"].cpu()[0, 0].item() == -1.0 and ck["half"].dtype == torch.bfloat16
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["base"].device.type == "cpu" and torch.equal(on_cpu["view"], base[:, 1:3].cpu())
    for k, v in cpu.state_dict().items():
        assert torch.equal(on_cpu["model"][k], tpu.state_dict()[k].cpu())
        torch.testing.assert_close(on_cpu["model"][k], v, rtol=1e-5, atol=1e-6)
    # resume: a fresh tpu model and optimizer from the checkpoint take the next step as the CPU's
    resumed = copy.deepcopy(cpu).to("tpu")
    ropt = torch.optim.AdamW(resumed.parameters(), lr=0.1)
    ck = torch.load(path)
    resumed.load_state_dict(ck["model"])
    ropt.load_state_dict(ck["opt"])
    train_steps([(cpu, opts[0], x), (resumed, ropt, x.to("tpu"))])
    for p, q in zip(cpu.parameters(), resumed.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    # a CPU checkpoint loads straight onto the device
    torch.save(cpu.state_dict(), tmp_path / "cpu.pt")
    sd = torch.load(tmp_path / "cpu.pt", map_location="tpu", weights_only=True)
    assert all(v.device.type == "tpu" and torch.equal(v.cpu(), cpu.state_dict()[k]) for k, v in sd.items())


def test_module_to_keeps_parameter_objects():
    """As for CUDA, .to("tpu") swaps each parameter's data in place: tied
    weights stay one Parameter, an optimizer made before the move updates the
    model's parameters, and grads move along."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    cpu[1].weight = cpu[0].weight
    tpu = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tpu[1].weight = tpu[0].weight
    tpu.load_state_dict(cpu.state_dict())
    params = list(tpu.parameters())
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (cpu, tpu)]
    tpu.to("tpu")
    assert tpu[1].weight is tpu[0].weight is params[0] and len(list(tpu.parameters())) == 1
    assert params[0].device.type == "tpu"
    losses = []
    for m, opt, dev in [(cpu, opts[0], "cpu"), (tpu, opts[1], "tpu")]:
        x = torch.arange(10, device=dev)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(m(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert tpu[0].weight.grad.device.type == "tpu"
    tpu.cpu()
    assert tpu[0].weight is params[0] and params[0].device.type == "cpu" and params[0].grad.device.type == "cpu"
    torch.testing.assert_close(params[0], cpu[0].weight, rtol=1e-5, atol=1e-6)
    p = torch.nn.Parameter(torch.zeros(2))
    p.data = torch.ones(2, device="tpu")  # .data across devices, as with CUDA
    assert p.device.type == "tpu" and p.sum().item() == 2


def test_allocation_larger_than_the_device_raises_out_of_memory():
    """Buffers are made on first write, but a size that can never fit raises
    torch.OutOfMemoryError at the allocation, as CUDA's allocator does."""
    total = torch.tpu.mem_get_info()[1]
    with pytest.raises(torch.OutOfMemoryError, match=r"tpu out of memory\. Tried to allocate .* GiB"):
        torch.empty(total // 4 + 1024, dtype=torch.float32, device="tpu")
    assert torch.empty(1 << 20, device="tpu").fill_(2).sum().item() == 2 << 20


def test_round_trip_views():
    x = torch.randn(6, 8)
    t = x.to("tpu")
    for view in (lambda a: a.t(), lambda a: a[1:4, ::3], lambda a: a[:, 2], lambda a: a.view(8, 6)[2:],
                 lambda a: a.unsqueeze(0).expand(3, 6, 8), lambda a: a.as_strided((3, 3), (1, 2), 5)):
        assert torch.equal(view(t).cpu(), view(x))
    assert torch.equal(t.t().contiguous().cpu(), x.t().contiguous())


def test_item_and_print():
    t = torch.tensor([1.5, -2.0, 3.25]).to("tpu")
    assert t[1].item() == -2.0
    assert torch.tensor(7, dtype=torch.int64).to("tpu").item() == 7
    s = str(t)
    assert "device='tpu:0'" in s and "1.5000" in s and "3.2500" in s


def test_factories():
    z = torch.zeros(2, 3, device="tpu")
    assert z.device.type == "tpu" and torch.equal(z.cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(4, dtype=torch.int32, device="tpu").cpu(), torch.ones(4, dtype=torch.int32))
    assert torch.equal(torch.full((2, 2), 3.5, device="tpu").cpu(), torch.full((2, 2), 3.5))
    assert torch.equal(torch.arange(10, device="tpu").cpu(), torch.arange(10))
    assert torch.equal(torch.arange(1, 4, 0.5, device="tpu").cpu(), torch.arange(1, 4, 0.5))
    e = torch.empty(3, 4, device="tpu")
    assert e.shape == (3, 4)


def test_factories_upload_nothing():
    """A factory writes its whole tensor in the program: the fresh storage is
    never filled with zeros from the host first (that was one upload of the
    tensor's size per torch.zeros)."""
    n = 1 << 16
    for make in (lambda: torch.zeros(n, device="tpu"), lambda: torch.empty(n, device="tpu").zero_(),
                 lambda: torch.full((n,), 2.5, device="tpu"), lambda: torch.randn(n, device="tpu"),
                 lambda: torch.empty(n, device="tpu").uniform_()):
        make()
        before = torch_pjrt.metrics()["h2d_bytes"]
        t = make()
        torch.tpu.synchronize()
        assert torch_pjrt.metrics()["h2d_bytes"] - before < 64
    assert torch.equal(t.cpu() >= 0, torch.ones(n, dtype=torch.bool))
    # A partial write into a never-written storage keeps its other elements
    # (zeros here), through every dtype view of it.
    e = torch.empty(4, 6, device="tpu")
    e[1:3, ::2] = 7.0
    assert torch.equal(e[1:3, ::2].cpu(), torch.full((2, 3), 7.0))
    assert e.cpu()[0].eq(0).all()
    b = torch.empty(7, dtype=torch.uint8, device="tpu")  # 7 bytes: read as bytes
    b[2:5].view(torch.int8).fill_(-1)
    assert b.cpu().tolist() == [0, 0, 255, 255, 255, 0, 0]
    assert torch.equal(torch.empty(3, device="tpu").add(1).cpu(), torch.ones(3))


def test_random_factories_are_seeded():
    torch.manual_seed(123)
    a = torch.rand(100, device="tpu").cpu()
    b = torch.randn(100, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.rand(100, device="tpu").cpu(), a)
    assert torch.equal(torch.randn(100, device="tpu").cpu(), b)
    assert not torch.equal(torch.rand(100, device="tpu").cpu(), a)
    assert 0 <= a.min() and a.max() < 1


def test_rng_state_roundtrip():
    torch.tpu.manual_seed(77)
    assert torch.tpu.initial_seed() == 77
    state = torch.tpu.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8 and state.shape == (16,)
    a = torch.rand(50, device="tpu").cpu()
    b = torch.randn(7, 3, device="tpu").cpu()
    after = torch.tpu.get_rng_state()
    assert not torch.equal(after, state)  # the counter moved
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(50, device="tpu").cpu(), a)
    assert torch.equal(torch.randn(7, 3, device="tpu").cpu(), b)
    assert torch.equal(torch.tpu.get_rng_state(), after)
    # A state from another seed restores that seed's stream mid-way.
    torch.tpu.manual_seed(5)
    torch.rand(3, device="tpu")
    mid = torch.tpu.get_rng_state("tpu:0")
    c = torch.rand(20, device="tpu").cpu()
    torch.tpu.manual_seed(6)
    torch.tpu.set_rng_state(mid, 0)
    assert torch.tpu.initial_seed() == 5
    assert torch.equal(torch.rand(20, device="tpu").cpu(), c)
    with pytest.raises(RuntimeError):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_rng_state_all_and_fork_rng():
    n = torch.tpu.device_count()
    torch.tpu.manual_seed_all(11)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == n
    x = torch.rand(10, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    assert torch.equal(torch.rand(10, device="tpu").cpu(), x)
    # torch.random.fork_rng uses the device module's get/set_rng_state.
    with torch.random.fork_rng(devices=[0], device_type="tpu"):
        y = torch.rand(10, device="tpu").cpu()
    assert torch.equal(torch.rand(10, device="tpu").cpu(), y)
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    assert int.from_bytes(bytes(torch.tpu.get_rng_state().tolist()[:8]), "little") == s


def test_to_dtype_and_copy():
    x = torch.randn(4, 5)
    t = x.to("tpu")
    for dt in (torch.float64, torch.bfloat16, torch.int32, torch.bool):
        assert torch.equal(t.to(dt).cpu(), x.to(dt))
    dst = torch.empty(4, 5, dtype=torch.float64, device="tpu")
    dst.copy_(t)
    assert torch.equal(dst.cpu(), x.double())
    host = torch.empty(4, 5)
    host.copy_(t)
    assert torch.equal(host, x)


# ---- aliasing -----------------------------------------------------------------


def _both(fn):
    """Apply fn to a CPU tensor and a tpu copy; the bases must agree afterwards."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tb = base.to("tpu")
    fn(base)
    fn(tb)
    assert torch.equal(tb.cpu(), base)


def test_write_through_slice():
    _both(lambda b: b[1:3, ::2].fill_(-1))


def test_write_through_view_and_transpose():
    _both(lambda b: b.view(24)[5:9].mul_(10))
    _both(lambda b: b.t().add_(100))
    _both(lambda b: b.t()[2].zero_())


def test_write_through_as_strided():
    _both(lambda b: b.as_strided((2, 2), (7, 1), 3).copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]])))


def test_setitem_and_views_see_base_changes():
    base = torch.zeros(3, 4)
    tb = base.to("tpu")
    v, tv = base[1], tb[1]
    base[1, 2] = 5
    tb[1, 2] = 5
    base.add_(1)
    tb.add_(1)
    assert torch.equal(tv.cpu(), v)
    assert torch.equal(tb.cpu(), base)


def test_copy_between_devices_into_view():
    tb = torch.zeros(3, 4, device="tpu")
    tb[:, 1].copy_(torch.tensor([1.0, 2.0, 3.0]))
    other = torch.ones(3, device="tpu:1") * 7
    tb[0, :3].copy_(other)
    expect = torch.zeros(3, 4)
    expect[:, 1] = torch.tensor([1.0, 2.0, 3.0])
    expect[0, :3] = 7
    assert torch.equal(tb.cpu(), expect)


def test_inplace_on_view_of_view():
    _both(lambda b: b[1:].t()[1:3].sub_(0.5))


# ---- several devices ----------------------------------------------------------


def test_second_device():
    x = torch.randn(3, 3)
    t1 = x.to("tpu:1")
    assert t1.device == torch.device("tpu", 1)
    r = (t1 * 2 + 1)
    assert r.device == torch.device("tpu", 1)
    assert torch.allclose(r.cpu(), x * 2 + 1)
    t0 = t1.to("tpu:0")
    assert t0.device == torch.device("tpu", 0)
    assert torch.equal(t0.cpu(), x)


def test_data_parallel_on_two_devices():
    # nn.DataParallel (scatter, replicate, parallel_apply, gather): the
    # replicas run on tpu:0 and tpu:1, and training matches the CPU on the
    # whole batch; BatchNorm statistics come from replica 0's half, as on CUDA.
    from torch.nn.parallel import comm

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 3))
    model = copy.deepcopy(cpu).to("tpu")
    dp = torch.nn.DataParallel(model)
    assert dp.device_ids == [0, 1]
    seen = set()
    model[0].register_forward_hook(lambda mod, inp, out: seen.add(out.device.index))
    oc = torch.optim.SGD(cpu.parameters(), lr=0.1)
    ot = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not compiled with NCCL support" per step
        for _ in range(3):
            x, y = torch.randn(6, 4), torch.randn(6, 3)
            lc = ((cpu(x) - y) ** 2).mean()
            out = dp(x)  # a CPU batch, scattered to the devices
            assert out.device == torch.device("tpu", 0)
            lt = ((out - y.to("tpu")) ** 2).mean()
            oc.zero_grad(); lc.backward(); oc.step()
            ot.zero_grad(); lt.backward(); ot.step()
            assert lt.item() == pytest.approx(lc.item(), rel=1e-5)
    assert seen == {0, 1}
    for pc, pt in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(pt.cpu(), pc, rtol=1e-5, atol=1e-6)

    bn = torch.nn.BatchNorm1d(4)
    bt = copy.deepcopy(bn).to("tpu")
    x = torch.randn(6, 4)
    torch.nn.DataParallel(bt)(x.to("tpu"))
    bn(x[:3])
    torch.testing.assert_close(bt.running_mean.cpu(), bn.running_mean)
    out = torch.nn.DataParallel(model, output_device=1)(torch.randn(5, 4, device="tpu"))
    assert out.shape == (5, 3) and out.device == torch.device("tpu", 1)

    t = torch.arange(10.0, device="tpu")
    parts = comm.scatter(t, [0, 1], chunk_sizes=[3, 7])
    assert [p.device.index for p in parts] == [0, 1] and parts[1].tolist() == list(range(3, 10))
    assert torch.equal(comm.gather(parts, destination=-1), t.cpu())
    b = comm.broadcast(t, [0, 1])
    assert b[0] is t and b[1].device.index == 1 and torch.equal(b[1].cpu(), t.cpu())
    assert torch.equal(comm.reduce_add(b, 1).cpu(), 2 * t.cpu())
    with pytest.raises(RuntimeError, match="must appear as the first on devices list"):
        comm.broadcast(b[1], [0, 1])
    with pytest.raises(RuntimeError, match="same length"):
        comm.scatter(t, [0, 1], chunk_sizes=[10])


def test_mixing_devices_raises():
    a = torch.ones(2, device="tpu:0")
    b = torch.ones(2, device="tpu:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + b
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(2)


def test_cpu_scalar_tensor_is_allowed():
    a = torch.ones(2, device="tpu")
    assert torch.equal((a * torch.tensor(3.0)).cpu(), torch.full((2,), 3.0))


@pytest.mark.parametrize("case", ["fill", "zero", "fill_tensor", "add", "copy", "mul"])
def test_writes_through_an_expanded_view_follow_cpu(case):
    # A stride-0 view aliases elements: the CPU lets fill_(number) and zero_
    # write through it (one value for all) and refuses other in-place ops.
    fn = {"fill": lambda v: v.fill_(4.0), "zero": lambda v: v.zero_(),
          "fill_tensor": lambda v: v.fill_(torch.tensor(2.0, device=v.device)),
          "add": lambda v: v.add_(1), "copy": lambda v: v.copy_(torch.zeros(2, 3, device=v.device)),
          "mul": lambda v: v.mul_(2)}[case]
    res = []
    for dev in ("cpu", "tpu"):
        base = torch.arange(6.0).view(2, 3).to(dev)
        view = base[:, :1].expand(2, 3)
        try:
            fn(view)
            res.append(("ok", base.cpu().tolist()))
        except RuntimeError as e:
            res.append(("error", str(e)))
    assert res[1] == res[0]


# ---- errors ---------------------------------------------------------------------


def _cpu_error(fn):
    with pytest.raises(Exception) as info:
        fn("cpu")
    return info.value


@pytest.mark.parametrize("case,words", [
    ("broadcast", ["4", "3"]),
    ("matmul", ["2", "3", "4", "5"]),
    ("inplace_dtype", ["Float", "Long"]),
    ("cat", ["3", "4", "1"]),
])
def test_errors_match_cpu(case, words):
    """The same exception type as on CPU, with a message naming the sizes or dtypes.
    (PyTorch's Python meta functions word some messages differently from its
    C++ CPU kernels.)"""
    fns = {
        "broadcast": lambda d: torch.ones(2, 3, device=d) + torch.ones(4, device=d),
        "matmul": lambda d: torch.ones(2, 3, device=d) @ torch.ones(4, 5, device=d),
        "inplace_dtype": lambda d: torch.ones(3, dtype=torch.int64, device=d).add_(torch.ones(3, device=d) * 0.5),
        "cat": lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(2, 4, device=d)]),
    }
    cpu = _cpu_error(fns[case])
    with pytest.raises(type(cpu)) as info:
        fns[case]("tpu")
    msg = str(info.value)
    for w in words:
        assert w in msg, msg


_R = torch.randn
_SAME_MESSAGE = {
    "broadcast": lambda d: _R(2, 3, device=d) + _R(4, device=d),
    "broadcast3": lambda d: torch.addcmul(_R(2, 3, device=d), _R(3, device=d), _R(5, 1, device=d)),
    "linear": lambda d: torch.nn.functional.linear(_R(2, 3, 5, device=d), _R(4, 3, device=d)),
    "addmm": lambda d: torch.addmm(_R(4, device=d), _R(2, 5, device=d), _R(3, 4, device=d)),
    "conv_channels": lambda d: torch.nn.functional.conv2d(_R(1, 2, 5, 5, device=d), _R(4, 3, 3, 3, device=d)),
    "conv_groups": lambda d: torch.nn.functional.conv2d(_R(1, 4, 5, 5, device=d), _R(3, 2, 3, 3, device=d),
                                                        groups=2),
    "conv_bias": lambda d: torch.nn.functional.conv1d(_R(1, 3, 5, device=d), _R(4, 3, 3, device=d),
                                                      _R(5, device=d)),
    "conv_transposed": lambda d: torch.nn.functional.conv_transpose2d(_R(1, 2, 5, 5, device=d),
                                                                      _R(3, 4, 3, 3, device=d)),
    "conv_stride": lambda d: torch.nn.functional.conv2d(_R(1, 3, 5, 5, device=d), _R(4, 3, 3, 3, device=d),
                                                        stride=0),
    "conv_dilation": lambda d: torch.nn.functional.conv2d(_R(1, 3, 5, 5, device=d), _R(4, 3, 3, 3, device=d),
                                                          dilation=0),
    "conv_kernel": lambda d: torch.nn.functional.conv3d(_R(1, 3, 2, 5, 5, device=d), _R(4, 3, 3, 3, 3, device=d)),
    "softmax_dim": lambda d: torch.softmax(_R(2, 3, device=d), 2),
    "sort_dim": lambda d: torch.sort(_R(2, 3, device=d), 2),
    "index_select": lambda d: _R(2, 3, device=d).index_select(0, torch.zeros(2, 2, dtype=torch.long, device=d)),
    "nll_target": lambda d: torch.nn.functional.nll_loss(_R(2, 3, device=d), torch.zeros(2, device=d)),
    "layer_norm": lambda d: torch.nn.functional.layer_norm(_R(2, 3, 4, device=d), [3]),
}


@pytest.mark.parametrize("case", sorted(_SAME_MESSAGE))
def test_errors_have_the_cpu_message(case):
    """The CPU kernels' own checks, with their type and words, where
    PyTorch's meta functions word them otherwise (or miss them: a 2-d
    index_select index, a zero conv stride)."""
    fn = _SAME_MESSAGE[case]
    cpu = _cpu_error(fn)
    with pytest.raises(type(cpu)) as info:
        fn("tpu")
    assert str(info.value) == str(cpu)


def test_unsupported_op_names_op_and_fallback():
    x = torch.randn(4, 4, device="tpu")
    torch_pjrt.set_cpu_fallback(False)
    with pytest.raises(NotImplementedError) as info:
        torch.histogram(x, bins=4)  # no lowering
    msg = str(info.value)
    assert "aten::histogram.bin_ct" in msg and "TORCH_PJRT_CPU_FALLBACK=1" in msg


@pytest.mark.parametrize("case", ["coo", "csr", "dense_to_sparse", "embedding_sparse_grad", "nested", "quantized"])
def test_other_layouts_raise_a_clear_error(case):
    """Sparse, nested and quantized tensors have their own dispatch keys;
    on tpu each raises NotImplementedError naming the layout and the way
    out, not PyTorch's "Could not run ... 'Sparsetpu' backend"."""
    def embedding_sparse_grad():
        emb = torch.nn.Embedding(5, 3, sparse=True).to("tpu")
        emb(torch.tensor([1, 2], device="tpu")).sum().backward()

    fns = {
        "coo": lambda: torch.randn(3, 3).to_sparse().to("tpu"),
        # a compressed or nested tensor can hold tpu components; its first op raises
        "csr": lambda: torch.randn(3, 3).to_sparse_csr().to("tpu").to_dense(),
        "dense_to_sparse": lambda: torch.randn(3, 3, device="tpu").to_sparse(),
        "embedding_sparse_grad": embedding_sparse_grad,
        "nested": lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="tpu").unbind(),
        "quantized": lambda: torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8).to("tpu"),
    }
    words = {"coo": ["sparse COO", ".to_dense()"], "csr": ["sparse compressed", ".to_dense()"],
             "dense_to_sparse": ["sparse COO", "aten::_to_sparse"], "embedding_sparse_grad": ["sparse=False"],
             "nested": ["nested", "to_padded_tensor"], "quantized": ["quantized", ".dequantize()"]}[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # beta/prototype warnings of these layouts
        with pytest.raises(NotImplementedError) as info:
            fns[case]()
    msg = str(info.value)
    assert "not supported on the tpu device" in msg and "Sparsetpu" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_cpu_fallback_runs_and_counts():
    x = torch.randn(4, 4)
    torch_pjrt.reset_cpu_fallback_counts()
    torch_pjrt.set_cpu_fallback(True)
    try:
        r = torch.histogram(x.to("tpu"), bins=4)
    finally:
        torch_pjrt.set_cpu_fallback(False)
    assert r.hist.device.type == "tpu" and r.bin_edges.device.type == "tpu"
    want = torch.histogram(x, bins=4)
    assert torch.equal(r.hist.cpu(), want.hist) and torch.equal(r.bin_edges.cpu(), want.bin_edges)
    assert torch_pjrt.cpu_fallback_counts().get("aten::histogram.bin_ct") == 1


def test_eig_computed_on_the_host():
    """linalg.eig has no XLA form; as CUDA does (MAGMA), it runs on the host,
    without the fallback switch, and is counted like a fallback."""
    x = torch.randn(3, 4, 4)
    torch_pjrt.reset_cpu_fallback_counts()
    w, v = torch.linalg.eig(x.to("tpu"))
    want_w, want_v = torch.linalg.eig(x)
    assert w.device.type == "tpu" and w.dtype == torch.complex64
    torch.testing.assert_close(w.cpu(), want_w)
    torch.testing.assert_close(v.cpu(), want_v)
    torch.testing.assert_close(torch.linalg.eigvals(x.to("tpu")).cpu(), want_w)
    assert torch_pjrt.cpu_fallback_counts().get("aten::linalg_eig") == 1


# A device that cannot open never breaks `import torch` (which autoloads
# torch_pjrt) nor `import torch_pjrt`: the device reports itself unavailable,
# and its first use raises the error that names the cause and the way out.
_UNAVAILABLE = """
import torch, torch_pjrt
assert not torch.tpu.is_available() and torch.tpu.device_count() == 0 and torch_pjrt.load_error is not None
for use in (lambda: torch.ones(2).to("tpu"), lambda: torch.zeros(2, device="tpu"), torch.tpu.synchronize,
            torch_pjrt.metrics, lambda: torch.compile(lambda x: x + 1, backend="tpu")(torch.ones(2))):
    try:
        use()
    except RuntimeError as e:
        print(str(e).splitlines()[-1])
    else:
        raise SystemExit("no error")
"""


def _unavailable_with(env):
    r = subprocess.run([sys.executable, "-c", _UNAVAILABLE], env=dict(os.environ, **env), capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 5 and all("the tpu device is not available" in ln for ln in lines), r.stdout
    return lines


def test_a_script_prints_nothing_to_stderr():
    """The plugin's start-up INFO lines stay out of a script's output; the
    user's TF_CPP_MIN_LOG_LEVEL still decides (0 shows them)."""
    if os.environ.get("TORCH_PJRT_PLUGIN"):
        pytest.skip("another plugin logs what it logs")
    script = "import torch, torch_pjrt; print((torch.ones(3, device='tpu') * 2).sum().item())"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "6.0" and quiet.stderr == "", quiet.stderr
    loud = subprocess.run([sys.executable, "-c", script], env=dict(env, TF_CPP_MIN_LOG_LEVEL="0"),
                          capture_output=True, text=True, timeout=120)
    assert loud.returncode == 0 and "I0000" in loud.stderr


def test_missing_plugin_is_a_clear_error():
    for line in _unavailable_with({"TORCH_PJRT_PLUGIN": "/nonexistent/libtpu.so"}):
        assert "/nonexistent/libtpu.so does not exist" in line and "TORCH_PJRT_PLUGIN" in line


def test_broken_plugin_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken_plugin.so"
    bad.write_bytes(b"this is not a shared object")
    for line in _unavailable_with({"TORCH_PJRT_PLUGIN": str(bad)}):
        assert f"could not open the PJRT plugin {bad}" in line and "TORCH_PJRT_PLUGIN" in line


def test_memory_stats():
    del_me = torch.ones(1024, 256, device="tpu")  # the fill value's uploaded scalar stays cached
    del del_me
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    t = torch.ones(1024, 256, device="tpu")
    assert torch.tpu.memory_allocated() >= before + 1024 * 256 * 4
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del t
    assert torch.tpu.memory_allocated() <= before
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()


def test_scalars_do_not_recompile():
    x = torch.randn(16, device="tpu")
    (x * 0.5).cpu()
    compiles = torch_pjrt.metrics()["compiles"]
    for s in (0.25, 1.5, 3.0, -2.0):
        assert torch.allclose((x * s).cpu(), x.cpu() * s)
    assert torch_pjrt.metrics()["compiles"] == compiles


def test_async_then_synchronize():
    a = torch.randn(256, 256).to("tpu")
    b = a
    for _ in range(5):
        b = b @ a * 0.01
    torch.tpu.synchronize()
    assert torch.isfinite(b).all().item()


def test_cpu_plugin_default_xla_flags():
    """torch_pjrt/_plugin.py: LLVM's LSR off for the XLA CPU plugin (a third
    of compile time), and Eigen's intra-op threads with two CPUs or fewer,
    each unless XLA_FLAGS already sets that option."""
    if os.environ.get("TORCH_PJRT_PLUGIN"):
        pytest.skip("another plugin")
    flags = os.environ["XLA_FLAGS"].split()
    assert "--xla_backend_extra_options=-disable-lsr" in flags
    assert ("--xla_cpu_multi_thread_eigen=false" in flags) == (os.cpu_count() <= 2)
    own = "--xla_backend_extra_options=-lsr-complexity-limit=100 --xla_cpu_multi_thread_eigen=true"
    out = subprocess.run([sys.executable, "-c", "import os, torch_pjrt, torch; "
                          "print((torch.ones(3, device='tpu') * 2).sum().item(), os.environ['XLA_FLAGS'])"],
                         env=dict(os.environ, XLA_FLAGS=own), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["6.0", *own.split()]


@pytest.mark.parametrize("flag,says", [("--xla_not_a_flag=1", "Unknown flag in XLA_FLAGS: --xla_not_a_flag=1"),
                                       ("--xla_dump_hlo_as_text=maybe", "Couldn't interpret value maybe")])
def test_bad_xla_flags_raise_instead_of_aborting(flag, says):
    """XLA aborts the process on a bad XLA_FLAGS entry; the device is
    unavailable instead and its use raises (the plugin is tried in a child
    process first)."""
    for line in _unavailable_with({"XLA_FLAGS": flag}):
        assert "torch-pjrt: the PJRT plugin" in line and says in line and "XLA_FLAGS" in line


def test_memory_stats_nested_peer_access_and_reset_cached():
    x = torch.ones(1000, device="tpu")
    nested = torch.tpu.memory_stats_as_nested_dict()
    flat = torch.tpu.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"] >= 4000
    assert nested["num_ooms"] == flat["num_ooms"]
    assert torch.tpu.can_device_access_peer(0, "tpu:0") is True
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.tpu.can_device_access_peer(0, torch.tpu.device_count())
    gc.collect()  # an earlier test's garbage freed after the reset would leave the peak above
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.tpu.reset_max_memory_cached()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    del x


def test_per_process_memory_fraction():
    """As torch.cuda.set_per_process_memory_fraction: going over the cap
    raises torch.OutOfMemoryError before the op runs, nothing is lost, and
    1.0 lifts it."""
    with pytest.raises(TypeError, match="must be `float`"):
        torch.tpu.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        torch.tpu.set_per_process_memory_fraction(1.5)
    x = torch.randn(256, 1024, device="tpu")  # 1 MiB
    f = torch.compile(lambda t: t * 3 + 1, backend="tpu", dynamic=False)
    expect = (x * 3 + 1).cpu()
    f(x)  # compiled before the cap
    total = torch.tpu.mem_get_info()[1]
    try:
        torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + (1 << 19)) / total)
        assert 0 < torch.tpu.get_per_process_memory_fraction() < 1
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            x * 2
        with pytest.raises(torch.OutOfMemoryError):
            f(x)
        with pytest.raises(torch.OutOfMemoryError):
            torch.ones(256, 1024).to("tpu")
        x.mul_(2)  # in place (donated): nothing more
        small = x[:4] + 1  # 16 KiB fit
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert torch.tpu.get_per_process_memory_fraction() == 1.0
    torch.testing.assert_close(small.cpu(), x[:4].cpu() + 1)
    torch.testing.assert_close(f(x / 2).cpu(), expect)


def test_synchronize_waits_for_results_nobody_kept():
    """As torch.cuda.synchronize: all queued work, also programs whose
    results were dropped at once (a loop timed with synchronize)."""
    x = torch.randn(1024, 1024, device="tpu")
    (x @ x).cpu()  # compiled
    one = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        (x @ x).cpu()
        one = min(one, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(8):
        x @ x
    torch.tpu.synchronize()
    assert time.perf_counter() - t0 > 0.4 * 8 * one


def test_mlp_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    tm = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    tm.load_state_dict(model.state_dict())
    tm = tm.to("tpu")
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(tm.parameters(), lr=0.1)
    y = torch.randint(0, 4, (8,))
    for _ in range(3):
        lc = torch.nn.functional.cross_entropy(model(x), y)
        lt = torch.nn.functional.cross_entropy(tm(x.to("tpu")), y.to("tpu"))
        assert abs(lc.item() - lt.item()) < 1e-5
        opt_c.zero_grad()
        opt_t.zero_grad()
        lc.backward()
        lt.backward()
        opt_c.step()
        opt_t.step()
    for pc, pt in zip(model.parameters(), tm.parameters()):
        assert torch.allclose(pt.cpu(), pc, atol=1e-6)


def test_forward_mode_ad_and_torch_func():
    # forward-mode AD creates ZeroTensors (_efficientzerotensor) on the device
    import torch.autograd.forward_ad as fwAD
    from torch.func import grad, jacfwd, jacrev, jvp, vmap

    torch.manual_seed(0)
    x, t = torch.randn(3, 3), torch.randn(3, 3)

    def f(a):
        return (a.sin() * 2).exp() @ a

    tangents = []
    for dev in ("tpu", "cpu"):
        with fwAD.dual_level():
            out = f(fwAD.make_dual(x.to(dev), t.to(dev)))
            tangents.append(fwAD.unpack_dual(out).tangent.cpu())
    torch.testing.assert_close(tangents[0], tangents[1], rtol=1e-5, atol=1e-5)
    z = torch._efficientzerotensor(2, 3, device="tpu")
    assert z._is_zerotensor() and z.device.type == "tpu"
    torch.testing.assert_close((x[:2].to("tpu") + z).cpu(), x[:2])

    def g(a):
        return (a.tanh() ** 2).sum(0)

    xt = x.to("tpu")
    for fn in (jacfwd(g), jacrev(g), vmap(g), grad(lambda a: g(a).sum())):
        torch.testing.assert_close(fn(xt).cpu(), fn(x), rtol=1e-5, atol=1e-6)
    p, tg = jvp(g, (xt,), (t.to("tpu"),))
    p0, tg0 = jvp(g, (x,), (t,))
    torch.testing.assert_close((p.cpu(), tg.cpu()), (p0, tg0), rtol=1e-5, atol=1e-6)


def test_autocast_casts_like_cuda():
    # torch.autocast("tpu") uses PyTorch's CUDA op lists: matmuls in the
    # autocast dtype, softmax/losses/norms in float32; default dtype bfloat16
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    tgt = torch.tensor([1, 2, 3, 4])
    xt, wt = x.to("tpu"), w.to("tpu")
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    with torch.autocast("tpu"):
        y = xt @ wt
        z = torch.softmax(y, -1)
        loss = torch.nn.functional.cross_entropy(y, tgt.to("tpu"))
        ln = torch.nn.functional.layer_norm(y, (8,))
    assert (y.dtype, z.dtype, loss.dtype, ln.dtype) == (torch.bfloat16,) + (torch.float32,) * 3
    y_ref = x.bfloat16() @ w.bfloat16()
    torch.testing.assert_close(y.cpu(), y_ref, rtol=0, atol=0)
    torch.testing.assert_close(z.cpu(), torch.softmax(y_ref.float(), -1))
    # cross_entropy is on no list: log_softmax runs in bfloat16, nll_loss in float32 (as on CUDA)
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.nll_loss(torch.log_softmax(y_ref, 1).float(), tgt))
    with torch.autocast("tpu", dtype=torch.float16):
        assert (xt @ wt).dtype == torch.float16
    assert (xt @ wt).dtype == torch.float32


@pytest.mark.parametrize("poison", [False, True])
def test_grad_scaler(poison):
    # GradScaler's unscale/update ops on the device, with a step skipped on inf
    def run(dev):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 10, growth_interval=2)
        x = torch.randn(16, 8).to(dev)
        hist = []
        for i in range(6):
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = m(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            if poison and i == 3:
                m[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            hist.append((loss.item(), scaler.get_scale()))
        return hist, [p.detach().cpu() for p in m.parameters()]

    (h_tpu, p_tpu), (h_cpu, p_cpu) = run("tpu"), run("cpu")
    assert [s for _, s in h_tpu] == [s for _, s in h_cpu]
    if poison:
        assert h_tpu[3][1] == h_tpu[2][1] / 2  # backed off, step skipped
    for (a, _), (b, _) in zip(h_tpu, h_cpu):
        assert abs(a - b) <= 1e-4 * abs(b)
    for a, b in zip(p_tpu, p_cpu):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_streams_and_events():
    # torch.cuda-like handles for the device's one in-order stream
    s = torch.tpu.current_stream()
    assert s.device == torch.device("tpu", 0) and s == torch.tpu.default_stream()
    x = torch.randn(64, 64).to("tpu")
    y = x @ x
    ev = torch.tpu.Event()
    ev.record(s)
    ev.synchronize()
    assert ev.query() and s.query()
    with torch.tpu.stream(torch.tpu.Stream()):
        z = y + 1
    s.synchronize()
    torch.testing.assert_close(z.cpu(), x.cpu() @ x.cpu() + 1, rtol=1e-4, atol=1e-4)
    # The CUDA timing idiom: elapsed_time covers the work between the records.
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    w = torch.randn(512, 512, device="tpu")
    for _ in range(20):
        w = torch.tanh(w @ w)
    end.record()
    wall_ms = (time.perf_counter() - t0) * 1e3
    torch.tpu.synchronize()
    ms = start.elapsed_time(end)
    assert 0 < ms <= wall_ms + 1, (ms, wall_ms)
    with pytest.raises(ValueError, match="enable_timing"):
        ev.elapsed_time(end)
    x.record_stream(torch.tpu.Stream())  # a no-op: one in-order stream
    with torch.tpu.StreamContext(torch.tpu.current_stream()):
        z = z * 2
    with torch.tpu.StreamContext(None):
        z = z - 1
    torch.testing.assert_close(z.cpu(), (x.cpu() @ x.cpu() + 1) * 2 - 1, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="expected a tpu stream"):
        torch.tpu.StreamContext(torch.Stream(device="cpu")).__enter__()


def test_tpu_amp_mirrors_cuda_amp():
    """torch.tpu.amp.autocast / GradScaler are torch.amp's for "tpu", as
    torch.cuda.amp's are for "cuda"; autocast defaults to bfloat16."""
    from torch.tpu.amp import GradScaler, autocast

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    results = []
    for dev in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = GradScaler(init_scale=1024.0) if dev == "tpu" else torch.amp.GradScaler("cpu", init_scale=1024.0)
        ctx = autocast() if dev == "tpu" else torch.autocast("cpu", dtype=torch.bfloat16)
        with ctx:
            out = m(x.to(dev))
            assert out.dtype == torch.bfloat16
            loss = torch.nn.functional.mse_loss(out.float(), y.to(dev))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        results.append((loss.item(), scaler.get_scale(), m.weight.detach().cpu()))
    (l0, s0, w0), (l1, s1, w1) = results
    assert s0 == s1 == 1024.0
    assert abs(l0 - l1) <= 1e-2 * abs(l0)
    torch.testing.assert_close(w1, w0, rtol=1e-2, atol=1e-2)
    with torch.tpu.amp.autocast(dtype=torch.float16):
        assert torch.get_autocast_dtype("tpu") == torch.float16


def test_cuda_style_memory_aliases_and_noops():
    x = torch.ones(1024, device="tpu")
    assert torch.tpu.memory_cached() == torch.tpu.memory_reserved() >= x.nbytes
    assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    torch.tpu.ipc_collect()
    assert torch.tpu.is_current_stream_capturing() is False


def test_accelerator_memory_api():
    """torch.accelerator's memory functions read the same accounting as
    torch.tpu's."""
    torch.tpu.synchronize()
    x = torch.ones(256, 1024, device="tpu")
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() >= x.nbytes
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.accelerator.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert {"reserved_bytes.all.peak", "active_bytes.all.current", "num_ooms"} <= set(stats)
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    before = torch.accelerator.memory_allocated()
    del x
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() <= before - 256 * 1024 * 4
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()


def test_checkpoint_replays_dropout():
    # torch.utils.checkpoint saves and restores the device's random state
    # (only for a device module that says it is initialised): the recomputed
    # forward draws the same dropout mask, so gradients match plain autograd.
    assert torch.tpu.is_initialized()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2)).to("tpu")
    x = torch.randn(8, 4, device="tpu", requires_grad=True)
    grads = []
    for use_checkpoint in (True, False):
        torch.manual_seed(1)
        y = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False) if use_checkpoint else m(x)
        (gx,) = torch.autograd.grad(y.sum(), x)
        grads.append(gx.cpu())
    torch.testing.assert_close(grads[0], grads[1])


_SPAWN_LOADER = """
import torch, torch_pjrt
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, TensorDataset


class DS(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((3,), float(i), device="tpu")


def child(t, p, q):
    q.put((t.device.type, t.dtype, t.tolist(), type(p).__name__, p.requires_grad, p.tolist()))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    # tpu tensors as a spawned Process's arguments (pickled before the start)
    q = ctx.Queue()
    t = torch.arange(6, dtype=torch.bfloat16, device="tpu").view(2, 3).t()
    proc = ctx.Process(target=child, args=(t, torch.nn.Parameter(torch.ones(2, device="tpu")), q))
    proc.start()
    got = q.get(timeout=120)
    proc.join(120)
    assert proc.exitcode == 0 and got == ("tpu", torch.bfloat16, t.tolist(), "Parameter", True, [1.0, 1.0]), got
    # a dataset holding tpu tensors, sent to the workers
    ds = TensorDataset(torch.arange(8.0, device="tpu").view(4, 2))
    pairs = [b for (b,) in DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")]
    assert torch.equal(torch.cat(pairs).cpu(), torch.arange(8.0).view(4, 2))
    batches = [b for b in DataLoader(DS(), batch_size=2, num_workers=1, multiprocessing_context="spawn")]
    assert all(b.device.type == "tpu" for b in batches)
    print(torch.cat(batches).sum().item())
"""


def test_tensors_cross_process_queues(tmp_path):
    """tpu tensors sent through torch.multiprocessing queues (a spawned
    DataLoader worker's batches) arrive as copies on the same device; before,
    the worker's pickler failed in a thread and the parent hung.  So do a
    spawned Process's tpu arguments and a dataset holding tpu tensors (whose
    shared-memory copy was freed before the child opened it)."""
    from multiprocessing.reduction import ForkingPickler
    import pickle

    p = torch.nn.Parameter(torch.arange(4.0, device="tpu"))
    q = pickle.loads(ForkingPickler.dumps(p))
    assert type(q) is torch.nn.Parameter and q.requires_grad and q.device == p.device
    assert torch.equal(q.cpu(), p.detach().cpu())
    with pytest.raises(RuntimeError, match="autograd"):
        ForkingPickler.dumps(p * 2)
    script = tmp_path / "loader.py"
    script.write_text(_SPAWN_LOADER)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "18.0"


def test_forked_child_gets_a_clear_error():
    # A forked child cannot use the parent's PJRT client: ops raise (as CUDA
    # does) instead of hanging, and freeing the inherited tensors is safe.
    import os

    t = torch.arange(4.0, device="tpu")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msg = b"no error"
        try:
            assert torch.tpu._is_in_bad_fork() and not torch.tpu.is_initialized()
            (t + 1).cpu()
        except RuntimeError as e:
            msg = str(e).encode()
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            msg = repr(e).encode()
        del t
        os.write(w, msg[:4000])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert "forked subprocess" in msg and "spawn" in msg, msg
    assert not torch.tpu._is_in_bad_fork()
    torch.testing.assert_close((t + 1).cpu(), torch.arange(1.0, 5.0))


def test_host_malloc_serves_large_buffers_from_the_heap():
    """With the CPU plugin a 24 MiB buffer comes from the malloc heap, not
    from fresh mmap'd pages (which made each large eager output page-fault);
    TORCH_PJRT_HOST_MALLOC=default leaves glibc's settings alone."""
    import subprocess
    import sys

    code = """
import ctypes, torch, torch_pjrt
class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MI
h0 = libc.mallinfo2().hblks
x = torch.full((6 << 20,), 1.0, device="tpu")
torch.tpu.synchronize()
print(libc.mallinfo2().hblks - h0, float(x[-1]))
del x
torch.tpu.empty_cache()
"""
    for mode, mapped in (("", "0"), ("default", "1")):
        env = dict(__import__("os").environ, TORCH_PJRT_HOST_MALLOC=mode)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == [mapped, "1.0"], (mode, r.stdout)


def test_memory_reserved_and_empty_cache():
    x = torch.zeros(1024, device="tpu")
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated() >= 4096
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    torch.tpu.empty_cache()
    del x


def test_meta_init_default_device_and_export():
    # Large models are built on "meta" and materialised on the device.
    with torch.device("meta"):
        lin = torch.nn.Linear(6, 4)
    lin = lin.to_empty(device="tpu")
    torch.nn.init.constant_(lin.weight, 0.5)
    torch.nn.init.zeros_(lin.bias)
    assert lin.weight.device.type == "tpu"
    x = torch.randn(3, 6)
    torch.testing.assert_close(lin(x.to("tpu")).cpu(), (x * 0.5).sum(1, keepdim=True).expand(3, 4))
    # torch.device("tpu") as a context and as the default device
    with torch.device("tpu"):
        assert torch.nn.Linear(2, 2).weight.device.type == "tpu" and torch.ones(2).device.type == "tpu"
    torch.set_default_device("tpu")
    try:
        assert torch.zeros(3).device.type == "tpu"
    finally:
        torch.set_default_device(None)  # ("cpu" would leave a DeviceContext on for the tests after)
    # torch.export of a tpu model, run eagerly and compiled
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    ref = cpu_model(x)
    program = torch.export.export(copy.deepcopy(cpu_model).to("tpu"), (x.to("tpu"),))
    torch.testing.assert_close(program.module()(x.to("tpu")).cpu(), ref)
    torch.testing.assert_close(torch.compile(program.module(), backend="tpu")(x.to("tpu")).cpu(), ref)


def test_deterministic_algorithms():
    """torch.use_deterministic_algorithms(True): new memory reads as NaN
    (integers: their largest value) as on the CPU, also after resize_; ops
    whose CUDA kernels are nondeterministic but whose programs are not (median
    with indices, histc) run instead of raising CUDA's alert."""
    try:
        torch.use_deterministic_algorithms(True)
        for dev in ("cpu", "tpu"):
            r = torch.ones(2, device=dev)
            r.resize_(4)
            got = [torch.empty(3, device=dev), torch.empty(2, dtype=torch.int32, device=dev), r,
                   torch.empty_strided((2, 2), (1, 2), dtype=torch.uint8, device=dev),
                   torch.empty_like(torch.ones(2, dtype=torch.bfloat16, device=dev))]
            if dev == "cpu":
                want = [str(t.tolist()) for t in got]
            else:
                assert [str(t.cpu().tolist()) for t in got] == want
        x = torch.tensor([[3.0, 1, 2], [0, 5, 4]])
        for f in (lambda t: torch.median(t, 1), lambda t: torch.nanmedian(t, 1), lambda t: torch.histc(t, bins=3)):
            a, b = f(x), f(x.to("tpu"))
            for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                assert torch.equal(v.cpu(), u)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.ones(3, device="tpu").add_(1).tolist() == [2.0, 2.0, 2.0]
