"""Index and shape computing ops (csrc/core/lower_shape.c) on "tpu" against
PyTorch on CPU: cat/stack, padding, flip/roll/repeat, tril/triu, gathers and
scatters, advanced indexing and index_put, index_* ops, masked_scatter,
embedding, the *_scatter ops and the range factories."""
import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

from util import assert_close, check, lowered

aten = torch.ops.aten

F32 = torch.float32
BF16 = torch.bfloat16
I64 = torch.int64
I32 = torch.int32


def rnd(*shape, dtype=F32, grad=False, seed=0):
    g = torch.Generator().manual_seed(2000 + seed)
    x = torch.randn(*shape, generator=g)
    if dtype.is_floating_point:
        x = x.to(dtype)
    elif dtype == torch.bool:
        x = x > 0
    else:
        x = (x * 10).to(dtype)
    return x.requires_grad_(grad)


def ints(high, *shape, dtype=I64, seed=0, low=0):
    g = torch.Generator().manual_seed(3000 + seed)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def perm(n, k=None, seed=0):
    """k distinct indices in [0, n) (scatter-replace tests need no duplicates)."""
    g = torch.Generator().manual_seed(4000 + seed)
    p = torch.randperm(n, generator=g)
    return p[: (k if k is not None else n)]


# Ops with CompositeExplicitAutograd(NonFunctional) kernels: PyTorch runs those
# for PrivateUse1 instead of our fallback (they decompose into fills and view
# copies).  Compiled graphs call their rules directly; route them to the
# fallback for this module so the rules are what runs and is tested.
_ROUTED = [
    "constant_pad_nd",
    "repeat",
    "stack",
    "index_put",
    "index_fill.int_Scalar",
    "index_fill.int_Tensor",
    "masked_scatter",
    "embedding",
    "diag_embed",
    "diagonal_scatter",
    "slice_scatter",
    "select_scatter",
    "as_strided_scatter",
    "_unsafe_index.Tensor",
    "_unsafe_index_put",
]


@pytest.fixture(scope="module", autouse=True)
def route_composite_ops():
    from torch_pjrt import _dispatch

    lib = torch.library.Library("aten", "IMPL")
    for name in _ROUTED:
        base, _, ovl = name.partition(".")
        qual = "aten::" + name
        if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "PrivateUse1"):
            continue
        op = getattr(getattr(aten, base), ovl or "default")
        lib.impl(name, functools.partial(_dispatch._fallback, op), "PrivateUse1")
    yield
    lib._destroy()


def check_rule(rule, fn, *args, **kw):
    """check(), and assert that the named lowering rule (or one of a tuple) ran."""
    rules = rule if isinstance(rule, tuple) else (rule,)
    with lowered() as names:
        out = check(fn, *args, **kw)
    assert names & set(rules), f"{rules} did not run (ran: {sorted(n for n in names if n)})"
    return out


PUT = ("aten::_index_put_impl_", "aten::index_put")


def test_rules_are_registered():
    from torch_pjrt import _C

    for name in [
        "aten::cat", "aten::stack", "aten::constant_pad_nd", "aten::flip", "aten::roll", "aten::repeat",
        "aten::tril", "aten::triu", "aten::index_select", "aten::gather", "aten::scatter.src",
        "aten::scatter.value", "aten::scatter_add", "aten::scatter_reduce.two", "aten::index.Tensor",
        "aten::index_put", "aten::_index_put_impl_", "aten::index_add", "aten::index_copy",
        "aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor", "aten::masked_scatter",
        "aten::embedding_dense_backward", "aten::embedding", "aten::diag_embed", "aten::diagonal_scatter",
        "aten::slice_scatter", "aten::select_scatter", "aten::as_strided_scatter", "aten::arange.start_out",
        "aten::linspace.out", "aten::eye.m_out", "aten::eye.out", "aten::take", "aten::put",
        "aten::index_reduce", "aten::scatter.reduce", "aten::scatter.value_reduce",
    ]:
        assert _C.has_lowering(name), name


# ---- cat / stack --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dtype, dim):
    a, b, c = rnd(2, 3, dtype=dtype, grad=True), rnd(2, 3, dtype=dtype, grad=True, seed=1), rnd(2, 3, dtype=dtype, seed=2)
    check_rule("aten::cat", lambda a, b, c: torch.cat([a, b, c], dim), a, b, c, grad=True)


def test_cat_uneven_noncontiguous_and_empty():
    a = rnd(4, 3, grad=True)
    b = rnd(5, 4, seed=1, grad=True)  # transposed below: non-contiguous
    c = rnd(4, 0, seed=2)
    check_rule("aten::cat", lambda a, b, c: torch.cat([a, b.t(), c, a[:, ::2]], 1), a, b, c, grad=True)
    # legacy: 1-D empty tensors are skipped whatever the other shapes
    e = torch.empty(0)
    check_rule("aten::cat", lambda a, e: torch.cat([e, a, e], 0), a, e)
    check_rule("aten::cat", lambda a, e: torch.cat([a, e], -1), a, e)


def test_cat_mixed_dtypes():
    a, b = rnd(2, 3, dtype=I32), rnd(2, 3, dtype=F32, seed=1)
    check_rule("aten::cat", lambda a, b: torch.cat([a, b]), a, b)
    c, d = rnd(3, dtype=torch.bool), rnd(3, dtype=I64)
    check_rule("aten::cat", lambda c, d: torch.cat([c, d]), c, d)
    check_rule("aten::cat", lambda a, e: torch.cat([a, e]), rnd(2, 2, dtype=BF16), rnd(1, 2, dtype=F32))


def test_cat_many():
    xs = [rnd(1, 2, seed=i) for i in range(70)]
    check_rule("aten::cat", lambda *xs: torch.cat(xs), *xs)


