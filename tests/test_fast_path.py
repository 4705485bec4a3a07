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
