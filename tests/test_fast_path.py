"""The eager C fast path (_C.fast_call): it serves plain calls whose output
specs the Python handler has cached, with the same results, and hands every
other call back to the handler."""
import torch

import torch_pjrt
from torch_pjrt import _C, _dispatch

D = "tpu"


def _plan(op):
    return _dispatch._handler(op).plan


def test_served_after_first_call_and_matches_cpu():
    a, b = torch.randn(8, 5), torch.randn(8, 5)
    ta, tb = a.to(D), b.to(D)
    plan = _plan(torch.ops.aten.add.Tensor)
    assert plan is not None
    torch.add(ta, tb)  # the handler caches the output spec
    r = _C.fast_call(plan, (ta, tb))
    assert isinstance(r, torch.Tensor) and r.device.type == "tpu"
    torch.testing.assert_close(r.cpu(), a + b, rtol=0, atol=0)
    # A Python number alpha: a runtime scalar, its value read per call.
    for alpha in (2.0, -0.5, 3.25):
        torch.testing.assert_close(torch.add(ta, tb, alpha=alpha).cpu(), torch.add(a, b, alpha=alpha))
        torch.testing.assert_close(_C.fast_call(plan, (ta, tb)).cpu(), a + b)


def test_no_recompile_for_new_scalar_values():
    x = torch.randn(6, 7).to(D)
    torch.mul(x, 1.5).cpu()
    before = torch_pjrt.metrics()["cache_misses"]
    for v in (0.5, 2.0, -3.0, 7.25):
        torch.testing.assert_close(torch.mul(x, v).cpu(), x.cpu() * v)
    assert torch_pjrt.metrics()["cache_misses"] == before


def test_views_and_in_place():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    t = base.to(D)
    v = t.t()[1:4]  # a non-contiguous view with an offset
    ref = base.t()[1:4]
    for _ in range(2):  # the second call goes through the fast path
        torch.testing.assert_close((v * 2).cpu(), ref * 2)
    w = t[1]
    for _ in range(2):
        w.add_(1.0)
        base[1].add_(1.0)
    torch.testing.assert_close(t.cpu(), base)


def test_handed_back_to_the_handler():
    plan = _plan(torch.ops.aten.add.Tensor)
    a = torch.randn(3, 3).to(D)
    # A CPU 0-dim tensor, a CPU matrix, keyword arguments: the handler's business.
    assert _C.fast_call(plan, (a, torch.tensor(2.0))) is NotImplemented
    assert _C.fast_call(plan, (a, torch.randn(3, 3))) is NotImplemented
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), a.cpu() + 2.0)
    try:
        a + torch.randn(3, 3)
    except RuntimeError as e:
        assert "same device" in str(e)
    else:
        raise AssertionError("mixing tpu and cpu tensors must raise")
    # Different devices
    if torch.tpu.device_count() > 1:
        b = torch.randn(3, 3).to("tpu:1")
        try:
            a + b
        except RuntimeError as e:
            assert "same device" in str(e)
        else:
            raise AssertionError("mixing tpu:0 and tpu:1 must raise")


def test_multi_output_and_int_lists():
    x = torch.randn(5, 4)
    t = x.to(D)
    for _ in range(2):
        vals, idx = torch.max(t, dim=1)
        torch.testing.assert_close(vals.cpu(), x.max(dim=1).values)
        torch.testing.assert_close(idx.cpu(), x.max(dim=1).indices)
        torch.testing.assert_close(t.sum([0, 1]).cpu(), x.sum([0, 1]))
        torch.testing.assert_close(t.to(torch.float16).sum(-1).cpu(), x.to(torch.float16).sum(-1))


# ---- the C++ fast kernels (csrc/glue/fast.cpp) ----------------------------

import contextlib  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402


@contextlib.contextmanager
def python_entries():
    """Count the calls that enter the C core through Python (_C.run from the
    handler, _C.fast_call from the Python kernel)."""
    calls = []
    run, fast_call = _C.run, _C.fast_call

    def spy_run(*a, **k):
        calls.append("run")
        return run(*a, **k)

    def spy_fast(plan, args):
        calls.append(plan[11])
        return fast_call(plan, args)

    _C.run, _C.fast_call = spy_run, spy_fast
    try:
        yield calls
    finally:
        _C.run, _C.fast_call = run, fast_call