def test_cat_0d_rejected_like_cpu():
    with pytest.raises(Exception):
        torch.cat([torch.tensor(1.0).to("tpu")])


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim):
    a, b = rnd(2, 3, grad=True), rnd(2, 3, seed=1, grad=True)
    check_rule("aten::stack", lambda a, b: torch.stack([a, b.exp()], dim), a, b, grad=True)
    check_rule("aten::stack", lambda a, b: torch.stack([a.to(I32), b], dim), a.detach(), b.detach())


# ---- constant_pad_nd -----------------------------------------------------------------


@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 2, 1), (-1, 2), (1, -2, -1, 0), (2, 1, 0, 1, 1, 1)])
def test_constant_pad_nd(pad):
    x = rnd(2, 4, 5, grad=True)
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, pad), x, grad=True)
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, pad, value=-2.5), x.detach())


def test_constant_pad_nd_dtypes():
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, (1, 1), value=7), rnd(3, 3, dtype=I64))
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, (2, -1), value=1.5), rnd(3, 3, dtype=BF16))
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, (1, 0), value=True), rnd(3, 3, dtype=torch.bool))
    # non-contiguous input, NaN value
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x.t(), (1, 1, 0, 2), value=float("nan")), rnd(3, 4))


# ---- flip / roll / repeat / tril / triu -----------------------------------------------------


@pytest.mark.parametrize("dims", [(0,), (1,), (-1, 0), (0, 1, 2)])
def test_flip(dims):
    x = rnd(3, 4, 2, grad=True)
    check_rule("aten::flip", lambda x: torch.flip(x, dims), x, grad=True)
    check_rule("aten::flip", lambda x: torch.flip(x.transpose(0, 1), dims), rnd(4, 3, 2, dtype=I32))


def test_flip_misc():
    check_rule("aten::flip", lambda x: torch.flip(x, (0,)), rnd(5, dtype=torch.bool))
    check_rule("aten::flip", lambda x: torch.rot90(x, 1, (0, 1)), rnd(3, 4))
    check_rule("aten::flip", lambda x: torch.flip(x, (0,)), rnd(5, dtype=BF16))


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-1, 1), (7, -1), ((1, 2), (0, 1)), (3, None), (-11, None), (0, 0)])
def test_roll(shifts, dims):
    x = rnd(3, 5, grad=True)
    if dims is None:
        fn = lambda x: torch.roll(x, shifts)  # noqa: E731
    else:
        fn = lambda x: torch.roll(x, shifts, dims)  # noqa: E731
    check_rule("aten::roll", fn, x, grad=True)
    check_rule("aten::roll", lambda x: fn(x.t()).contiguous(), rnd(5, 3, dtype=I64))


@pytest.mark.parametrize("reps", [(2, 1), (1, 3), (2, 2, 1), (3, 1, 2, 2), (1, 1), (0, 2)])
def test_repeat(reps):
    x = rnd(2, 3, grad=True)
    check_rule("aten::repeat", lambda x: x.repeat(*reps), x, grad=all(r > 0 for r in reps))
    check_rule("aten::repeat", lambda x: x.t().repeat(*reps), rnd(3, 2, dtype=I32))


def test_repeat_scalar():
    check_rule("aten::repeat", lambda x: x.repeat(3, 2), torch.tensor(1.5))


@pytest.mark.parametrize("diag", [0, 1, -1, 3, -5])
def test_tril_triu(diag):
    x = rnd(2, 4, 5, grad=True)
    check_rule("aten::tril", lambda x: torch.tril(x, diag), x, grad=True)
    check_rule("aten::triu", lambda x: torch.triu(x, diag), x, grad=True)
    check_rule("aten::triu", lambda x: torch.triu(x.transpose(-1, -2), diag), rnd(3, 5, 4, dtype=I64))


def test_tril_nan_inf_and_inplace():
    x = torch.tensor([[float("nan"), float("inf")], [-float("inf"), float("nan")]])
    check_rule("aten::tril", lambda x: torch.tril(x), x)
    check_rule("aten::triu", lambda x: torch.triu(x, 1), x)
    check_rule("aten::tril", lambda x: x.clone().tril_(-1), rnd(3, 3, dtype=BF16))
    check_rule("aten::tril", lambda x: torch.tril(x), rnd(3, 3, dtype=torch.bool))


# ---- index_select / gather / take ------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_index_select(dim, dtype):
    x = rnd(4, 5, 3, dtype=dtype, grad=True)
    idx = torch.tensor([0, 2, 2, 1, 0])
    check_rule("aten::index_select", lambda x, i: torch.index_select(x, dim, i), x, idx, grad=True)
    check_rule("aten::index_select", lambda x, i: torch.index_select(x, dim, i), x.detach(), idx.to(I32))


def test_index_select_misc():
    x = rnd(4, 5)
    check_rule("aten::index_select", lambda x, i: x.t().index_select(0, i), x, torch.tensor([4, 0]))
    check_rule("aten::index_select", lambda x, i: x.index_select(1, i), x, torch.tensor(3))  # 0-d index
    check_rule("aten::index_select", lambda x, i: x.index_select(0, i), torch.tensor(2.5), torch.tensor([0]))
    check_rule("aten::index_select", lambda x, i: x.index_select(0, i), rnd(5, dtype=I64), torch.tensor([4, 4, 1]))
    # empty index
    check(lambda x, i: x.index_select(0, i), x, torch.tensor([], dtype=I64))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = rnd(4, 5, grad=True)
    idx = ints(x.shape[dim], 3, 4, seed=dim)
    check_rule("aten::gather", lambda x, i: torch.gather(x, dim, i), x, idx, grad=True)
    check_rule("aten::gather", lambda x, i: torch.gather(x.t().contiguous().t(), dim, i), x.detach().to(BF16), idx)


