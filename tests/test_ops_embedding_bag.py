"""nn.functional.embedding_bag on "tpu" against PyTorch on CPU: the four
outputs of aten::_embedding_bag / _embedding_bag_forward_only, the weight and
per_sample_weights gradients (_embedding_bag_backward, _dense_backward,
_per_sample_weights_backward), argument errors, and a small DLRM-style model
trained on both devices (rules in csrc/core/lower_shape.c, output shapes in
torch_pjrt/_dispatch.py)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from util import lowered

aten = torch.ops.aten

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I64, I32 = torch.int64, torch.int32

# (rtol, atol) for values.  Sums accumulate in float32 (float64 for float64)
# on both devices and are rounded once, so float16/bfloat16 results are
# normally bit-equal; float32 sums may differ in the order of additions.
TOL = {F32: (1e-5, 1e-6), F64: (1e-12, 1e-12), F16: (1e-3, 1e-5), BF16: (8e-3, 1e-5)}
# Gradients of float16/bfloat16: the CPU kernel rounds after every addition
# into a weight row, the rule once.
GRAD_TOL = {F32: (1e-5, 1e-5), F64: (1e-12, 1e-12), F16: (4e-3, 1e-3), BF16: (3e-2, 1e-2)}

BAG_RULES = {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"}


def rnd(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(5000 + seed)
    return torch.randn(*shape, generator=g).to(dtype)


def ints(high, n, seed=0, dtype=I64):
    g = torch.Generator().manual_seed(6000 + seed)
    return torch.randint(0, high, (n,), generator=g, dtype=dtype)


def tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def close(actual, expected, tol, msg=""):
    assert actual.device.type == "tpu", msg
    assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} vs {expected.dtype}"
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    if expected.dtype.is_floating_point:
        rtol, atol = tol
        torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True, msg=msg or None)
    else:
        assert torch.equal(actual.cpu(), expected), f"{msg}: {actual.cpu().tolist()} vs {expected.tolist()}"


def check_bag(op, w, idx, off, *rest, tol=None, tpu_args=None):
    """Run the op on CPU and tpu; all four outputs must match (index outputs exactly)."""
    expected = op(w, idx, off, *rest)
    with lowered() as names:
        actual = op(*(tpu_args or (tpu(w), tpu(idx), tpu(off), *map(tpu, rest))))
    assert names & BAG_RULES, sorted(n for n in names if n)
    for k, (a, e) in enumerate(zip(actual, expected)):
        close(a, e, tol or TOL[w.dtype], f"{op} output {k} args {rest}")
    return actual


def test_rules_are_registered():
    from torch_pjrt import _C

    for name in ["aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::_embedding_bag_backward",
                 "aten::_embedding_bag_dense_backward", "aten::_embedding_bag_per_sample_weights_backward"]:
        assert _C.has_lowering(name), name


# ---- forward: all four outputs -----------------------------------------------------------------

# indices 0..9, bags [0, 2), [2, 2) (empty), [2, 5), [5, 8), and two entries
# after offsets[-1] (which include_last_offset leaves out on the CPU's fast
# path but counts in the last bag elsewhere); index 4 is repeated.
IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 4, 0])
OFF = torch.tensor([0, 2, 2, 5, 8])


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
def test_forward_outputs(dtype, mode):
    w = rnd(10, 3, dtype=dtype)
    for pad, ilo in ((-1, False), (-1, True), (4, False), (0, True)):
        check_bag(aten._embedding_bag, w, IDX, OFF, False, mode, False, None, ilo, pad)
    if dtype in (F32, BF16):
        # forward_only: bag_size has one entry per offset in mode sum
        for pad, ilo in ((-1, True), (4, False)):
            check_bag(aten._embedding_bag_forward_only, w, IDX, OFF, False, mode, False, None, ilo, pad)


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("itype,otype", [(I32, I32), (I32, I64), (I64, I32)])
def test_forward_index_dtypes(mode, itype, otype):
    # the index outputs get the promoted dtype of indices and offsets
    w = rnd(10, 3)
    check_bag(aten._embedding_bag, w, IDX.to(itype), OFF.to(otype), False, mode, False, None, True, 2)
    check_bag(aten._embedding_bag, w, IDX.to(itype), OFF.to(otype), False, mode, False, None, False, -1)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_forward_per_sample_weights(dtype):
    w, psw = rnd(10, 3, dtype=dtype), rnd(10, dtype=dtype, seed=1)
    for pad in (-1, 4):
        for ilo in (False, True):
            for op in (aten._embedding_bag, aten._embedding_bag_forward_only):
                check_bag(op, w, IDX, OFF, False, 0, False, psw, ilo, pad)


def test_forward_slow_path_of_strided_weight():
    # weight rows with stride(1) != 1: the CPU kernel's slow path, which
    # computes offset2bag in mode sum too (and, with include_last_offset,
    # counts the entries after offsets[-1] in the last bag)
    w = rnd(3, 10).t()
    assert w.stride(1) != 1
    for mode in (0, 2):
        for ilo in (False, True):
            check_bag(aten._embedding_bag, w, IDX, OFF, False, mode, False, None, ilo, -1)
    # per_sample_weights with a stride: the slow path as well
    psw = rnd(20, seed=3)
    args = (False, 0, False, psw[::2], True, -1)
    t_args = (tpu(rnd(10, 3)), tpu(IDX), tpu(OFF), False, 0, False, tpu(psw)[::2], True, -1)
    check_bag(aten._embedding_bag, rnd(10, 3), IDX, OFF, *args, tpu_args=t_args)


def test_forward_max_ties_nan_and_signed_zero():
    w = torch.tensor([[1.0, 0.0, float("nan"), -2.0],
                      [1.0, -0.0, 3.0, float("-inf")],
                      [float("nan"), 0.0, 5.0, -1.0],
                      [0.5, -0.0, float("nan"), -3.0]])
    idx = torch.tensor([0, 1, 3, 1, 0, 2, 3, 1, 2, 3, 3])
    off = torch.tensor([0, 3, 5, 5, 8])
    for ilo in (False, True):
        out = check_bag(aten._embedding_bag, w, idx, off, False, 2, False, None, ilo, -1)
        # signed zeros are kept: the first of equal maxima wins
        exp = aten._embedding_bag(w, idx, off, False, 2, False, None, ilo, -1)[0]
        assert torch.equal(torch.signbit(out[0].cpu()), torch.signbit(exp))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_functional_2d_input_fixed_size_bags(mode):
    w = rnd(12, 5)
    idx = torch.tensor([[0, 3, 3, 11], [5, 1, 0, 2], [7, 7, 7, 7]])
    for pad in (None, 7):
        exp = F.embedding_bag(idx, w, mode=mode, padding_idx=pad)
        with lowered() as names:
            got = F.embedding_bag(tpu(idx), tpu(w), mode=mode, padding_idx=pad)
        assert names & BAG_RULES
        close(got, exp, TOL[F32], f"{mode} pad {pad}")


def test_empty_bags_and_empty_inputs():
    w = rnd(6, 3)
    for mode in (0, 1, 2):
        for op in (aten._embedding_bag, aten._embedding_bag_forward_only):
            # no indices at all; bags all empty
            check_bag(op, w, torch.tensor([], dtype=I64), torch.tensor([0, 0, 0]), False, mode, False, None, False, -1)
            # no bags (with indices only in mode sum: elsewhere the CPU kernel
            # writes to bag -1 and may crash)
            idx = torch.tensor([1, 2]) if mode == 0 else torch.tensor([], dtype=I64)
            check_bag(op, w, idx, torch.tensor([], dtype=I64), False, mode, False, None, False, -1)
            check_bag(op, w, idx, torch.tensor([0]), False, mode, False, None, True, -1)
            # only padding in a bag (bag_size 0: mean divides by 1)
            check_bag(op, w, torch.tensor([2, 2, 1, 2]), torch.tensor([0, 2, 2]), False, mode, False, None, False, 2)
    # EmbeddingBag's own zero-length bag
    exp = F.embedding_bag(torch.tensor([3, 1, 4]), w, torch.tensor([0, 0, 3]), mode="mean")
    got = F.embedding_bag(tpu(torch.tensor([3, 1, 4])), tpu(w), tpu(torch.tensor([0, 0, 3])), mode="mean")
    close(got, exp, TOL[F32])


def test_large_random_bags():
    # many bags of random sizes, a repeated padding index, every dtype path
    g = torch.Generator().manual_seed(7)
    sizes = torch.randint(0, 9, (64,), generator=g)
    off = torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)[:-1]])
    idx = torch.randint(0, 200, (int(sizes.sum()),), generator=g)
    idx[::7] = 13
    for dtype, mode, pad in ((F32, 0, -1), (F32, 1, 13), (F32, 2, 13), (BF16, 0, -1), (F16, 1, -1), (BF16, 2, -1)):
        w = rnd(200, 16, dtype=dtype, seed=4)
        check_bag(aten._embedding_bag, w, idx, off, False, mode, False, None, False, pad)


# ---- gradients -----------------------------------------------------------------------------------


def grads(dev, w, idx, off, g, psw=None, **kw):
    w = w.detach().to(dev).requires_grad_()
    p = None if psw is None else psw.detach().to(dev).requires_grad_()
    out = F.embedding_bag(idx.to(dev), w, None if off is None else off.to(dev), per_sample_weights=p, **kw)
    out.backward(g.to(dev))
    return out, w.grad, None if p is None else p.grad


def check_grads(w, idx, off, psw=None, tol=None, **kw):
    B = (idx.shape[0] if idx.dim() == 2 else off.shape[0] - kw.get("include_last_offset", False))
    g = rnd(B, w.shape[1], dtype=w.dtype, seed=9)
    exp = grads("cpu", w, idx, off, g, psw, **kw)
    with lowered() as names:
        got = grads("tpu", w, idx, off, g, psw, **kw)
    assert "aten::_embedding_bag_backward" in names, sorted(n for n in names if n)
    if psw is not None:
        assert "aten::_embedding_bag_per_sample_weights_backward" in names
    for what, a, e, t in zip(("output", "weight grad", "per_sample_weights grad"), got, exp,
                             (TOL[w.dtype], tol or GRAD_TOL[w.dtype], tol or GRAD_TOL[w.dtype])):
        if e is not None:
            close(a, e, t, f"{what} {kw}")


# include_last_offset=True with offsets[-1] == len(indices), as the
# documentation asks (after it the CPU backward reads out of bounds).
OFF_ILO = torch.tensor([0, 2, 2, 5, 8, 10])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("pad", [None, 4])
@pytest.mark.parametrize("ilo", [False, True])
def test_weight_grad(mode, pad, ilo):
    w = rnd(10, 4)
    off = OFF_ILO if ilo else OFF
    for sgbf in ((False, True) if mode != "max" else (False,)):
        check_grads(w, IDX, off, mode=mode, padding_idx=pad, include_last_offset=ilo, scale_grad_by_freq=sgbf)


@pytest.mark.parametrize("pad", [None, 4])
@pytest.mark.parametrize("ilo", [False, True])
def test_per_sample_weights_grad(pad, ilo):
    w, psw = rnd(10, 4), rnd(10, seed=2)
    off = OFF_ILO if ilo else OFF
    for sgbf in (False, True):
        check_grads(w, IDX, off, psw, mode="sum", padding_idx=pad, include_last_offset=ilo, scale_grad_by_freq=sgbf)


@pytest.mark.parametrize("dtype", [F16, BF16, F64])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_grad_low_precision(dtype, mode):
    w = rnd(10, 4, dtype=dtype)
    check_grads(w, IDX, OFF, mode=mode, padding_idx=4)
    check_grads(w, IDX, OFF, mode=mode)
    if mode == "sum":
        check_grads(w, IDX, OFF, rnd(10, dtype=dtype, seed=2), mode="sum")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_grad_2d_input_and_int32(mode):
    w = rnd(12, 5)
    idx = torch.tensor([[0, 3, 3, 11], [5, 1, 0, 2], [7, 7, 7, 7]], dtype=I32)
    check_grads(w, idx, None, mode=mode, padding_idx=7)
    check_grads(w, IDX.to(I32), OFF.to(I32), mode=mode)
    if mode == "sum":
        check_grads(w, idx, None, rnd(3, 4, seed=5), mode="sum")


class _Bag(nn.Module):
    def __init__(self, w, **kw):
        super().__init__()
        self.w, self.kw = nn.Parameter(w.clone()), kw

    def forward(self, idx, off, psw):
        return F.embedding_bag(idx, self.w, off, per_sample_weights=psw, **self.kw)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("case", ["1d", "2d", "ilo", "pad", "psw"])
def test_compiled_bags_match_cpu(mode, case):
    # Compiled graphs carry PyTorch's meta shapes, which are CUDA's (bag_size
    # one entry per offset, max_indices empty but for max, offset2bag never
    # empty): forward and gradients must still be the CPU's.
    if case == "psw" and mode != "sum":
        pytest.skip("per_sample_weights need mode='sum'")
    import torch._dynamo
    w, idx, off, psw = rnd(10, 4), IDX, OFF, None
    kw = dict(mode=mode)
    if case == "2d":
        idx, off = IDX[:9].view(3, 3), None
    if case == "ilo":
        off, kw["include_last_offset"] = OFF_ILO, True
    if case == "pad":
        kw["padding_idx"] = 4
    if case == "psw":
        psw = rnd(10, seed=2).requires_grad_()
    ref = _Bag(w, **kw)
    out = ref(idx, off, psw)
    g = rnd(*out.shape, seed=9)
    out.backward(g)
    torch._dynamo.reset()
    model = _Bag(w, **kw).to("tpu")
    p = None if psw is None else psw.detach().to("tpu").requires_grad_()
    got = torch.compile(model, backend="tpu", fullgraph=True)(idx.to("tpu"), tpu(off), p)
    got.backward(g.to("tpu"))
    close(got, out.detach(), TOL[F32], "output")
    close(model.w.grad, ref.w.grad, GRAD_TOL[F32], "weight grad")
    if psw is not None:
        close(p.grad, psw.grad, GRAD_TOL[F32], "per_sample_weights grad")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_entries_after_the_last_offset(mode, compiled):
    # include_last_offset=True with indices after offsets[-1]: the CPU's
    # forward leaves them out (sum and mean); its backward gives them no
    # gradient for sum (on the CPU it reads past the end of grad there, so
    # its values are garbage) and counts them in the last bag for mean.
    import torch._dynamo
    w, idx, off = rnd(10, 4), torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.tensor([0, 2, 4])
    ref = _Bag(w, mode=mode, include_last_offset=True)
    model = _Bag(w, mode=mode, include_last_offset=True).to("tpu")
    torch._dynamo.reset()
    fn = torch.compile(model, backend="tpu", fullgraph=True) if compiled else model
    got = fn(idx.to("tpu"), off.to("tpu"), None)
    g = rnd(2, 4, seed=9)
    got.backward(g.to("tpu"))
    out = ref(idx, off, None)
    close(got, out.detach(), TOL[F32], "output")
    if mode == "sum":
        # the gradient of the bags without the trailing entries
        ref = _Bag(w, mode=mode)
        ref(idx[:4], off[:2], None).backward(g)
    else:
        out.backward(g)
    close(model.w.grad, ref.w.grad, GRAD_TOL[F32], "weight grad")


def test_scale_grad_by_freq_follows_cpu():
    # PyTorch's CPU kernel divides index v's gradient by counts[sorted[r]],
    # r being v's rank among the distinct indices (not by counts[v]): for
    # indices [1, 1, 2, 3, 3, 3] rows 2 and 3 get 1/2 and 3 instead of 1 and 1.
    # The rule reproduces it.
    w = rnd(5, 2)
    idx, off = torch.tensor([1, 1, 2, 3, 3, 3]), torch.tensor([0, 3])
    for mode in ("sum", "mean"):
        check_grads(w, idx, off, mode=mode, scale_grad_by_freq=True)
    g = torch.ones(2, 2)
    o2b, bs = torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([3, 3])
    exp = aten._embedding_bag_dense_backward(g, idx, o2b, bs, bs, 5, True, 0, None, -1)
    assert exp[:, 0].tolist() == [0.0, 1.0, 0.5, 3.0, 0.0]
    got = aten._embedding_bag_dense_backward(*map(tpu, (g, idx, o2b, bs, bs)), 5, True, 0, None, -1)
    close(got, exp, GRAD_TOL[F32])


def test_backward_ops_direct():
    g, w = rnd(4, 3, seed=1), rnd(10, 3)
    o2b = torch.tensor([0, 0, 2, 2, 2, 3, 3, 3, 3, 3])
    bs = torch.tensor([2, 0, 3, 5])
    mi = torch.tensor([[1, 2, 1], [0, 0, 0], [4, 5, 4], [3, 9, 0]])
    psw = rnd(10, seed=2)
    for mode in (0, 1, 2):
        for sgbf in (False, True):
            for pad, p in ((-1, None), (4, None), (-1, psw)):
                if p is not None and mode != 0:
                    continue
                args = (IDX, o2b, bs, mi, 10, sgbf, mode, p, pad)
                exp = aten._embedding_bag_dense_backward(g, *args)
                close(aten._embedding_bag_dense_backward(tpu(g), *map(tpu, args)), exp, GRAD_TOL[F32])
    for pad in (-1, 4):
        for o in (o2b, torch.tensor([], dtype=I64)):  # empty: recomputed from the offsets
            args = (g, w, IDX, OFF[:4], o, 0, pad)
            exp = aten._embedding_bag_per_sample_weights_backward(*args)
            close(aten._embedding_bag_per_sample_weights_backward(*map(tpu, args)), exp, GRAD_TOL[F32])


def test_no_host_reads():
    # static shapes: the number of bags comes from offsets' length; nothing is
    # read back to the host, forward or backward
    from torch_pjrt import _C

    reads = []
    read_host = _C.read_host

    def spy(*a):
        reads.append(a)
        return read_host(*a)

    w = tpu(rnd(10, 4)).requires_grad_()
    psw = tpu(rnd(10, seed=2)).requires_grad_()
    _C.read_host = spy
    try:
        for mode, p in (("sum", psw), ("mean", None), ("max", None)):
            out = F.embedding_bag(tpu(IDX), w, tpu(OFF), mode=mode, per_sample_weights=p, padding_idx=4)
            out.sum().backward()
    finally:
        _C.read_host = read_host
    assert reads == []


def test_sparse_gradient_is_not_supported():
    w = tpu(rnd(10, 4)).requires_grad_()
    out = F.embedding_bag(tpu(IDX), w, tpu(OFF), sparse=True)  # the forward is fine
    close(out.detach(), F.embedding_bag(IDX, rnd(10, 4), OFF), TOL[F32])
    with pytest.raises(NotImplementedError, match="sparse=True"):
        out.sum().backward()


# ---- errors ----------------------------------------------------------------------------------------


def _error(fn, dev):
    T = lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x  # noqa: E731
    try:
        fn(T)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


W5, I6, O2 = rnd(5, 2), torch.tensor([1, 1, 2, 3, 3, 3]), torch.tensor([0, 3])


@pytest.mark.parametrize("fn", [
    lambda T: aten._embedding_bag(T(W5), T(I6.float()), T(O2)),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2.double())),
    lambda T: aten._embedding_bag(T(W5.int()), T(I6), T(O2)),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2.view(1, 2))),
    lambda T: aten._embedding_bag(T(W5), T(I6.view(1, 2, 3)), T(O2)),
    lambda T: aten._embedding_bag(T(W5[0]), T(I6), T(O2)),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2), False, 1, False, T(torch.ones(6))),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2), False, 0, False, T(torch.ones(6, dtype=F64))),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2), False, 0, False, T(torch.ones(5))),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2), False, 0, False, T(torch.ones(2, 3))),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2[:0]), False, 0, False, None, True),
    lambda T: aten._embedding_bag(T(W5), T(I6), T(O2), False, 3),
    lambda T: aten._embedding_bag_forward_only(T(W5), T(I6), T(O2), False, -1),
    lambda T: F.embedding_bag(T(I6), T(W5), T(O2), mode="max", per_sample_weights=T(torch.ones(6))),
    lambda T: F.embedding_bag(T(I6.view(2, 3)), T(W5), T(O2)),
    lambda T: F.embedding_bag(T(I6), T(W5), T(O2), padding_idx=5),
    lambda T: aten._embedding_bag_per_sample_weights_backward(T(torch.ones(2, 2)), T(W5), T(I6), T(O2), T(I6), 1, -1),
])
def test_errors_like_cpu(fn):
    exp = _error(fn, "cpu")
    assert exp is not None
    assert _error(fn, "tpu") == exp


def test_backward_dtype_error():
    # PyTorch's meta function words it differently; the type is the CPU's
    def fn(T):
        g = T(torch.ones(2, 2, dtype=torch.int32))
        aten._embedding_bag_dense_backward(g, T(I6), T(I6), T(O2), T(O2), 5, False, 0, None, -1)
    assert _error(fn, "tpu")[0] is _error(fn, "cpu")[0] is RuntimeError


def test_2d_indices_to_the_aten_op_are_refused_clearly():
    with pytest.raises(NotImplementedError, match="2-D indices"):
        aten._embedding_bag(tpu(W5), tpu(I6.view(2, 3)), tpu(torch.tensor([0, 1])))


# ---- a small DLRM-style model ------------------------------------------------------------------------


class TinyDLRM(nn.Module):
    """Dense features through a bottom MLP; three EmbeddingBag tables (sum
    with per-sample weights, mean with padding_idx on 2-D input, max with
    include_last_offset); pairwise dot interactions; a top MLP."""

    def __init__(self, dense=4, dim=8):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        self.t_sum = nn.EmbeddingBag(40, dim, mode="sum")
        self.t_mean = nn.EmbeddingBag(30, dim, mode="mean", padding_idx=0)
        self.t_max = nn.EmbeddingBag(20, dim, mode="max", include_last_offset=True, scale_grad_by_freq=False)
        n = 4
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, i_sum, o_sum, w_sum, i_mean, i_max, o_max):
        x = self.bottom(dense)
        feats = [x, self.t_sum(i_sum, o_sum, per_sample_weights=w_sum), self.t_mean(i_mean), self.t_max(i_max, o_max)]
        z = torch.stack(feats, 1)                      # (B, 4, dim)
        inter = torch.bmm(z, z.transpose(1, 2))        # (B, 4, 4)
        iu = torch.triu_indices(4, 4, 1, device=z.device)
        flat = inter[:, iu[0], iu[1]]
        return self.top(torch.cat([x, flat], 1)).squeeze(1)


def _dlrm_batches(batch=6, steps=5):
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(steps):
        sizes = torch.randint(0, 5, (batch,), generator=g)
        o_sum = torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)[:-1]])
        i_sum = torch.randint(0, 40, (int(sizes.sum()),), generator=g)
        w_sum = torch.rand(i_sum.shape, generator=g)
        i_mean = torch.randint(0, 30, (batch, 3), generator=g)
        sizes = torch.randint(1, 4, (batch,), generator=g)
        o_max = torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)])
        i_max = torch.randint(0, 20, (int(sizes.sum()),), generator=g)
        dense = torch.randn(batch, 4, generator=g)
        y = torch.rand(batch, generator=g)
        out.append(((dense, i_sum, o_sum, w_sum, i_mean, i_max, o_max), y))
    return out


def _train(model, dev, batches):
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, y in batches:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(*(t.to(dev) for t in inputs)), y.to(dev))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_tiny_dlrm_trains_like_cpu():
    torch.manual_seed(0)
    ref = TinyDLRM()
    dev_model = TinyDLRM()
    dev_model.load_state_dict(ref.state_dict())
    batches = _dlrm_batches()
    cpu_losses, ref = _train(ref, "cpu", batches)
    with lowered() as names:
        tpu_losses, dev_model = _train(dev_model, "tpu", batches)
    assert {"aten::_embedding_bag", "aten::_embedding_bag_backward"} <= names
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=0)
    for (name, p), q in zip(dev_model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