CASES = {
    "add": (lambda a, b: a + b, lambda: (torch.randn(6, 5), torch.randn(6, 5))),
    # a Python number the arg parser wraps into a CPU tensor
    "mul_number": (lambda a: a * 0.25, lambda: (torch.randn(6, 5),)),
    "int_add_number": (lambda a: a + 3, lambda: (torch.arange(12).reshape(3, 4),)),
    # a keyword-only Scalar
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=-2.5), lambda: (torch.randn(4, 3), torch.randn(4, 3))),
    # a keyword-only dtype
    "sum_dtype": (lambda a: torch.sum(a, 1, dtype=torch.float64), lambda: (torch.randn(5, 7),)),
    # several outputs, an int list, a float
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b, eps=1e-3),
                   lambda: (torch.randn(4, 8), torch.randn(8), torch.randn(8))),
    "max_dim": (lambda a: torch.max(a, 1), lambda: (torch.randn(5, 6),)),
    # a non-contiguous view with an offset
    "view_matmul": (lambda a, b: a.t()[1:4] @ b, lambda: (torch.randn(6, 5), torch.randn(6, 2))),
    # an op whose output shape depends on a number's value is keyed by it
    "pow_number": (lambda a: a.abs() ** 2, lambda: (torch.randn(3, 3),)),
    "bf16_gelu": (lambda a: F.gelu(a, approximate="tanh"), lambda: (torch.randn(4, 4).bfloat16(),)),
    # a bool list, and an output the mask leaves undefined
    "layer_norm_backward": (
        lambda g, x, w, b: torch.ops.aten.native_layer_norm_backward(
            g, x, [8], *torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)[1:], w, b, [True, False, True]),
        lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(8))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpp_kernel_serves_repeat_calls_without_python(name):
    fn, make = CASES[name]
    cpu = make()
    dev = tuple(t.to(D) for t in cpu)
    want = fn(*cpu)
    for _ in range(2):  # the handler computes the specs; the Python kernel records them
        fn(*dev)
    with python_entries() as calls:
        got = fn(*dev)
    assert calls == [], f"{name}: entered the core through Python: {calls}"
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if w is None:
            assert g is None
            continue
        assert g.device.type == "tpu" and g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


def test_cpp_kernel_reads_numbers_per_call_and_hands_new_signatures_to_python():
    x = torch.randn(4, 4)
    t = x.to(D)
    for v in (0.5, 0.5, 2.0, -3.0, 1e30):  # one signature, several values
        torch.testing.assert_close((t * v).cpu(), x * v)
    with python_entries() as calls:
        (t * 7.0).cpu()
        r = t[:, :2] * 7.0  # a new signature: Python computes its specs
    assert calls == ["aten::mul.Tensor", "run"]  # the Python kernel misses, the handler runs it
    torch.testing.assert_close(r.cpu(), x[:, :2] * 7.0)
    with python_entries() as calls:  # an int where the float was: another signature
        r = t * 2
    assert calls
    torch.testing.assert_close(r.cpu(), x * 2)


def test_cpp_kernel_in_place_on_views():
    base = torch.zeros(4, 6)
    t = base.to(D)
    for i in range(4):
        t[:, 1::2].add_(float(i))
        base[:, 1::2].add_(float(i))
        t.t()[2].mul_(2.0)
        base.t()[2].mul_(2.0)
    with python_entries() as calls:
        t[:, 1::2].add_(5.0)
    assert calls == []
    base[:, 1::2].add_(5.0)
    torch.testing.assert_close(t.cpu(), base, rtol=0, atol=0)


def test_cpp_kernel_errors_and_fallbacks_stay_pythons():
    a = torch.randn(3, 3).to(D)
    for _ in range(3):
        a + a
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.randn(3, 3)
    with pytest.raises(RuntimeError, match="broadcast|size of tensor"):
        a + torch.randn(4, 3).to(D)
    z = torch.empty(0, 3).to(D)
    assert (z + z).shape == (0, 3)


def test_fast_kernels_off_gives_the_same_results():
    x, y = torch.randn(5, 5), torch.randn(5, 5)
    a, b = x.to(D), y.to(D)
    for _ in range(3):
        on = (a * b + 1.5).cpu()
    was = _dispatch.fast_kernels(False)
    try:
        with python_entries() as calls:
            off = (a * b + 1.5).cpu()
        assert calls  # every op through Python
    finally:
        _dispatch.fast_kernels(was)
    torch.testing.assert_close(on, off, rtol=0, atol=0)
    torch.testing.assert_close(on, x * y + 1.5)


def test_like_factories_never_enter_python():
    # empty_like/zeros_like/ones_like take PyTorch's generic kernels: an
    # allocation in the glue and a fill by a fast kernel, no Python kernel.
    x = torch.randn(4, 3, device="tpu").t()
    for _ in range(2):  # the fills' first calls record their specs
        for f in (torch.empty_like, torch.zeros_like, torch.ones_like):
            f(x, memory_format=torch.preserve_format)
    with python_entries() as calls:
        outs = [f(x, memory_format=torch.preserve_format) for f in (torch.empty_like, torch.zeros_like,
                                                                       torch.ones_like)]
    assert calls == []
    assert all(o.stride() == x.stride() for o in outs)
    assert outs[1].cpu().eq(0).all() and outs[2].cpu().eq(1).all()


def test_default_dtype_change_reaches_cached_ops():
    """The default dtype decides an int tensor times a float's dtype; a
    signature cached under float32 (in the handlers and for the C++ kernels)
    must not keep answering float32 after torch.set_default_dtype."""
    x = torch.arange(4).to(D)
    ops = (lambda t: t * 1.5, lambda t: t + 2.5, torch.sigmoid, lambda t: t / 2, lambda t: torch.full_like(t, 1.5))
    try:
        for dt in (torch.float32, torch.float64, torch.float32, torch.float16, torch.float64):
            torch.set_default_dtype(dt)
            for _ in range(3):  # the Python kernel, the C fast path, the C++ kernel
                for f in ops:
                    got, want = f(x), f(x.cpu())
                    assert got.dtype == want.dtype, (dt, got.dtype, want.dtype)
                    torch.testing.assert_close(got.cpu(), want)
    finally:
        torch.set_default_dtype(torch.float32)