def test_gather_misc():
    x = rnd(3, 4, 2, dtype=I64)
    check_rule("aten::gather", lambda x, i: torch.gather(x, 2, i), x, ints(2, 3, 4, 5))
    check_rule("aten::gather", lambda x, i: torch.gather(x, 0, i), torch.tensor(4.0), torch.tensor(0))
    check_rule("aten::gather", lambda x, i: torch.gather(x, 1, i), rnd(3, 4), ints(4, 3, 2))


def test_take_put():
    x = rnd(3, 4)
    check_rule("aten::take", lambda x, i: torch.take(x, i), x, torch.tensor([[0, -1], [11, 5]]))
    check_rule("aten::take", lambda x, i: torch.take(x.t(), i), x, torch.tensor([1, 2, -12]))
    src = rnd(2, 2, seed=1)
    check_rule("aten::put", lambda x, i, s: x.put(i, s), x, torch.tensor([[0, -1], [7, 5]]), src)
    check_rule("aten::put", lambda x, i, s: x.clone().put_(i, s, accumulate=True), x, torch.tensor([[0, 0], [-1, 0]]),
               src)


# ---- scatter family ---------------------------------------------------------------------------


def _scatter_index(dim, shape=(3, 4), full=(4, 6), seed=0):
    """A scatter index for self of `full` along dim, unique along dim so
    replace-scatters are deterministic."""
    idx = torch.empty(shape, dtype=I64)
    d = dim % 2
    for j in range(shape[1 - d]):
        p = perm(full[d], shape[d], seed=seed + j)
        if d == 0:
            idx[:, j] = p
        else:
            idx[j, :] = p
    return idx


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, I64])
def test_scatter_src_value(dim, dtype):
    x = rnd(4, 6, dtype=dtype)
    idx = _scatter_index(dim)
    src = rnd(5, 5, dtype=dtype, seed=1)  # larger than index: only its leading part is used
    check_rule("aten::scatter.src", lambda x, i, s: torch.scatter(x, dim, i, s), x, idx, src)
    check_rule("aten::scatter.value", lambda x, i: torch.scatter(x, dim, i, 3), x, idx)
    check_rule("aten::scatter.src", lambda x, i, s: x.clone().scatter_(dim, i, s), x, idx, src)


def test_scatter_grad_and_onehot():
    x, src = rnd(4, 6, grad=True), rnd(3, 4, seed=1, grad=True)
    idx = _scatter_index(0)
    check_rule("aten::scatter.src", lambda x, i, s: torch.scatter(x, 0, i, s), x, idx, src, grad=True)
    check_rule("aten::scatter.value", lambda i: F.one_hot(i, 5), torch.tensor([[0, 4], [2, 2]]))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("dtype", [F32, BF16, I32])
def test_scatter_add(dim, dtype):
    fl = dtype.is_floating_point
    x = rnd(4, 6, dtype=dtype, grad=fl)
    src = rnd(5, 7, dtype=dtype, seed=1)  # larger than index: only its leading part is used
    idx = ints(x.shape[dim], 3, 4, seed=dim)  # duplicates accumulate
    check_rule("aten::scatter_add", lambda x, i, s: torch.scatter_add(x, dim, i, s), x, idx, src)
    check_rule("aten::scatter_add", lambda x, i, s: x.clone().scatter_add_(dim, i, s), x.detach(), idx, src)
    src2 = rnd(3, 4, dtype=dtype, seed=2, grad=fl)
    check_rule("aten::scatter_add", lambda x, i, s: torch.scatter_add(x, dim, i, s), x, idx, src2, grad=fl)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [F32, I64, BF16])
def test_scatter_reduce(reduce, include_self, dtype):
    x = rnd(5, 3, dtype=dtype)
    src = rnd(6, 3, dtype=dtype, seed=1)
    idx = ints(4, 6, 3, seed=2)  # duplicates; row 4 untouched
    check_rule("aten::scatter_reduce.two",
               lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self), x, idx, src)


def test_scatter_reduce_nan_and_legacy():
    x = torch.tensor([1.0, float("nan"), 3.0, 0.0])
    src = torch.tensor([float("nan"), 5.0, -1.0, 2.0])
    idx = torch.tensor([0, 1, 2, 2])
    for red in ["amax", "amin", "sum"]:
        check_rule("aten::scatter_reduce.two", lambda x, i, s: x.scatter_reduce(0, i, s, red), x, idx, src)
    x2, src2 = rnd(3, 4), rnd(3, 4, seed=1)
    idx2 = ints(3, 3, 4, seed=3)
    check_rule("aten::scatter.reduce", lambda x, i, s: x.scatter(0, i, s, reduce="add"), x2, idx2, src2)
    check_rule("aten::scatter.reduce", lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), x2, idx2, src2)
    check_rule("aten::scatter.value_reduce", lambda x, i: x.scatter(0, i, 2.0, reduce="multiply"), x2, idx2)


def test_scatter_reduce_grad():
    x, src = rnd(4, 3, grad=True), rnd(5, 3, seed=1, grad=True)
    idx = ints(4, 5, 3, seed=4)
    check_rule("aten::scatter_reduce.two", lambda x, i, s: x.scatter_reduce(0, i, s, "sum"), x, idx, src, grad=True)


# ---- advanced indexing --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_index_tensor_basic(dtype):
    x = rnd(5, 4, 3, dtype=dtype, grad=True)
    i = torch.tensor([0, 4, -1, 2, 2])
    check_rule("aten::index.Tensor", lambda x, i: x[i], x, i, grad=True)
    check_rule("aten::index.Tensor", lambda x, i: x[:, i], x, i[:3].clamp(max=3), grad=True)
    check_rule("aten::index.Tensor", lambda x, i: x[..., i], x, i.clamp(-3, 2), grad=True)


