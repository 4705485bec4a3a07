"""Indexing raises what the CPU raises, where the CPU raises it (issue 44):
"tpu" against the CPU for each class PyTorch's own test_indexing.py found
(exception types and messages, host-known bounds checked at the op, the
uint8-mask warning, index_copy_'s 0-dim forms, index_reduce in low precision)."""
import warnings

import pytest
import torch

from util import to_tpu


def outcome(fn, device):
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = fn(device)
            if isinstance(r, torch.Tensor):
                r = r.cpu()
        return "ok", r, [str(m.message).split(" (Triggered internally")[0] for m in w
                         if "torch-pjrt" not in str(m.message)]
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e).split("\n")[0], []


def _setitem(x, idx, v):
    x[idx] = v
    return x


CASES = {
    # IndexError where the meta functions raise RuntimeError
    "unbroadcastable_indices": lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]],
    "false_with_list": lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...],
    "float_index": lambda d: torch.tensor([1, 2, 3], device=d)[torch.tensor([], device=d)],
    "no_indices": lambda d: torch.ops.aten.index.Tensor(torch.zeros(3, device=d), []),
    # messages
    "empty_dim": lambda d: torch.empty(10, 0, device=d)[:, [0, 1]],
    "index_fill_complex": lambda d: torch.zeros(3, device=d).index_fill_(0, torch.tensor([0], device=d), 1j),
    "index_select_empty_dim": lambda d: torch.zeros(0, 3, device=d).index_select(0, torch.tensor([0], device=d)),
    "mask_put_dtype_and_shape": lambda d: _setitem(torch.arange(4, device=d), torch.arange(4, device=d) > -1,
                                                   torch.tensor([]).to(d)),
    "mask_put_count": lambda d: _setitem(torch.zeros(5, 3, device=d),
                                         torch.tensor([True, False, True, False, False], device=d),
                                         torch.ones(3, 3, device=d)),
    "mask_wrong_shape": lambda d: torch.zeros(4, 2, device=d)[torch.tensor([True, False], device=d)],
    # bounds known on the host: at the op
    "list_out_of_range": lambda d: torch.zeros(10, device=d)[[10]],
    "list_negative_out_of_range": lambda d: torch.zeros(5, 4, device=d)[:, [1, -5]],
    "cpu_tensor_out_of_range": lambda d: torch.zeros(5, device=d)[torch.tensor([1, 7])],
    "setitem_list_out_of_range": lambda d: _setitem(torch.zeros(10, device=d), [11], 1.0),
    "index_put_out_of_range": lambda d: torch.zeros(5, device=d).index_put_((torch.tensor([1, 7]).to(d),),
                                                                            torch.tensor(1.).to(d)),
    # index_copy_: what the CPU accepts, and its words for what it does not
    "index_copy_scalar_source": lambda d: torch.zeros(3, device=d).index_copy_(0, torch.tensor([1], device=d),
                                                                               torch.tensor(5., device=d)),
    "index_copy_scalar_index": lambda d: torch.zeros(3, device=d).index_copy_(0, torch.tensor(1, device=d),
                                                                              torch.tensor(5., device=d)),
    "index_copy_scalar_self": lambda d: torch.zeros((), device=d).index_copy_(0, torch.tensor([0], device=d),
                                                                              torch.tensor([5.], device=d)),
    "index_copy_2d_index": lambda d: torch.zeros(3, device=d).index_copy_(0, torch.tensor([[1]], device=d),
                                                                          torch.ones(1, device=d)),
    "index_copy_slices": lambda d: torch.zeros(3, 2, 4, device=d).index_copy_(1, torch.tensor([1], device=d),
                                                                              torch.ones(3, 1, 5, device=d)),
    "index_copy_dims": lambda d: torch.zeros(3, 2, device=d).index_copy_(0, torch.tensor([1], device=d),
                                                                         torch.ones(2, device=d)),
    "index_copy_scalar_many": lambda d: torch.zeros(3, device=d).index_copy_(0, torch.tensor([1, 2], device=d),
                                                                             torch.tensor(1., device=d)),
    "index_copy_count": lambda d: torch.zeros(3, device=d).index_copy_(0, torch.tensor([1, 2], device=d),
                                                                       torch.ones(3, device=d)),
    # the deprecation warning of uint8 masks
    "uint8_mask": lambda d: torch.arange(3.0, device=d)[torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)],
    # (x[uint8_mask] = 7.0 raises on the CPU only: its setitem takes a masked_fill_
    # fast path for CPU and CUDA tensors, whose mask must be bool; other devices
    # get index_put_, which takes the mask with the warning, as here.)
    "uint8_mask_put_tensor": lambda d: _setitem(torch.arange(3.0, device=d),
                                                torch.tensor([1, 0, 1], dtype=torch.uint8, device=d),
                                                torch.tensor([7.0, 8.0], device=d)),
    "masked_fill_long_mask": lambda d: torch.zeros(3, device=d).masked_fill_(torch.zeros(3, dtype=torch.long,
                                                                                         device=d), 1.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_indexing_like_the_cpu(name):
    cpu = outcome(CASES[name], "cpu")
    tpu = outcome(CASES[name], "tpu")
    assert tpu[0] == cpu[0], f"{name}: tpu {tpu[:2]} vs cpu {cpu[:2]}"
    if cpu[0] == "ok":
        assert torch.equal(tpu[1], cpu[1]), f"{name}: {tpu[1]} vs {cpu[1]}"
    else:
        assert tpu[1] == cpu[1], f"{name}: message\n  tpu: {tpu[1]}\n  cpu: {cpu[1]}"
    assert tpu[2] == cpu[2], f"{name}: warnings {tpu[2]} vs {cpu[2]}"
    torch.tpu.synchronize()  # nothing deferred is left behind


def test_uint8_warning_points_at_the_user_line():
    x = torch.arange(3.0, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        x[torch.tensor([1, 0, 1], dtype=torch.uint8, device="tpu")]
    assert [m.filename for m in w if "uint8" in str(m.message)] == [__file__]


def test_device_computed_index_is_checked_later_naming_the_op():
    """An index the device computed is checked by the program (as CUDA's
    device-side asserts); the error names the op that found it and does not
    stay behind for an unrelated later op."""
    a = torch.zeros(5, device="tpu")
    i = torch.ones(20, dtype=torch.long, device="tpu")
    i[-1] = 10  # a device write: the host no longer has the values
    y = a[i]
    with pytest.raises(IndexError, match=r"index 10 is out of bounds for dimension 0 with size 5.*aten::index"):
        y.cpu()
    assert (a + 1).cpu().sum().item() == 5  # cleared: the next op is fine


def test_host_values_dropped_after_a_device_write():
    """An uploaded index tensor changed on the device is not checked against
    its old host values (which were in range)."""
    a = torch.zeros(5, device="tpu")
    j = torch.tensor([1, 2, 3]).to("tpu")
    j.add_(10)
    with pytest.raises(IndexError, match="index 11 is out of bounds"):
        a[j]
        torch.tpu.synchronize()


# Ops whose rules declare their index bounds on an index argument
# (lw_check_arg): the engine checks host-known values before launch.
HOST_CHECKED = {
    "index_select": lambda x, i: x.index_select(0, i),
    "index_select_dim1": lambda x, i: x.index_select(1, i),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x),
    "gather": lambda x, i: x.gather(1, i.view(1, -1).expand(3, -1)),
    "take": lambda x, i: x.take(i),
    "put_": lambda x, i: x.clone().put_(i, torch.ones(i.shape, device=x.device)),
    "index_fill_": lambda x, i: x.clone().index_fill_(0, i, 1.0),
    "index_add_": lambda x, i: x.clone().index_add_(0, i, torch.ones(len(i), 4, device=x.device)),
    "index_copy_": lambda x, i: x.clone().index_copy_(0, i, torch.ones(len(i), 4, device=x.device)),
    "scatter_": lambda x, i: x.clone().scatter_(1, i.view(1, -1), 1.0),
}


@pytest.mark.parametrize("name", sorted(HOST_CHECKED))
@pytest.mark.parametrize("bad", [[0, 12], [1, -13], [2, 1]], ids=["above", "below", "in_range"])
def test_host_known_index_raises_at_the_op(name, bad):
    """An index uploaded from a list is checked before launch, with the
    CPU's exception and message, on the first call (the Python kernel) and on
    the repeated ones (the C++ fast path), without waiting for the device."""
    fn = HOST_CHECKED[name]
    x = torch.arange(12.0).view(3, 4)
    try:
        want = ("ok", fn(x, torch.tensor(bad)))
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        want = (type(e), str(e))
    xt = x.to("tpu")
    for _ in range(3):
        try:
            got = ("ok", fn(xt, torch.tensor(bad, device="tpu")))  # raises here, or not at all
        except Exception as e:  # noqa: BLE001
            got = (type(e), str(e))
        torch.tpu.synchronize()  # nothing deferred is left behind
        assert got[0] == want[0], (got, want)
        if got[0] == "ok":
            torch.testing.assert_close(got[1].cpu(), want[1])
        else:
            assert got[1] == want[1]


def test_device_computed_index_of_index_select_is_deferred():
    """The same ops with indices the device computed keep the program's
    check, which names the op."""
    x = torch.zeros(3, 4, device="tpu")
    i = torch.tensor([0, 1], device="tpu") + 5
    y = x.index_select(0, i)
    with pytest.raises(IndexError, match=r"index out of range in self.*aten::index_select"):
        y.cpu()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["mean", "prod", "amax"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_low_precision_rounds_as_the_cpu(dtype, reduce, include_self):
    """The CPU's index_reduce combines in the tensor's dtype, rounding after
    each element (index_add and scatter_reduce accumulate in float32)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randn(300, 5, generator=g).to(dtype)
    idx = torch.randint(0, 7, (300,), generator=g)
    base = torch.randn(7, 5, generator=g).to(dtype)
    expected = base.index_reduce(0, idx, src, reduce, include_self=include_self)
    actual = to_tpu(base).index_reduce(0, to_tpu(idx), to_tpu(src), reduce, include_self=include_self)
    assert torch.equal(actual.cpu(), expected)
