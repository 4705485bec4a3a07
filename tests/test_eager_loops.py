"""Eager Python loops over integer positions (issue 44): a view's offset and an
op's runtime integers (roll's shifts, triu/tril's diagonal) reach the program
as operands, so a loop runs one program per op shape, and gives the CPU's
values.  A loop over an argument that must stay static (it shapes the result)
warns, naming the op and the argument."""
import warnings

import pytest
import torch

import torch_pjrt
from torch_pjrt import _C


def programs_built():
    # In-memory cache misses: every program built, whether compiled or loaded
    # from the disk cache (a disk hit would hide a compile from "compiles").
    return _C.stats()["cache_misses"]


def _setitem(x, v, i):
    x[i] = v


def _slice_mul_(x, v, i):
    x[i:i + 3].mul_(2)


def _row_update(x, v, i):
    x[i] = x[i] * 2 + v


def _column_add_(x, v, i):
    x[:, i % x.shape[1]] += 1  # a strided view whose box runs past the storage's end


def _transposed_write(x, v, i):
    x.t()[i % x.shape[1], 2:7] = v[:5]


def _kv_write_and_window(x, v, i):
    cache = x.view(4, 16, 16)  # [heads, positions, head_dim]
    p = i % 12
    cache[:, p + 4] = v.expand(4, 16)
    return cache[:, p:p + 4].sum(1)


def _overlapping_read(x, v, i):
    return x.view(-1).as_strided((5, 4), (2, 1), i) * 1  # overlapping rows: a gather


def _flipped_read(x, v, i):
    return x[i].flip(0) + x[i + 1]


CASES = {
    "select_read": lambda x, v, i: x.select(0, i) + 1,
    "narrow_read": lambda x, v, i: x.narrow(0, i, 2) * 3,
    "slice_read": lambda x, v, i: x[i:i + 5, 1:9].sum(0),
    "setitem_int": _setitem,
    "slice_mul_": _slice_mul_,
    "row_update": _row_update,
    "column_add_": _column_add_,
    "transposed_write": _transposed_write,
    "kv_write_window": _kv_write_and_window,
    "overlapping_read": _overlapping_read,
    "flipped_read": _flipped_read,
    "roll_dim": lambda x, v, i: torch.roll(x, i, 0),
    "roll_flat": lambda x, v, i: torch.roll(x, -3 * i),
    "roll_dims": lambda x, v, i: torch.roll(x, (i, 2 - i), (0, 1)),
    "triu": lambda x, v, i: torch.triu(x, i - 6),
    "tril": lambda x, v, i: torch.tril(x, 4 - i),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loop_one_program_per_op(name):
    f = CASES[name]
    torch.manual_seed(0)
    xc, vc = torch.randn(64, 16), torch.randn(16)
    xt, vt = xc.to("tpu"), vc.to("tpu")
    f(xt, vt, 0)  # builds this op shape's programs
    f(xc, vc, 0)
    torch.tpu.synchronize()
    before = programs_built()
    for i in range(1, 20):
        rt, rc = f(xt, vt, i), f(xc, vc, i)
        if rc is not None:
            torch.testing.assert_close(rt.cpu(), rc, rtol=1e-6, atol=1e-6, msg=f"{name} at {i}")
    built = programs_built() - before
    assert built == 0, f"{name}: {built} more programs for 19 more positions"
    torch.testing.assert_close(xt.cpu(), xc, rtol=1e-6, atol=1e-6)


def test_loop_values_shifts_and_diagonals_against_cpu():
    """Every shift and diagonal sign, in every dtype class, and empty and
    single-element dims (nothing to roll)."""
    x = torch.arange(5 * 7 * 3).reshape(5, 7, 3)
    for dt in (torch.int64, torch.float32, torch.bool, torch.bfloat16):
        xc = x.to(dt) if dt is not torch.bool else x % 3 == 0
        xt = xc.to("tpu")
        for s in (-13, -7, -1, 0, 1, 3, 7, 12, 40):
            assert torch.equal(torch.roll(xt, s).cpu(), torch.roll(xc, s))
            assert torch.equal(torch.roll(xt, s, 1).cpu(), torch.roll(xc, s, 1))
            assert torch.equal(torch.roll(xt, (s, -s), (0, 2)).cpu(), torch.roll(xc, (s, -s), (0, 2)))
            assert torch.equal(torch.triu(xt.transpose(0, 2), s).cpu(), torch.triu(xc.transpose(0, 2), s))
            assert torch.equal(torch.tril(xt, s).cpu(), torch.tril(xc, s))
    e = torch.empty(0, 3, device="tpu")
    assert torch.roll(e, 2, 0).shape == (0, 3)
    one = torch.randn(1, 4)
    assert torch.equal(torch.roll(one.to("tpu"), 5, 0).cpu(), one)


def test_compiled_graph_keeps_python_int_semantics():
    """Compiled graphs get integers as constants (Dynamo's own
    specialisation); the rules read them the same way."""
    x = torch.randn(6, 6)
    f = torch.compile(lambda a, s: torch.roll(a, s, 0) + torch.triu(a, s), backend="tpu")
    for s in (1, 2, -3):
        torch.testing.assert_close(f(x.to("tpu"), s).cpu(), torch.roll(x, s, 0) + torch.triu(x, s))


def test_compiled_graph_of_views_at_offsets():
    """A compiled function called on views of one storage at different
    offsets: the graph's program reads each at its own offset."""
    x = torch.randn(32, 8)
    xt = x.to("tpu")
    f = torch.compile(lambda a: a * 2 + 1, backend="tpu")
    for i in range(0, 30, 7):
        torch.testing.assert_close(f(xt[i:i + 2]).cpu(), x[i:i + 2] * 2 + 1)


def test_static_argument_loop_warns_naming_op_and_argument():
    x = torch.randn(4, 4, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(12):  # a pad width shapes the result: it stays in the program
            torch.nn.functional.pad(x, (i, 0))
    msgs = [str(m.message) for m in w if "eager programs" in str(m.message)]
    assert len(msgs) == 1, msgs
    assert "aten::constant_pad_nd" in msgs[0] and "'pad'" in msgs[0], msgs[0]
    assert w[[str(m.message) for m in w].index(msgs[0])].filename == __file__
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(12):  # positions are operands: no program per value, no warning
            x[i % 4] = float(i)
            torch.roll(x, i, 1)
    assert not [m for m in w if "eager programs" in str(m.message)]


def test_static_shape_loop_warns_with_bucket_advice():
    x = torch.randn(80, 3, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(1, 70):
            x[:i].sum()
    msgs = [str(m.message) for m in w if "eager programs" in str(m.message)]
    assert len(msgs) == 1 and "aten::sum" in msgs[0] and "'self'" in msgs[0] and "bucket" in msgs[0], msgs


def test_metrics_count_programs_not_values():
    """The public counters show the loop's programs: one per op shape."""
    x = torch.zeros(100, 8, device="tpu")
    v = torch.ones(8, device="tpu")
    x[0] = v * 1
    before = torch_pjrt.metrics()["cache_misses"]
    for t in range(1, 100):
        x[t] = v * t
    assert torch_pjrt.metrics()["cache_misses"] - before == 0
    assert torch.equal(x.cpu()[:, 0], torch.arange(100.0).clamp(min=1))