def test_index_tensor_multi():
    x = rnd(5, 4, 3, 2, grad=True)
    a = torch.tensor([[0], [4], [-2]])  # broadcasts with b to [3, 2]
    b = torch.tensor([1, -1])
    # adjacent: the index dims stay in place
    check_rule("aten::index.Tensor", lambda x, a, b: x[a, b], x, a, b, grad=True)
    check_rule("aten::index.Tensor", lambda x, a, b: x[:, a, b], x, a.clamp(-4, 3), b, grad=True)
    # not adjacent: the index dims go first
    check_rule("aten::index.Tensor", lambda x, a, b: x[a, :, b], x, a, b, grad=True)
    check_rule("aten::index.Tensor", lambda x, a, b: x[:, b, :, b], x, a, b, grad=True)
    # all dims indexed; 0-d index tensors; int32 indices
    check_rule("aten::index.Tensor", lambda x, a, b: x[a, b, b, b], x, a, b)
    check_rule("aten::index.Tensor", lambda x, i, j: aten.index(x, [i, None, j]), x, torch.tensor(3), torch.tensor(-1))
    check_rule("aten::index.Tensor", lambda x, a, b: x[a.to(I32), b], x, a, b)


def test_index_tensor_noncontiguous_and_ints():
    x = rnd(4, 6, dtype=I64)
    i = torch.tensor([3, 0, 5])
    check_rule("aten::index.Tensor", lambda x, i: x.t()[i], x, i)
    check_rule("aten::index.Tensor", lambda x, i: x[:, ::2][:, i], x, i.clamp(max=2))
    check_rule("aten::index.Tensor", lambda x, i: x[i], rnd(4, 6, dtype=torch.bool), i.clamp(max=3))


def test_index_bool_mask_rule_is_unimplemented():
    """A bool index has a data-dependent shape: the index.Tensor rule refuses
    it (called below the meta function, which may refuse it first)."""
    from torch_pjrt import _C, _dispatch

    x = rnd(3, 4).to("tpu")
    out = torch.empty(2, 4, device="tpu")
    for m in (torch.tensor([True, False, True]), torch.tensor([1, 0, 1], dtype=torch.uint8)):
        m = m.to("tpu")
        with pytest.raises(NotImplementedError, match="mask"):
            _C.run("aten::index.Tensor", (_dispatch._ref(x), ("L", [_dispatch._ref(m)])), None, (_dispatch._ref(out),))


@pytest.mark.parametrize("case", range(5))
def test_mask_of_the_wrong_shape_raises_like_cpu(case):
    # Masks become indices (nonzero); one whose sizes are not those of the
    # dims it indexes must raise the CPU's IndexError, not pick elements.
    B = torch.bool
    fn = [lambda x, d: x[torch.tensor([True, False], device=d)],
          lambda x, d: x[torch.tensor([[True, False, True]], device=d)],
          lambda x, d: x[:, torch.tensor([True, False], device=d)],
          lambda x, d: x[torch.tensor([0, 1], device=d), torch.tensor([1, 0, 1, 1], dtype=torch.uint8, device=d)],
          lambda x, d: x.index_put_((torch.ones(2, dtype=B, device=d),), torch.tensor(1.0, device=d))][case]
    msgs = []
    for d in ("cpu", "tpu"):
        with pytest.raises(IndexError) as info:
            fn(torch.ones(3, 3, device=d), d)
        msgs.append(str(info.value))
    assert msgs[0] in msgs[1], msgs
    # the right shape still indexes
    ok = torch.tensor([True, False, True])
    torch.testing.assert_close(torch.arange(9.0).view(3, 3).to("tpu")[:, ok.to("tpu")].cpu(),
                               torch.arange(9.0).view(3, 3)[:, ok])


def test_unsafe_index():
    x = rnd(5, 4, grad=True)
    i = torch.tensor([3, 0, 0])
    check_rule("aten::_unsafe_index.Tensor", lambda x, i: aten._unsafe_index(x, [None, i]), x, i, grad=True)
    check_rule("aten::_unsafe_index_put", lambda x, i: aten._unsafe_index_put(x.detach(), [i], torch.ones(4).to(x.device),
                                                                               True), x, i)


def test_index_edge_cases():
    x = rnd(3, 4)
    e = torch.empty(0, dtype=I64)
    check_rule("aten::index.Tensor", lambda x, i, j: x[i, j], x, e, e)  # empty result
    check_rule("aten::index.Tensor", lambda x, i: x[None, i], x, torch.tensor([1, 2]))
    check_rule("aten::index.Tensor", lambda x, i: x[..., None, i], x, torch.tensor([1, 2]))
    check_rule("aten::index.Tensor", lambda x, i: x[i][:, i], rnd(4, 4, dtype=torch.bool), torch.tensor([3, 3, 0]))
    # CPU raises IndexError for indexing into an empty dim; so do we (statically)
    with pytest.raises(IndexError):
        torch.empty(0, 4, device="tpu")[torch.tensor([0]).to("tpu")]


# ---- index_put ------------------------------------------------------------------------------------


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [F32, I64, BF16])
def test_index_put(accumulate, dtype):
    x = rnd(5, 4, 3, dtype=dtype)
    i = perm(5, 3, seed=1) if not accumulate else torch.tensor([0, 4, 0, -1])
    v = rnd(len(i), 4, 3, dtype=dtype, seed=2)
    check_rule(PUT, lambda x, i, v: x.index_put((i,), v, accumulate=accumulate), x, i, v)
    check_rule("aten::index_put", lambda x, i, v: aten.index_put(x, [i], v, accumulate), x, i, v)
    # broadcast values
    check_rule(PUT, lambda x, i, v: aten.index_put(x, [None, i], v[:1, :1], accumulate), x, i.clamp(max=3), v)


def test_index_put_multi_and_setitem():
    x = rnd(5, 4, 3)
    a = torch.tensor([[0], [4], [-2]])
    b = torch.tensor([1, -1])

    def f1(x, a, b):
        y = x.clone()
        y[a, b] = 7.0
        return y

    def f2(x, a, b):
        y = x.clone()
        y[a, :, b] = torch.arange(24.0).reshape(3, 2, 4).to(y.device)
        return y

    def f3(x, a, b):
        y = x.clone()
        y[:, b] += 1.0  # x[:, b] = x[:, b] + 1 (gather then put)
        return y

    def f4(x, a, b):
        y = x.clone()
        y[a, b, 0] = torch.tensor([1.0, 2.0]).to(y.device)
        return y

    for f in (f1, f2, f3, f4):
        check_rule(PUT, f, x, a, b)


def test_index_put_edge_cases():
    x = rnd(3, 4, 5)
    e = torch.empty(0, dtype=I64)
    check_rule(PUT, lambda x, i: x.index_put((i,), torch.tensor(1.0).to(x.device)), x, e)
    check_rule(PUT, lambda x, i: aten.index_put(x, [i, None, i], torch.ones(2, 1).to(x.device)), x, torch.tensor([0, 2]))
    # values with extra leading 1s: an error, like on CPU
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError):
            x.to(dev).index_put((torch.tensor([2, 0]).to(dev),), rnd(1, 1, 2, 4, 5, seed=3).to(dev))
    check_rule(PUT, lambda x, i: x.index_put((i,), torch.tensor(True).to(x.device), accumulate=True),
               rnd(3, 4, dtype=torch.bool), torch.tensor([0, 0, 2]))


def test_index_put_accumulate_grad():
    x = rnd(6, 3, grad=True)
    i = torch.tensor([0, 5, 0, 2, 0])
    # backward of x[i] is index_put(zeros, i, grad, accumulate=True)
    check_rule(PUT, lambda x, i: x[i] * 2, x, i, grad=True)


def test_index_put_bool_mask():
    x = rnd(4, 5)

    def scalar(x):
        y = x.clone()
        y[y > 0] = -1.0
        return y

    def values(x):
        y = x.clone()
        m = torch.zeros(4, 5, dtype=torch.bool)
        m[0, 1] = m[2, 3] = m[3, 0] = True
        y[m.to(y.device)] = torch.tensor([10.0, 20.0, 30.0]).to(y.device)
        return y

    def rows(x):
        y = x.clone()
        m = torch.tensor([True, False, True, False]).to(y.device)
        y[m] = torch.arange(10.0).reshape(2, 5).to(y.device)
        return y

    def cols(x):
        y = x.clone()
        m = torch.tensor([False, True, True, False, True]).to(y.device)
        y[:, m] = torch.ones(4, 1).to(y.device)
        return y

    def acc(x):
        m = torch.tensor([True, False, True, False]).to(x.device)
        return x.index_put((m,), torch.ones(5).to(x.device), accumulate=True)

    def none_selected(x):
        # an all-false mask takes the empty x[mask] (torch.distributions'
        # StudentT.variance: m[df > 2] = f(df[df > 2]))
        y = x.clone()
        m = y > 100
        y[m] = y[m] * 2
        return y.index_put((m,), torch.ones(0, device=y.device), accumulate=True)

    for f in (scalar, values, rows, cols, acc, none_selected):
        check_rule(PUT, f, x)


def test_scatter_gather_edge_cases():
    x = rnd(3, 4)
    e = torch.empty(0, 4, dtype=I64)
    check_rule("aten::scatter.value", lambda x, i: x.scatter(0, i, 1.0), x, e)
    check_rule("aten::scatter_add", lambda x, i, s: x.scatter_add(0, i, s), x, e, torch.empty(0, 4))
    check(lambda x, i: x.gather(1, i), x, torch.empty(3, 0, dtype=I64))
    check_rule("aten::scatter.src", lambda x, i, s: x.scatter(0, i, s), torch.tensor(1.0), torch.tensor(0),
               torch.tensor(5.0))
    check_rule("aten::scatter_reduce.two", lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False),
               torch.tensor(1.0), torch.tensor(0), torch.tensor(-5.0))
    check_rule("aten::index_add", lambda x, i, s: x.index_add(0, i, s), x, torch.empty(0, dtype=I64),
               torch.empty(0, 4))


def test_shape_ops_zero_size():
    e = torch.empty(0, 4)
    check_rule("aten::roll", lambda x: x.roll(1, 0), e)
    check_rule("aten::flip", lambda x: x.flip(1), torch.empty(2, 0))
    check_rule("aten::constant_pad_nd", lambda x: F.pad(x, (1, 1, 1, 1)), e)
    check(lambda x: x.tril(), torch.empty(0, 0))
    check_rule("aten::cat", lambda a: torch.cat([a, a]).sum(0), e)  # empty cat feeding a computing op
    assert_close(torch.arange(0, device="tpu"), torch.arange(0))


# ---- index_add / index_copy / index_fill / index_reduce ---------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, I64, BF16])
def test_index_add_copy(dim, dtype):
    x = rnd(4, 5, dtype=dtype)
    k = 3
    src_shape = list(x.shape)
    src_shape[dim] = k
    src = rnd(*src_shape, dtype=dtype, seed=1)
    dup = torch.tensor([1, 3, 1])
    uniq = perm(x.shape[dim], k, seed=dim)
    check_rule("aten::index_add", lambda x, i, s: x.index_add(dim, i, s), x, dup, src)
    check_rule("aten::index_add", lambda x, i, s: x.index_add(dim, i, s, alpha=2), x, dup, src)
    check_rule("aten::index_add", lambda x, i, s: x.clone().index_add_(dim, i, s), x, dup.to(I32), src)
    check_rule("aten::index_copy", lambda x, i, s: x.index_copy(dim, i, s), x, uniq, src)
    check_rule("aten::index_copy", lambda x, i, s: x.clone().index_copy_(dim, i, s), x, uniq, src)


def test_index_add_grad_and_scalar():
    x, src = rnd(4, 5, grad=True), rnd(2, 5, seed=1, grad=True)
    check_rule("aten::index_add", lambda x, s: x.index_add(0, torch.tensor([3, 3]).to(x.device), s), x, src, grad=True)
    check_rule("aten::index_add", lambda x, s: x.index_add(0, torch.tensor(0).to(x.device), s),
               torch.tensor(1.0), torch.tensor(2.0))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [F32, I64])
def test_index_reduce(reduce, include_self, dtype):
    x = rnd(5, 3, dtype=dtype)
    src = rnd(4, 3, dtype=dtype, seed=1)
    i = torch.tensor([0, 2, 0, 4])
    check_rule("aten::index_reduce", lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self),
               x, i, src)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_fill(dim):
    x = rnd(4, 5, grad=True)
    i = torch.tensor([0, -1, 2, 0])
    check_rule("aten::index_fill.int_Scalar", lambda x, i: x.index_fill(dim, i, -3.5), x, i, grad=True)
    check_rule("aten::index_fill.int_Tensor", lambda x, i: x.index_fill(dim, i, torch.tensor(2.0).to(x.device)), x, i,
               grad=True)
    check_rule("aten::index_fill.int_Scalar", lambda x, i: x.clone().index_fill_(dim, i, 7), rnd(4, 5, dtype=I64), i)
    check_rule("aten::index_fill.int_Scalar", lambda x, i: x.t().index_fill(dim, i, True),
               rnd(5, 4, dtype=torch.bool), i)


def test_index_fill_scalar_self():
    check_rule("aten::index_fill.int_Scalar", lambda x: x.index_fill(0, torch.tensor([0]).to(x.device), 5.0),
               torch.tensor(1.0))


# ---- masked_scatter -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, I64, BF16])
def test_masked_scatter(dtype):
    x = rnd(4, 5, dtype=dtype)
    m = rnd(4, 5, seed=1, dtype=torch.bool)
    src = rnd(30, dtype=dtype, seed=2)  # larger than the number of trues
    check_rule("aten::masked_scatter", lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    check_rule("aten::masked_scatter", lambda x, m, s: x.clone().masked_scatter_(m, s.reshape(5, 6)), x, m, src)
    # mask broadcast over rows; non-contiguous self
    check_rule("aten::masked_scatter", lambda x, m, s: x.t().masked_scatter(m[:, 0], s), x, m, src)


def test_masked_scatter_grad_and_all_false():
    x, src = rnd(3, 4, grad=True), rnd(12, seed=1, grad=True)
    m = rnd(3, 4, seed=5, dtype=torch.bool)
    check_rule("aten::masked_scatter", lambda x, m, s: x.masked_scatter(m, s), x, m, src, grad=True)
    check_rule("aten::masked_scatter", lambda x, m, s: x.masked_scatter(m, s), x.detach(),
               torch.zeros(3, 4, dtype=torch.bool), torch.empty(0))
    # long mask: the prefix sum takes many steps
    big = rnd(1000, seed=6)
    check_rule("aten::masked_scatter", lambda x, m, s: x.masked_scatter(m, s), big, big > 0.3, rnd(1000, seed=7))


# ---- embedding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_embedding(dtype):
    w = rnd(10, 4, dtype=dtype, grad=True)
    i = torch.tensor([[0, 3, 3], [9, 3, 1]])
    check_rule("aten::embedding_dense_backward", lambda w, i: F.embedding(i, w), w, i, grad=True)
    check_rule("aten::embedding", lambda w, i: F.embedding(i, w), w, i)


@pytest.mark.parametrize("padding_idx,scale", [(3, False), (None, True), (-1, True), (0, False)])
def test_embedding_options(padding_idx, scale):
    w = rnd(10, 4, grad=True)
    i = torch.tensor([[0, 3, 3, 9], [9, 3, 1, 3]])
    check_rule("aten::embedding_dense_backward",
               lambda w, i: F.embedding(i, w, padding_idx=padding_idx, scale_grad_by_freq=scale), w, i, grad=True)


def test_embedding_dense_backward_direct():
    g = rnd(2, 3, 5)
    i = torch.tensor([[1, 1, 0], [6, 2, 1]])
    check_rule("aten::embedding_dense_backward", lambda g, i: aten.embedding_dense_backward(g, i, 7, -1, False), g, i)
    check_rule("aten::embedding_dense_backward", lambda g, i: aten.embedding_dense_backward(g, i, 7, 1, True), g, i)
    check_rule("aten::embedding_dense_backward", lambda g, i: aten.embedding_dense_backward(g, i, 7, -1, True),
               g.to(BF16), i.to(I32))


# ---- *_scatter -----------------------------------------------------------------------------------


@pytest.mark.parametrize("offset,d1,d2", [(0, -2, -1), (1, -2, -1), (-2, -2, -1), (0, 0, 2), (1, 2, 0), (-1, 1, 0)])
def test_diag_embed(offset, d1, d2):
    x = rnd(2, 3, grad=True)
    check_rule("aten::diag_embed", lambda x: torch.diag_embed(x, offset, d1, d2), x, grad=True)
    check_rule("aten::diag_embed", lambda x: torch.diag_embed(x, offset, d1, d2), rnd(3, 2, dtype=I64).t())


@pytest.mark.parametrize("offset,d1,d2", [(0, 0, 1), (1, 0, 1), (-2, 0, 1), (0, 1, 2), (2, 2, 0), (-1, -1, 0)])
def test_diagonal_scatter(offset, d1, d2):
    x = rnd(4, 5, 3)
    src = torch.diagonal(x, offset, d1, d2).detach().clone().normal_()
    check_rule("aten::diagonal_scatter", lambda x, s: torch.diagonal_scatter(x, s, offset, d1, d2), x, src)
    check_rule("aten::diagonal_scatter", lambda x, s: torch.diagonal_scatter(x, s, offset, d1, d2),
               x.requires_grad_(), src.requires_grad_(), grad=True)


@pytest.mark.parametrize("dim,start,end,step", [(0, 1, 3, 1), (1, None, None, 2), (1, 1, -1, 3), (0, -3, None, 2),
                                                (1, 5, 100, 1), (0, 0, 4, 5)])
def test_slice_scatter(dim, start, end, step):
    x = rnd(4, 6)
    src = x[(slice(None),) * dim + (slice(start, end, step),)].clone().normal_()
    check_rule("aten::slice_scatter", lambda x, s: torch.slice_scatter(x, s, dim, start, end, step), x, src)
    check_rule("aten::slice_scatter", lambda x, s: torch.slice_scatter(x, s, dim, start, end, step),
               x.to(I64), src.to(I64))


@pytest.mark.parametrize("dim,index", [(0, 0), (1, -1), (-1, 2)])
def test_select_scatter(dim, index):
    x = rnd(3, 4, grad=True)
    src = rnd(*x.select(dim, index).shape, seed=1, grad=True)
    check_rule("aten::select_scatter", lambda x, s: torch.select_scatter(x, s, dim, index), x, src, grad=True)


def test_as_strided_scatter():
    x = rnd(4, 5)
    check_rule("aten::as_strided_scatter",
               lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (5, 2), 1), x, rnd(2, 3, seed=1))
    check_rule("aten::as_strided_scatter",
               lambda x, s: torch.as_strided_scatter(x, s, (4,), (6,)), x, rnd(4, seed=2))
    check_rule("aten::as_strided_scatter",
               lambda x, s: torch.as_strided_scatter(x, s, (), (), 7), x, torch.tensor(9.0))


def test_view_backward_uses_scatters():
    # functionalised backward of views: select/slice/diagonal backward
    x = rnd(4, 5, grad=True)
    check(lambda x: x[1] * 2, x, grad=True)
    check(lambda x: x[1:, ::2] * 2, x, grad=True)
    check(lambda x: x.diagonal(1) * 2, x, grad=True)
    check(lambda x: torch.diag(x[0]), x, grad=True)


# ---- range factories ---------------------------------------------------------------------------


@pytest.mark.parametrize("args,dtype", [((5,), None), ((2, 11, 3), None), ((10, -3, -2), None), ((0, 1, 0.1), None),
                                        ((0, 1, 0.1), F32), ((-1.5, 2.5, 0.25), BF16), ((0, 100), I32),
                                        ((3, 40, 7), torch.int16), ((0.0, 3.0), F32), ((1, 2, 0.3), torch.float64),
                                        ((0, 7, 1.5), I64)])
def test_arange(args, dtype):
    def f():
        return torch.arange(*args, dtype=dtype, device="tpu")

    with lowered() as names:
        got = f()
    assert "aten::arange.start_out" in names
    assert_close(got, torch.arange(*args, dtype=dtype))


def test_arange_out_and_large():
    out = torch.empty(3, device="tpu")
    torch.arange(4, 10, 2, out=out)
    assert_close(out, torch.arange(4.0, 10, 2))
    assert_close(torch.arange(0, 1_000_003, device="tpu"), torch.arange(0, 1_000_003))
    assert_close(torch.arange(0, 10_000, 0.37, device="tpu"), torch.arange(0, 10_000, 0.37))


@pytest.mark.parametrize("start,end,steps,dtype", [(0, 1, 5, None), (-3.25, 7, 11, F32), (0, 10, 4, I64),
                                                   (10, -10, 7, I32), (2, 2, 1, None), (0, 1, 1, None),
                                                   (1, 5, 9, BF16), (-1, 1, 100, torch.float64)])
def test_linspace(start, end, steps, dtype):
    with lowered() as names:
        got = torch.linspace(start, end, steps, dtype=dtype, device="tpu")
    assert "aten::linspace.out" in names
    assert_close(got, torch.linspace(start, end, steps, dtype=dtype))


@pytest.mark.parametrize("dtype", [F32, torch.float64, torch.float16, BF16, torch.complex64, torch.complex128])
def test_logspace_and_complex_linspace(dtype):
    """logspace lowered as the CPU kernel computes it (exponents and power in
    double for real dtypes: float16/bfloat16 results equal the CPU's), and
    complex endpoints keep their imaginary parts (they were dropped)."""
    args = [(0, 2, 3), (-2.0, 1, 50), (4.3, -3, 2), (1, 3, 1), (4.3, -3, 1), (-1.5, 2.5, 7)]
    if dtype.is_complex:
        args += [(0, 2j, 3), (1 + 1j, 2 + 3j, 5), (-1 - 2j, 0.5j, 8)]
    for a in args:
        for base in (10.0, 2.0, 0.5, -2.0):
            with lowered() as names:
                got = torch.logspace(*a, base=base, dtype=dtype, device="tpu")
            assert "aten::logspace.out" in names
            want = torch.logspace(*a, base=base, dtype=dtype)
            exact = dtype in (torch.float16, BF16)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True, **(dict(rtol=0, atol=0) if exact else {}))
        if dtype.is_complex:
            torch.testing.assert_close(torch.linspace(*a, dtype=dtype, device="tpu").cpu(), torch.linspace(*a, dtype=dtype))


@pytest.mark.parametrize("nm,dtype", [((3,), None), ((3, 5), None), ((4, 2), I64), ((3,), torch.bool), ((2, 3), BF16)])
def test_eye(nm, dtype):
    with lowered() as names:
        got = torch.eye(*nm, dtype=dtype, device="tpu")
    assert "aten::eye.m_out" in names or "aten::eye.out" in names
    assert_close(got, torch.eye(*nm, dtype=dtype))


@pytest.mark.parametrize("offset", [None, 0, 3, 10])
def test_as_strided_of_partial_view(offset):
    # as_strided addresses the storage, not the view: a view that does not
    # start at (or cover) its storage must read from the storage's start.
    base = rnd(20, seed=4)
    kw = {} if offset is None else {"storage_offset": offset}
    for cut in (slice(5, 15), slice(0, 10), slice(2, 20, 2)):
        x = base[cut]
        xt = base.to("tpu")[cut]
        assert_close(xt.as_strided((2, 2), (1, 2), **kw), x.as_strided((2, 2), (1, 2), **kw))
    # Gradient: flows into the viewed elements of the leaf view.
    xc = base[5:15].detach().requires_grad_(True)
    xg = base.to("tpu")[5:15].detach().requires_grad_(True)
    g = rnd(2, 2, seed=5)
    xc.as_strided((2, 2), (1, 2), **kw).backward(g)
    xg.as_strided((2, 2), (1, 2), **kw).backward(g.to("tpu"))
    assert_close(xg.grad, xc.grad)


def test_tensor_split_tensor_indices():
    # The indices tensor must be on the CPU, as on CUDA (PyTorch reads its values).
    x = rnd(5, 6, 5, grad=True)
    for args in [(torch.tensor([1, 2, 3]),), (torch.tensor(2),), (torch.tensor([1, 4]), 1),
                 (torch.tensor([1, 4, 2, 5, 3, 6])[::2], -1), (torch.tensor([0, 7]), 1)]:
        check(lambda x: torch.tensor_split(x, *args), x, grad=True)
    with pytest.raises(RuntimeError, match="to be on cpu"):
        torch.tensor_split(x.detach().to("tpu"), torch.tensor([1, 2], device="tpu"))


def test_linspace_integer_and_index_add_bool_alpha():
    # Integer linspace needs a true division (XLA turns x / 49 into x * (1/49),
    # truncating some values one too low); bool index_add honours alpha.
    for a, b, n in [(50, 1, 50), (0, 100, 7), (-3, 97, 13), (1, 50, 49)]:
        for dt in (torch.int64, torch.int32, torch.float32):
            assert torch.equal(torch.linspace(a, b, n, dtype=dt, device="tpu").cpu(), torch.linspace(a, b, n, dtype=dt))
    x = torch.tensor([[True, False, False], [False, False, True]])
    s, i = torch.ones(2, 2, dtype=torch.bool), torch.tensor([0, 2])
    for alpha in (False, True):
        got = x.to("tpu").index_add(1, i.to("tpu"), s.to("tpu"), alpha=alpha).cpu()
        assert torch.equal(got, x.index_add(1, i, s, alpha=alpha))


def _segment_cases():
    g = torch.Generator().manual_seed(3)
    ties = torch.tensor([[1.0, 5.0], [3.0, 5.0], [2.0, 0.0], [0.0, 4.0], [7.0, 7.0], [7.0, 1.0]])
    nans = ties.clone()
    nans[1, 0] = float("nan")
    x3 = torch.randn(2, 6, 3, generator=g)
    return [(torch.randn(6, 2, generator=g), dict(lengths=torch.tensor([2, 0, 3, 1]))),
            (torch.randn(6, 2, generator=g), dict(offsets=torch.tensor([0, 2, 2, 5, 6]))),
            (ties, dict(lengths=torch.tensor([2, 0, 3, 1]))), (nans, dict(lengths=torch.tensor([2, 0, 3, 1]))),
            (x3, dict(lengths=torch.tensor([[2, 4], [1, 5]]), axis=1)),
            (x3, dict(offsets=torch.tensor([[0, 2, 6], [0, 0, 6]]), axis=1)),
            (torch.randn(0, 3, generator=g), dict(lengths=torch.tensor([0, 0])))]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
    """torch.segment_reduce (lengths or offsets, any axis, initial) and its
    backward against the CPU kernels: empty segments, ties and NaN in
    max/min (PyTorch's kernels split a tied gradient only where it is
    positive), zeros and NaN in prod; bad lengths raise the CPU's errors."""
    g = torch.Generator().manual_seed(4)
    for (x, kw), initial in itertools.product(_segment_cases(), (None, 2.0)):
        xc = x.clone().requires_grad_(True)
        xt = x.to("tpu").requires_grad_(True)
        want = torch.segment_reduce(xc, reduce, initial=initial, **kw)
        got = torch.segment_reduce(xt, reduce, initial=initial, **{k: v.to("tpu") if isinstance(v, torch.Tensor)
                                                                   else v for k, v in kw.items()})
        torch.testing.assert_close(got.detach().cpu(), want.detach(), equal_nan=True)
        if x.numel():
            w = torch.randn(want.shape, generator=g)
            torch.testing.assert_close(torch.autograd.grad(got, xt, w.to("tpu"))[0].cpu(),
                                       torch.autograd.grad(want, xc, w)[0], equal_nan=True)
    for kw, msg in [(dict(lengths=torch.tensor([2, -1, 5])), "lengths contains negative value!"),
                    (dict(lengths=torch.tensor([2, 3])), "to sum to data.size"),
                    (dict(offsets=torch.tensor([0, 4, 2, 6])), "segment_length >= 0")]:
        with pytest.raises(RuntimeError, match=msg):
            torch.segment_reduce(torch.randn(6, 2, device="tpu"), reduce, **{k: v.to("tpu") for k, v in kw.items()}).cpu()


def test_constant_pad_value_out_of_the_dtype_range_raises():
    """F.pad's value goes through the CPU's checked conversion (it wrapped:
    300 padded uint8 with 44)."""
    for x, v in [(torch.tensor([1, 2, 3], dtype=torch.uint8), 300), (torch.tensor([1, 2], dtype=torch.int8), 1e40),
                 (torch.tensor([1.0, 2.0]), 1e40)]:
        with pytest.raises(RuntimeError, match="without overflow"):
            F.pad(x, (1, 0), value=v)
        with pytest.raises(RuntimeError, match="without overflow"):
            F.pad(x.to("tpu"), (1, 0), value=v).cpu()
    assert F.pad(torch.tensor([1, 2], dtype=torch.uint8, device="tpu"), (1, 1), value=7).tolist() == [7, 1, 2, 7]
