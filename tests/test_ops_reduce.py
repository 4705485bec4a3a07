"""Reductions, scans, softmax, matrix products and sorting (csrc/core/lower_reduce.c):
"tpu" against PyTorch on the CPU, forward and, where the op is differentiable,
backward."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401
from torch_pjrt import _C
from util import all_graphs_lowered, assert_close, check, lowered

A = torch.ops.aten
NAN, INF = float("nan"), float("inf")

LOWERED = [
    "aten::sum", "aten::sum.dim_IntList", "aten::mean", "aten::mean.dim", "aten::prod", "aten::prod.dim_int",
    "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::max.dim", "aten::min.dim", "aten::argmax",
    "aten::argmin", "aten::any", "aten::any.dim", "aten::any.dims", "aten::all", "aten::all.dim", "aten::all.dims",
    "aten::var.correction", "aten::std.correction", "aten::var_mean.correction", "aten::std_mean.correction",
    "aten::logsumexp", "aten::linalg_vector_norm", "aten::cumsum", "aten::cumprod", "aten::_softmax",
    "aten::_log_softmax", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data", "aten::mm",
    "aten::bmm", "aten::mv", "aten::dot", "aten::vdot", "aten::addmm", "aten::baddbmm", "aten::addmv",
    "aten::addbmm", "aten::_addmm_activation", "aten::sort", "aten::sort.stable", "aten::topk", "aten::kthvalue",
    "aten::median", "aten::median.dim", "aten::nanmedian", "aten::nanmedian.dim", "aten::histc", "aten::_grouped_mm",
]


def randn(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    return x.requires_grad_(grad)


def randint(*shape, lo=-5, hi=6, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def test_rules_are_registered():
    # A misspelt name would silently fall back to a Python decomposition.
    missing = [name for name in LOWERED if not _C.has_lowering(name)]
    assert not missing


def test_lowering_runs_not_decomposition():
    from torch_pjrt import _dispatch
    for op in [A.sum.dim_IntList, A.max.dim, A._softmax.default, A.mm.default, A.cumsum.default,
               A.linalg_vector_norm.default]:
        assert _dispatch._handler(op).lowering is not None


# ---- sum / mean / prod ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (-1, True), ((0, 2), False), ((-1, 0), True),
                                         ((), False), ((), True)])
def test_sum_mean(dtype, dim, keepdim):
    x = randn(3, 4, 5, dtype=dtype, grad=True)
    if dim is None:
        check(lambda t: t.sum(), x, grad=True)
        check(lambda t: t.mean(), x, grad=True)
        return
    check(lambda t: t.sum(dim, keepdim=keepdim), x, grad=True)
    check(lambda t: t.mean(dim, keepdim=keepdim), x, grad=True)


def test_sum_noncontiguous():
    x = randn(6, 5, grad=True)
    check(lambda t: t.t().sum(0), x, grad=True)
    check(lambda t: t[::2, 1:].sum(1, keepdim=True), x, grad=True)
    check(lambda t: t.t()[1:3].mean(-1), x, grad=True)
    check(lambda t: t.expand(2, 6, 5).sum((0, 2)), x, grad=True)


# Reductions over dims longer than 32 reshape them into two dims of at most 32
# (csrc/core/emit.c, em_split_dim): sizes that split (64, 100, 40), that do not
# (37, a prime; 2048, too long), and sums too long to split (300) but whose
# max/min still do.
@pytest.mark.parametrize("shape,dim", [((3, 64), -1), ((2, 100, 3), 1), ((6, 64, 40), (1, 2)), ((4, 37), 1),
                                       ((2, 300), 1), ((2048,), 0), ((40, 5), 0)])
def test_reductions_over_long_dims(shape, dim):
    x = randn(*shape, grad=True) + 0.5
    check(lambda t: t.sum(dim), x, grad=True)
    check(lambda t: t.mean(dim, keepdim=True), x, grad=True)
    check(lambda t: t.amax(dim), x, grad=True)
    check(lambda t: t.amin(dim), x)
    check(lambda t: (t.abs() * 0.02 + 0.99).prod(dim if isinstance(dim, int) else dim[0]), x, rtol=1e-5, atol=1e-6)
    check(lambda t: (t > 0).all(dim), x.detach())
    check(lambda t: (t > 2).any(dim), x.detach())
    check(lambda t: t.sum(dim), randint(*shape))


# Column reductions (the leading dims reduced, the trailing kept: a bias
# gradient) reduce by windows of 32 rows, the last padded (emit.c,
# column_reduce): row counts of one window, of a padded one, of 1100 (three
# levels), a kept dim of one; eager, and compiled after an elementwise
# producer (GELU's backward into the bias gradient of a Linear).
@pytest.mark.parametrize("shape,dims", [((5, 3), 0), ((37, 4), 0), ((50, 22, 3), (0, 1)), ((1100, 1), 0),
                                        ((2, 3, 4, 5), (0, 1))])
def test_column_reductions(shape, dims):
    x = randn(*shape, grad=True) + 0.5
    check(lambda t: t.sum(dims), x, grad=True)
    check(lambda t: t.mean(dims, keepdim=True), x, grad=True)
    check(lambda t: t.amax(dims), x, grad=True)
    check(lambda t: t.var(dims), x, grad=True, rtol=1e-4, atol=1e-5)
    check(lambda t: (t.abs() * 0.02 + 0.99).prod(0), x.detach(), rtol=1e-5, atol=1e-6)
    check(lambda t: (t > 1).any(0), x.detach())
    check(lambda t: t.sum(dims), randint(*shape))
    check(lambda t: t.to(torch.bfloat16).sum(dims), x.detach())


def test_compiled_bias_gradient_matches_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(3, 37, 24)

    def loss(m, x):
        return (F.gelu(m(x)) * torch.linspace(-1, 1, 40, device=x.device)).sum()

    loss(lin, x).backward()
    tl = torch.nn.Linear(24, 40).to("tpu")
    tl.load_state_dict(lin.state_dict())
    with all_graphs_lowered():
        torch.compile(loss, backend="tpu")(tl, x.to("tpu")).backward()
    assert_close(tl.bias.grad, lin.bias.grad, rtol=1e-5, atol=1e-5)
    assert_close(tl.weight.grad, lin.weight.grad, rtol=1e-5, atol=1e-5)


def test_sum_dtypes():
    check(lambda t: t.sum(), randint(4, 5))
    check(lambda t: t.sum(1), randint(4, 5, dtype=torch.int32))  # int32 sums in int64
    check(lambda t: t.sum(0), randint(4, 5, lo=0, hi=2, dtype=torch.bool))
    check(lambda t: t.sum(), randint(30, lo=0, hi=255, dtype=torch.uint8))  # exceeds 255: promoted
    check(lambda t: t.sum(1, dtype=torch.float64), randn(3, 4))
    check(lambda t: t.sum(dtype=torch.float32), randint(3, 4))
    check(lambda t: t.mean(0, dtype=torch.float64), randn(3, 4))
    big = torch.tensor([2**40 + 1, 2**40 + 3, -7], dtype=torch.int64)
    check(lambda t: t.sum(), big)  # exact
    check(lambda t: t.sum(), randn(1000, seed=3, dtype=torch.float64))


def test_sum_empty_and_scalar():
    check(lambda t: t.sum(), torch.zeros(0))
    check(lambda t: t.sum(0), torch.zeros(0, 3))
    check(lambda t: t.sum(1), torch.zeros(0, 3))
    check(lambda t: t.sum(0, keepdim=True), torch.zeros(0, 3))
    check(lambda t: t.mean(0), torch.zeros(0, 3))  # nan
    check(lambda t: t.prod(0), torch.zeros(0, 3))  # ones
    check(lambda t: t.prod(), torch.zeros(0, dtype=torch.int64))
    s = torch.tensor(2.5, requires_grad=True)
    check(lambda t: t.sum(), s, grad=True)
    check(lambda t: t.sum(0, keepdim=True), s, grad=True)
    check(lambda t: t.mean(-1), s, grad=True)
    check(lambda t: t.prod(0), s)


def test_sum_nan_inf():
    x = torch.tensor([[1.0, NAN, 2.0], [INF, 1.0, -1.0], [INF, -INF, 0.0]])
    check(lambda t: t.sum(1), x)
    check(lambda t: t.mean(0), x)
    check(lambda t: t.prod(1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
def test_prod(dtype):
    x = (randn(3, 4, seed=1) + 1.5).to(dtype) if dtype.is_floating_point else randint(3, 4, lo=-3, hi=4, dtype=dtype)
    check(lambda t: t.prod(), x)
    check(lambda t: t.prod(1), x)
    check(lambda t: t.prod(-2, keepdim=True), x)
    check(lambda t: t.prod(0, dtype=torch.float64), x)


def test_prod_grad():
    x = randn(3, 4, seed=1, grad=True)
    check(lambda t: t.prod(1), x, grad=True)


# ---- max / min family -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.bool])
def test_amax_amin(dtype):
    x = randn(4, 5, 3).to(dtype) if dtype.is_floating_point else randint(4, 5, 3, lo=0 if dtype in (
        torch.uint8, torch.bool) else -100, hi=2 if dtype == torch.bool else 100, dtype=dtype)
    for f in [lambda t: t.amax(), lambda t: t.amin(), lambda t: t.amax(1), lambda t: t.amin((0, -1), keepdim=True),
              lambda t: t.max(), lambda t: t.min()]:
        check(f, x)


def test_amax_grad_and_nan():
    check(lambda t: t.amax(1), randn(4, 5, grad=True), grad=True)
    check(lambda t: t.amin((0, 1)), randn(4, 5, grad=True), grad=True)
    check(lambda t: t.max(), randn(4, 5, grad=True), grad=True)
    x = torch.tensor([[1.0, NAN, 3.0], [INF, 2.0, -INF], [-INF, -INF, -INF]])
    for f in [lambda t: t.amax(1), lambda t: t.amin(1), lambda t: t.amax(0), lambda t: t.max(), lambda t: t.min()]:
        check(f, x)
    check(lambda t: t.amax(1), torch.zeros(0, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_max_min_dim(dtype):
    if dtype.is_floating_point:
        x = randn(4, 6, 5).to(dtype)
    else:
        x = randint(4, 6, 5, lo=0, hi=2 if dtype == torch.bool else 3, dtype=dtype)  # many ties
    for d in [0, 1, -1]:
        for kd in [False, True]:
            check(lambda t: t.max(d, keepdim=kd), x)
            check(lambda t: t.min(d, keepdim=kd), x)
            if dtype != torch.bool:  # PyTorch: argmax does not support bool
                check(lambda t: t.argmax(d, keepdim=kd), x)
                check(lambda t: t.argmin(d, keepdim=kd), x)
    if dtype != torch.bool:
        check(lambda t: t.argmax(), x)
        check(lambda t: t.argmin(), x)
        check(lambda t: A.argmax(t, None, True), x)


def test_max_dim_ties_nan_grad():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [NAN, 1.0, NAN, 2.0], [2.0, 2.0, 2.0, 2.0], [-INF, -INF, 1.0, NAN]])
    check(lambda t: t.max(1), x)
    check(lambda t: t.min(1), x)
    check(lambda t: t.argmax(1), x)
    check(lambda t: t.argmin(0), x)
    check(lambda t: t.argmax(), x)
    check(lambda t: t.max(1)[0], randn(4, 5, grad=True), grad=True)
    check(lambda t: t.min(0, keepdim=True)[0], randn(4, 5, grad=True), grad=True)
    check(lambda t: t.t().max(1), randn(4, 5))  # non-contiguous
    s = torch.tensor(1.5)
    check(lambda t: t.max(0), s)
    check(lambda t: t.argmax(0), s)
    check(lambda t: t.argmin(), s)
    check(lambda t: t.max(1), torch.zeros(0, 4))  # empty output


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8, torch.bool])
def test_any_all(dtype):
    x = randint(3, 4, 5, lo=0, hi=2, dtype=dtype)
    x[0] = 1
    x[1] = 0
    for f in [lambda t: t.any(), lambda t: t.all(), lambda t: t.any(1), lambda t: t.all(-1, keepdim=True),
              lambda t: A.any.dims(t, [0, 2]), lambda t: A.all.dims(t, [0, 2], True), lambda t: A.any.dims(t, None),
              lambda t: A.all.dims(t, []), lambda t: t.all(0)]:
        check(f, x)
    y = torch.tensor([[NAN, 0.0], [0.0, 0.0]])
    check(lambda t: t.any(1), y)
    check(lambda t: t.all(), torch.zeros(0))
    check(lambda t: t.any(), torch.zeros(0))
    check(lambda t: t.all(1), torch.zeros(3, 0))


# ---- var / std -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (1, False), ((0, -1), True), (-1, True)])
def test_var_std(dtype, dim, keepdim):
    x = (randn(4, 5, 6, seed=2) * 3 + 10).to(dtype).requires_grad_()
    grad = dtype != torch.float64
    check(lambda t: torch.var(t, dim, keepdim=keepdim), x, grad=grad)
    check(lambda t: torch.std(t, dim, keepdim=keepdim), x, grad=grad)
    check(lambda t: torch.var(t, dim, correction=0, keepdim=keepdim), x, grad=grad)
    check(lambda t: torch.std(t, dim, correction=2, keepdim=keepdim), x, grad=grad)
    check(lambda t: torch.var_mean(t, dim, keepdim=keepdim), x, grad=grad)
    check(lambda t: torch.std_mean(t, dim, correction=0, keepdim=keepdim), x, grad=grad)


def test_var_edge():
    check(lambda t: torch.var(t), torch.tensor([1.0]))  # 0/0: nan
    check(lambda t: torch.var(t, correction=3), torch.tensor([1.0, 2.0]))  # divisor clamps to 0: inf
    check(lambda t: torch.var(t, 0), torch.zeros(0, 3))
    check(lambda t: torch.std(t, 1), torch.tensor([[1.0, NAN], [1.0, INF]]))
    check(lambda t: torch.var(t.t(), 0), randn(5, 4))
    check(lambda t: torch.var(t, unbiased=False), randn(7))


# ---- logsumexp / norms ---------------------------------------------------------------------

def test_logsumexp():
    x = randn(4, 5, 3, grad=True) * 20
    x = x.detach().requires_grad_()
    check(lambda t: t.logsumexp(1), x, grad=True)
    check(lambda t: t.logsumexp((0, 2), keepdim=True), x, grad=True)
    check(lambda t: t.logsumexp(-1), randn(4, 5, dtype=torch.bfloat16))
    y = torch.tensor([[-INF, -INF], [INF, 1.0], [NAN, 1.0], [1000.0, 1000.0]])
    check(lambda t: t.logsumexp(1), y)
    check(lambda t: t.logsumexp(0), torch.zeros(0, 3))  # -inf
    check(lambda t: t.logsumexp(1), randint(3, 4))  # ints give float


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3, 0.5, -1.5, 2.0])
def test_vector_norm(ord):
    x = randn(4, 5, 6, seed=4)
    x[0, 0] = 0.0
    check(lambda t: torch.linalg.vector_norm(t, ord), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=(0, -1), keepdim=True), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=-1, dtype=torch.float64), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1), x.to(torch.bfloat16))
    check(lambda t: torch.linalg.vector_norm(t.t(), ord, dim=0), x[0])


def test_vector_norm_grad_nan():
    check(lambda t: torch.linalg.vector_norm(t), randn(3, 4, grad=True), grad=True)
    check(lambda t: torch.linalg.vector_norm(t, 1, dim=1), randn(3, 4, grad=True), grad=True)
    check(lambda t: t.norm(dim=0), randn(3, 4, grad=True), grad=True)
    y = torch.tensor([[1.0, NAN], [INF, 1.0], [0.0, 0.0]])
    for o in [2, 1, INF, -INF, 0, 3]:
        check(lambda t: torch.linalg.vector_norm(t, o, dim=1), y)
    check(lambda t: torch.linalg.vector_norm(t, 2, dim=0), torch.zeros(0, 3))


# ---- scans -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_cumsum_cumprod(dtype):
    if dtype.is_floating_point:
        x = randn(5, 7, 3).to(dtype)
    else:
        x = randint(5, 7, 3, lo=-3 if dtype != torch.bool else 0, hi=4 if dtype != torch.bool else 2, dtype=dtype)
    for d in [0, 1, -1]:
        check(lambda t: t.cumsum(d), x)
        check(lambda t: t.cumprod(d), x)
    check(lambda t: t.cumsum(1, dtype=torch.float64), x)
    check(lambda t: t.t().cumsum(0) if t.dim() == 2 else t.transpose(0, 2).cumsum(0), x)


def test_cumsum_exact_and_long():
    big = torch.tensor([2**53 + 1, 1, 2**40, -(2**53), 3, 5] * 11, dtype=torch.int64)
    check(lambda t: t.cumsum(0), big)  # exact where float64 would not be
    check(lambda t: t.cumprod(0), torch.tensor([3, -2, 5, 7, 11, 13, 17, 19, 23, 29], dtype=torch.int64))
    check(lambda t: t.cumsum(0), randn(3000, seed=5))
    check(lambda t: t.cumsum(1), randn(3, 1))
    check(lambda t: t.cumsum(0), torch.zeros(0, 3))
    check(lambda t: t.cumsum(0), torch.tensor(2.0))
    check(lambda t: t.cumprod(-1), torch.tensor([[1.0, NAN, 2.0], [INF, 0.0, 1.0]]))


def test_cumsum_grad():
    check(lambda t: t.cumsum(1), randn(4, 6, grad=True), grad=True)
    check(lambda t: t.cumprod(0), (randn(4, 3, seed=2) + 2).requires_grad_(), grad=True)


# ---- softmax -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dtype, dim):
    x = (randn(4, 5, 6, seed=6) * 5).to(dtype).requires_grad_()
    check(lambda t: torch.softmax(t, dim), x, grad=True)
    check(lambda t: torch.log_softmax(t, dim), x, grad=True)
    check(lambda t: torch.softmax(t, dim, dtype=torch.float32), x, grad=True)
    check(lambda t: torch.log_softmax(t, dim, dtype=torch.float32), x, grad=True)


def test_softmax_edge():
    x = torch.tensor([[1000.0, 1000.0, -1000.0], [-INF, 0.0, -INF], [-INF, -INF, -INF], [NAN, 1.0, 2.0]])
    check(lambda t: torch.softmax(t, 1), x)
    check(lambda t: torch.log_softmax(t, 1), x)
    check(lambda t: torch.softmax(t, 0), torch.tensor(3.0))
    check(lambda t: torch.log_softmax(t, 0), torch.tensor(3.0))
    check(lambda t: torch.softmax(t, 1), torch.zeros(0, 4))
    check(lambda t: torch.softmax(t.t(), 1), randn(5, 4, grad=True), grad=True)
    # half_to_float (CUDA-only in PyTorch): a float32 result from a half input
    xb = randn(3, 4, dtype=torch.bfloat16)
    r = A._softmax(xb.to("tpu"), 1, True)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r.cpu(), torch.softmax(xb.float(), 1), rtol=1e-5, atol=1e-6)
    xh = randn(3, 4, dtype=torch.float16)
    r = A._log_softmax(xh.to("tpu"), 0, True)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r.cpu(), torch.log_softmax(xh.float(), 0), rtol=1e-5, atol=1e-6)


def test_softmax_backward_data():
    g, y = randn(3, 4, 5, seed=1), torch.softmax(randn(3, 4, 5, seed=2), 1)
    check(lambda a, b: A._softmax_backward_data(a, b, 1, torch.float32), g, y)
    check(lambda a, b: A._log_softmax_backward_data(a, b.log(), -1, torch.float32), g, y)
    gb, yb = g.to(torch.bfloat16), y.to(torch.bfloat16)
    check(lambda a, b: A._softmax_backward_data(a, b, 0, torch.bfloat16), gb, yb)
    check(lambda a, b: A._log_softmax_backward_data(a, b, 2, torch.bfloat16), gb, yb)


# ---- matrix products ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mm_family(dtype):
    def r(*s, seed=0):
        return randn(*s, seed=seed, dtype=dtype, grad=True)
    check(lambda a, b: a @ b, r(5, 7), r(7, 3, seed=1), grad=True)
    check(lambda a, b: torch.mm(a.t(), b), r(7, 5), r(7, 3, seed=1), grad=True)
    check(lambda a, b: torch.bmm(a, b), r(2, 5, 7), r(2, 7, 3, seed=1), grad=True)
    check(lambda a, b: a @ b, r(2, 4, 5, 7), r(7, 3, seed=1), grad=True)  # matmul -> mm/bmm
    check(lambda a, b: torch.mv(a, b), r(5, 7), r(7, seed=1), grad=True)
    check(lambda a, b: torch.dot(a, b), r(7), r(7, seed=1), grad=True)
    check(lambda a, b: torch.vdot(a, b), r(7), r(7, seed=1))
    check(lambda c, a, b: torch.addmm(c, a, b), r(5, 3, seed=2), r(5, 7), r(7, 3, seed=1), grad=True)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2), r(3, seed=2), r(5, 7), r(7, 3, seed=1), grad=True)
    check(lambda c, a, b: torch.baddbmm(c, a, b, beta=2, alpha=0.25), r(2, 1, 3, seed=2), r(2, 5, 7),
          r(2, 7, 3, seed=1), grad=True)
    check(lambda c, a, b: torch.addbmm(c, a, b, alpha=3), r(5, 3, seed=2), r(2, 5, 7), r(2, 7, 3, seed=1))
    check(lambda c, a, b: torch.addmv(c, a, b, beta=-1), r(5, seed=2), r(5, 7), r(7, seed=1))
    check(lambda c, a, b: A._addmm_activation(c, a, b), r(3, seed=2), r(5, 7), r(7, 3, seed=1))
    check(lambda c, a, b: A._addmm_activation(c, a, b, use_gelu=True), r(3, seed=2), r(5, 7), r(7, 3, seed=1))
    check(lambda a, b: torch.nn.functional.linear(a, b), r(4, 7), r(3, 7, seed=1), grad=True)


def test_mm_precision():
    # Accumulation must be full f32 (HIGHEST): a long dot of bf16-unfriendly values.
    a, b = randn(64, 512, seed=1), randn(512, 32, seed=2)
    check(lambda x, y: x @ y, a, b, rtol=1e-5, atol=1e-4)
    check(lambda x, y: x @ y, a.double(), b.double())


def test_mm_ints_and_edge():
    a, b = randint(4, 5, lo=-1000, hi=1000), randint(5, 3, lo=-1000, hi=1000, seed=1)
    check(lambda x, y: x @ y, a, b)
    check(lambda x, y: x @ y, a.int(), b.int())
    check(lambda c, x, y: torch.addmm(c, x, y, beta=2, alpha=3), randint(3), a, b)
    check(lambda x, y: torch.dot(x, y), randint(9), randint(9, seed=1))
    check(lambda x, y: x @ y, torch.zeros(3, 0), torch.zeros(0, 4))  # zeros
    check(lambda x, y: x @ y, torch.zeros(0, 3), torch.zeros(3, 4))
    check(lambda x, y: torch.bmm(x, y), torch.zeros(2, 3, 0), torch.zeros(2, 0, 4))
    # beta == 0 ignores self (NaN included), alpha == 0 ignores the product
    nan_c = torch.full((5, 3), NAN)
    check(lambda c, x, y: torch.addmm(c, x, y, beta=0), nan_c, randn(5, 7), randn(7, 3, seed=1))
    check(lambda c, x, y: torch.addmm(c, x, y, alpha=0), randn(5, 3), torch.full((5, 7), NAN), randn(7, 3))
    check(lambda c, x, y: torch.addmv(c, x, y, beta=0), torch.full((5,), NAN), randn(5, 7), randn(7))
    check(lambda c, x, y: torch.baddbmm(c, x, y, beta=0), torch.full((2, 5, 3), NAN), randn(2, 5, 7),
          randn(2, 7, 3))
    check(lambda x, y: x @ y, torch.tensor([[INF, 1.0]]), torch.tensor([[0.0], [1.0]]))  # inf*0 = nan
    check(lambda x, y: x @ y, randn(6, 4)[::2], randn(8, 3)[1::2])  # strided


def test_mm_float64():
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5), randn(3, dtype=torch.float64),
          randn(5, 7, dtype=torch.float64), randn(7, 3, seed=1, dtype=torch.float64))


# ---- sorting ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int16, torch.uint8, torch.bool])
def test_sort(dtype):
    if dtype.is_floating_point:
        x = randn(4, 9, 5).to(dtype)
    else:
        x = randint(4, 9, 5, lo=0, hi=2 if dtype == torch.bool else 4, dtype=dtype)  # ties: stable order
    for d in [0, 1, -1]:
        for desc in [False, True]:
            check(lambda t: torch.sort(t, dim=d, descending=desc, stable=True), x)
            check(lambda t: torch.argsort(t, dim=d, descending=desc, stable=True), x)
    check(lambda t: t.sort(), x)
    check(lambda t: t.msort(), x)


def test_sort_nan_inf_ties():
    x = torch.tensor([[3.0, NAN, -INF, 1.0, NAN, INF, 1.0, -0.0, 0.0, 2.0]])
    for desc in [False, True]:
        check(lambda t: torch.sort(t, dim=1, descending=desc, stable=True), x)
    check(lambda t: torch.sort(t, 0), torch.tensor(2.0))
    check(lambda t: torch.sort(t, 1), torch.zeros(3, 0))
    check(lambda t: t.t().sort(dim=0, stable=True), randint(5, 6, lo=0, hi=3).float())
    check(lambda t: torch.sort(t, 1)[0], randn(3, 6, grad=True), grad=True)
    big = torch.tensor([2**62, -(2**62), 2**62 - 1, 7, -(2**63)], dtype=torch.int64)
    check(lambda t: torch.sort(t), big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_topk_kthvalue(dtype):
    x = torch.randperm(60, generator=torch.Generator().manual_seed(1)).reshape(3, 4, 5).to(dtype)  # no ties
    for d in [0, 1, -1]:
        for largest in [True, False]:
            check(lambda t: torch.topk(t, 2, d, largest=largest), x)
        check(lambda t: torch.kthvalue(t, 2, d), x)
        check(lambda t: torch.kthvalue(t, 1, d, keepdim=True), x)
    check(lambda t: torch.topk(t, 0), x)
    check(lambda t: torch.topk(t, 5), x)


def test_topk_nan_grad():
    check(lambda t: torch.topk(t, 2), torch.tensor([1.0, NAN, 3.0, -INF]))
    check(lambda t: torch.topk(t, 3, largest=False), torch.tensor([1.0, NAN, 3.0, -INF]))
    check(lambda t: torch.topk(t, 3)[0], randn(4, 7, grad=True), grad=True)
    check(lambda t: torch.kthvalue(t, 3, 1)[0], randn(4, 7, grad=True), grad=True)
    v, i = torch.topk(randn(2, 50000).to("tpu"), 5)  # a vocabulary-sized row
    ev, ei = torch.topk(randn(2, 50000), 5)
    assert torch.equal(v.cpu(), ev) and torch.equal(i.cpu(), ei)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16,
                                   torch.int8, torch.uint8, torch.float64, torch.int64])
def test_topk_every_k_and_order(dtype):
    """k up to 16 takes k argmax passes over integer keys (f64/int64 and
    larger k sort): every k, both directions, any dim, the CPU's values
    and, with no ties, its indices; NaN above +inf, -inf and -0.0 in
    order, values returned bit for bit (subnormals are flushed to zero on
    the XLA CPU plugin, so they would tie with -0.0)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randperm(120, generator=g).reshape(4, 30) - (0 if dtype == torch.uint8 else 60)
    x = x.to(dtype)
    for k in (1, 2, 5, 16, 17, 30):
        for largest in (True, False):
            check(lambda t: torch.topk(t, k, largest=largest), x)
            check(lambda t: torch.topk(t.t(), min(k, 4), 0, largest=largest), x)
    if dtype.is_floating_point:
        special = torch.tensor([1.5, NAN, -INF, INF, -0.0, 1e-3, -1e-3, -2.5, 3.0, -3.0], dtype=dtype)
        for k in (1, 3, 10):
            for largest in (True, False):
                v, i = torch.topk(special.to("tpu"), k, largest=largest)
                ev, ei = torch.topk(special, k, largest=largest)
                assert torch.equal(v.cpu().isnan(), ev.isnan())
                assert torch.equal(v.cpu().nan_to_num(7.0), ev.nan_to_num(7.0)), (v, ev)
                assert torch.equal(v.cpu().signbit(), ev.signbit())
                assert torch.equal(i.cpu(), ei), (dtype, k, largest, i, ei)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64])
def test_stable_sort_of_short_dims_with_ties(dtype):
    # dims up to 16 sort by argmin/argmax passes, longer ones by XLA's sort: both stable
    x = torch.randint(0, 4, (6, 40), generator=torch.Generator().manual_seed(4)).to(dtype)
    if dtype.is_floating_point:
        x[0, :5] = torch.tensor([NAN, -0.0, 0.0, NAN, -INF])
    for n in (3, 16, 17, 40):
        for descending in (False, True):
            v, i = torch.sort(x[:, :n].to("tpu"), stable=True, descending=descending)
            ev, ei = torch.sort(x[:, :n], stable=True, descending=descending)
            assert torch.equal(i.cpu(), ei), (n, descending)
            torch.testing.assert_close(v.cpu(), ev, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_median(dtype):
    x = torch.randperm(42, generator=torch.Generator().manual_seed(2)).reshape(6, 7).to(dtype)  # no ties
    for f in [lambda t: t.median(), lambda t: t.nanmedian(), lambda t: t.median(1), lambda t: t.median(0, keepdim=True),
              lambda t: t.nanmedian(-1), lambda t: t[:, :6].median(1), lambda t: t.t().median(1)]:
        check(f, x)


def test_median_nan():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [5.0, 4.0, 3.0, 2.0, 1.0], [NAN, NAN, NAN, NAN, NAN],
                      [-0.0, 7.0, NAN, -1.0, 8.0]])
    for f in [lambda t: t.median(1), lambda t: t.nanmedian(1)[0], lambda t: t[[0, 1, 3]].nanmedian(1), lambda t: t.median(),
              lambda t: t.nanmedian(), lambda t: t[1].median(), lambda t: t[3].nanmedian()]:
        check(f, x)  # (the index nanmedian gives for an all-NaN row is std::nth_element's accident)
    r = torch.tensor([[-0.0, 1.0, -2.0]]).to("tpu").median(1)[0].cpu()
    assert r.item() == 0.0 and math.copysign(1.0, r.item()) < 0  # the element itself, sign included
    check(lambda t: t.median(), torch.zeros(0))  # nan
    check(lambda t: t.median(0), torch.tensor(2.0))
    check(lambda t: t.median(1)[0], randn(3, 5, grad=True), grad=True)


# ---- out= and in-place forms, whole-graph programs ---------------------------------------------------

def test_out_and_inplace():
    x, y = randn(4, 5), randn(5, 3, seed=1)

    def f(x, y):
        s = torch.empty(0, device=x.device)
        torch.sum(x, 1, out=s)
        m = torch.empty(4, 3, device=x.device)
        torch.mm(x, y, out=m)
        v, i = torch.empty(0, device=x.device), torch.empty(0, dtype=torch.long, device=x.device)
        torch.max(x, 0, out=(v, i))
        c = x.clone()
        c.cumsum_(1)
        sv, si = torch.empty(0, device=x.device), torch.empty(0, dtype=torch.long, device=x.device)
        torch.sort(x, 1, out=(sv, si))
        return s, m, v, i, c, sv, si

    check(f, x, y)


def test_compiled_graph():
    """Several region ops (sort, topk, the norm's case) in one whole-graph program."""
    def f(x, w):
        h = x @ w
        v, i = torch.topk(torch.softmax(h, -1), 3)
        s, si = torch.sort(h, dim=0, stable=True)
        n = torch.linalg.vector_norm(h, 2.0, dim=-1) + torch.linalg.vector_norm(h, 1.0, dim=-1)
        return v.sum() + n.mean() + h.cumsum(-1).amax() + s[0].sum() + torch.var(h), i, si

    x, w = randn(5, 6), randn(6, 40, seed=1)
    expected = f(x, w)
    actual = torch.compile(f, backend="tpu")(x.to("tpu"), w.to("tpu"))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)


# ---- a small model step ------------------------------------------------------------------------------

def test_classifier_step():
    """linear -> log_softmax -> nll-like loss, with gradients through mm, sum and softmax."""
    w = randn(10, 6, grad=True, seed=1)
    x = randn(8, 6, seed=2)
    tgt = torch.nn.functional.one_hot(torch.arange(8) % 10, 10).float()

    def f(w, x, tgt):
        logits = x @ w.t()
        return -(torch.log_softmax(logits, -1) * tgt).sum(-1).mean()

    check(f, w, x, tgt, grad=True)
    assert math.isfinite(float(f(w.detach().to("tpu"), x.to("tpu"), tgt.to("tpu")).cpu()))


MIXED = {
    "mm": lambda d: torch.randn(3, 3, device=d) @ torch.randn(3, 3, device=d).double(),
    "linear": lambda d: F.linear(torch.randn(2, 3, device=d), torch.randn(4, 3, device=d).half()),
    "linear_bias": lambda d: F.linear(torch.randn(2, 3, device=d), torch.randn(4, 3, device=d),
                                      torch.randn(4, device=d).bfloat16()),
    "addmm_self": lambda d: torch.addmm(torch.randn(3, 3, device=d).double(), torch.randn(3, 3, device=d),
                                        torch.randn(3, 3, device=d)),
    "mv": lambda d: torch.mv(torch.randn(3, 3, device=d), torch.randn(3, device=d).double()),
    "int_float": lambda d: torch.ones(2, 2, dtype=torch.int64, device=d) @ torch.ones(2, 2, device=d),
    "conv2d": lambda d: F.conv2d(torch.randn(1, 3, 5, 5, device=d), torch.randn(4, 3, 3, 3, device=d).half()),
    "bool_mm": lambda d: torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d),
}


@pytest.mark.parametrize("case", MIXED)
def test_products_refuse_mixed_dtypes_like_cpu(case):
    """Products and convolutions do not promote: operands of different dtypes
    (and bool products) raise the CPU's error type instead of computing."""
    with pytest.raises((RuntimeError, NotImplementedError)) as cpu:
        MIXED[case]("cpu")
    with pytest.raises(type(cpu.value), match="dtype|not implemented for 'Bool'"):
        MIXED[case]("tpu")


HISTC = [
    (lambda: torch.randn(1000), dict(bins=10)),
    (lambda: torch.randn(1000), dict(bins=7, min=-1, max=1.5)),
    (lambda: torch.randn(100, dtype=torch.float64), dict(bins=33, min=-3, max=3)),
    (lambda: torch.full((2, 2), 2.0), dict(bins=3)),  # min == max == every value: [1, 3]
    (lambda: torch.tensor([]), dict(bins=3)),
    (lambda: torch.tensor([1.0, 2.0, NAN, 3.0, -INF, INF]), dict(bins=4, min=0, max=4)),  # NaN, inf skipped
    (lambda: torch.arange(5.0).half(), dict(bins=4)),
    (lambda: torch.randn(3000).bfloat16(), dict(bins=50, min=-2, max=2)),
    (lambda: torch.linspace(0, 1, 101), dict(bins=10, min=0, max=1)),  # values on bin edges
    (lambda: torch.randint(0, 10, (500,)).float().reshape(20, 25), dict(bins=10)),
]


@pytest.mark.parametrize("case", range(len(HISTC)))
def test_histc_matches_cpu_exactly(case):
    torch.manual_seed(case)
    make, kw = HISTC[case]
    x = make()
    want = torch.histc(x, **kw)
    got = torch.histc(x.to("tpu"), **kw).cpu()
    assert got.dtype == want.dtype
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("x, kw, msg", [
    ([1.0, INF], {}, "range of .* is not finite"),
    ([1.0, NAN], {}, "range of .* is not finite"),
    ([1.0, 2.0], dict(min=3, max=1), "max must be larger than min"),
])
def test_histc_bad_range_raises_like_cpu(x, kw, msg):
    with pytest.raises(RuntimeError, match=msg):
        torch.histc(torch.tensor(x), **kw)
    with pytest.raises(RuntimeError, match=msg):
        torch.histc(torch.tensor(x, device="tpu"), **kw).cpu()
    with pytest.raises(NotImplementedError, match="histogram_cpu.*Bool"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="tpu"))


def _histc_int_ref(x, bins, lo, hi):
    """CUDA's histc of integers (the CPU refuses them): bounds truncated to
    integers, the data's range when equal, widened by 1 if still empty, and
    bin (v - lo) * bins // (hi - lo) in integer arithmetic, v == hi last."""
    lo, hi = int(lo), int(hi)
    vals = x.flatten().tolist()
    if lo == hi and vals:
        lo, hi = min(vals), max(vals)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    out = [0] * bins
    for v in vals:
        if lo <= v <= hi:
            out[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return torch.tensor(out, dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("bins, lo, hi", [(4, 0, 3), (7, 0, 6), (5, 0, 0), (3, 1.7, 5.2), (10, 2, 2), (3, 20, 30)])
def test_histc_of_integers_counts_as_cuda_does(dtype, bins, lo, hi):
    """Hugging Face's mixture-of-experts layers count tokens per expert with an
    integer histc off the CPU; tpu counts them as CUDA does."""
    x = torch.randint(0, 7, (3, 40), generator=torch.Generator().manual_seed(bins)).to(dtype)
    got = torch.histc(x.to("tpu"), bins, lo, hi).cpu()
    want = _histc_int_ref(x, bins, lo, hi)
    assert got.dtype == dtype and torch.equal(got, want), (got, want)
    if int(lo) != int(hi):  # with the range given, the float histogram of the truncated range agrees
        assert torch.equal(got.long(), torch.histc(x.double(), bins, int(lo), int(hi)).long())
    assert torch.equal(torch.histc(torch.tensor([3, 3, 3], dtype=dtype, device="tpu"), 4).cpu(),
                       torch.tensor([0, 0, 3, 0], dtype=dtype))
    assert torch.histc(torch.tensor([], dtype=dtype, device="tpu"), 4).cpu().tolist() == [0, 0, 0, 0]


EMPTY_REDUCTIONS = {
    "max(0)": lambda t: t.max(0), "min(0)": lambda t: t.min(0), "max()": lambda t: t.max(), "amin()": lambda t: t.amin(),
    "amax(-2)": lambda t: t.amax(-2), "argmax()": lambda t: t.argmax(), "argmin(0)": lambda t: t.argmin(0),
    "aminmax(dim=0)": lambda t: t.aminmax(dim=0), "kthvalue": lambda t: t.kthvalue(1, 0), "median(0)": lambda t: t.median(0),
    "mode(0)": lambda t: t.mode(0),
    # allowed: the reduced dim is not empty, or the op has an identity / a nan result
    "max(1)": lambda t: t.max(1), "amax(1)": lambda t: t.amax(1), "median()": lambda t: t.median(),
    "prod(0)": lambda t: t.prod(0), "cummax(0)": lambda t: t.cummax(0),
    "max(t, t)": lambda t: torch.max(t, t), "min(t, t)": lambda t: torch.min(t, t),
}


@pytest.mark.parametrize("case", EMPTY_REDUCTIONS)
def test_reductions_over_an_empty_dim_raise_like_cpu(case):
    """max/min/argmax/kthvalue/median... over an empty dim have no value: the
    CPU raises (PyTorch's meta functions return -inf/inf instead)."""
    f = EMPTY_REDUCTIONS[case]
    x = torch.empty(0, 3)
    try:
        want = f(x)
    except (IndexError, RuntimeError) as e:
        with pytest.raises(type(e), match=re.escape(str(e)[:40])):
            f(x.to("tpu"))
        return
    got = f(x.to("tpu"))
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a.cpu(), b, equal_nan=True)


@pytest.mark.parametrize("case", [
    (lambda d: torch.tensor([1, 2, 3], device=d) ** -1, "Integers to negative integer powers are not allowed"),
    (lambda d: torch.tensor([1, 2, 3], device=d).pow_(-2), "Integers to negative integer powers are not allowed"),
    (lambda d: torch.tensor([True, False], device=d).argmax(), r"argmax\(\): does not support bool input"),
    (lambda d: torch.tensor([True, False], device=d).argmin(0), r"argmin\(\): does not support bool input"),
    (lambda d: torch.multinomial(torch.tensor([0.5, 0.5], device=d), 0), "cannot sample n_sample <= 0 samples"),
])
def test_argument_errors_the_cpu_raises(case):
    f, msg = case
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match=msg):
            f(dev).cpu()
    # a tensor of negative exponents is computed, as on the CPU
    e = torch.tensor([-1, 2, -1])
    assert torch.equal((2 ** e.to("tpu")).cpu(), 2 ** e)
    assert torch.equal((torch.tensor([1, 2, -1], device="tpu") ** e.to("tpu")).cpu(), torch.tensor([1, 2, -1]) ** e)


# ---- torch._grouped_mm (mixture-of-experts layers) ---------------------------------------

def _grouped_operands(case, dtype, seed=0):
    """(mat_a, mat_b, offs) of each grouped product; shapes keep the CPU
    kernel's 16-byte stride alignment.  Groups of 4, 0 (empty), 8 and 4."""
    ends = torch.tensor([4, 4, 12, 16], dtype=torch.int32)
    if case == "2d_3d":  # rows of mat_a by group, mat_b transposed as HF's experts pass it
        return randn(16, 16, dtype=dtype, seed=seed), randn(4, 8, 16, dtype=dtype, seed=seed + 1).transpose(-2, -1), ends
    if case == "3d_2d":  # columns of mat_b by group
        return randn(4, 8, 16, dtype=dtype, seed=seed), randn(16, 16, dtype=dtype, seed=seed + 1), ends
    if case == "2d_2d":  # the contraction by group: one [8, 16] product each
        return randn(8, 16, dtype=dtype, seed=seed), randn(16, 16, dtype=dtype, seed=seed + 1), ends
    return randn(4, 8, 16, dtype=dtype, seed=seed), randn(4, 16, 8, dtype=dtype, seed=seed + 1), None


@pytest.mark.parametrize("case", ["2d_3d", "3d_2d", "2d_2d", "3d_3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("compiled", [False, True])
def test_grouped_mm_matches_cpu(case, dtype, compiled):
    """Eager and compiled, forward and both gradients, in every float dtype
    (PyTorch's meta function admits only bfloat16, CUDA's kernel's rule; HF
    calls it on tpu with float32 too), as one program, not the CPU kernel's
    loop over host-side offsets."""
    a, b, offs = _grouped_operands(case, dtype)
    a.requires_grad_(dtype != torch.float16)  # the CPU's float16 mm has no backward here: forward only
    b.requires_grad_(dtype != torch.float16)

    def f(a, b, offs):
        return F.grouped_mm(a, b, offs=offs)

    if compiled:  # against eager CPU (compiling for the CPU takes bfloat16 only)
        torch._dynamo.reset()
        g = torch.compile(f, backend="tpu")
        want = f(a, b, offs)
        ta, tb = (x.detach().to("tpu").requires_grad_(x.requires_grad) for x in (a, b))
        with all_graphs_lowered():
            got = g(ta, tb, offs if offs is None else offs.to("tpu"))
            assert_close(got, want)
            if a.requires_grad:
                ct = randn(*want.shape, dtype=dtype, seed=9)
                want.backward(ct)
                got.backward(ct.to("tpu"))
                assert_close(ta.grad, a.grad)
                assert_close(tb.grad, b.grad)
    else:
        with lowered() as names:
            check(f, a, b, offs, grad=a.requires_grad)
        assert "aten::_grouped_mm" in names


def test_grouped_mm_rows_past_the_last_group_are_zero_and_nonfinite_values_stay_in_their_group():
    a, b, _ = _grouped_operands("2d_2d", torch.float32)
    b[0, 0] = float("inf")  # in group 0's contraction only
    offs = torch.tensor([2, 6, 13], dtype=torch.int32)  # the contraction's last 3 columns belong to no group
    got = F.grouped_mm(a.to("tpu"), b.to("tpu"), offs=offs.to("tpu")).cpu()
    want = F.grouped_mm(a, b, offs=offs)
    assert torch.isinf(got[0]).any() and torch.isfinite(got[1:]).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    a, b, _ = _grouped_operands("2d_3d", torch.float32)
    got = F.grouped_mm(a.to("tpu"), b[:3].to("tpu"), offs=torch.tensor([2, 5, 13], dtype=torch.int32, device="tpu"))
    assert torch.equal(got[13:].cpu(), torch.zeros(3, 8))
    torch.testing.assert_close(got[:13].cpu(), torch.cat([a[:2] @ b[0], a[2:5] @ b[1], a[5:13] @ b[2]]))


@pytest.mark.parametrize("args, msg", [
    (lambda: (randn(12, 16).half().long(), randn(4, 16, 8), torch.tensor([3, 6, 9, 12], dtype=torch.int32)),
     "Expected mat_a to be Float32, BFloat16 or Float16"),
    (lambda: (randn(12, 16), randn(4, 8, 8), torch.tensor([3, 6, 9, 12], dtype=torch.int32)),
     "contraction dimension"),
    (lambda: (randn(12, 16), randn(4, 16, 8), None), "Have to provide offsets"),
    (lambda: (randn(12, 16), randn(4, 16, 8), torch.tensor([3, 6, 9, 12])), "Offsets have to be int32"),
    (lambda: (randn(12, 16), randn(3, 16, 8), torch.tensor([3, 6, 9, 12], dtype=torch.int32)),
     "matrix batch sizes have to match"),
])
def test_grouped_mm_bad_arguments_raise_the_cpu_message(args, msg):
    a, b, offs = args()
    with pytest.raises(RuntimeError, match=msg):
        F.grouped_mm(a, b, offs=offs)
    with pytest.raises(RuntimeError, match=msg):
        F.grouped_mm(a.to("tpu"), b.to("tpu"), offs=None if offs is None else offs.to("tpu")).cpu()


def test_hash_tensor():
    """torch.hash_tensor: the XOR of the elements' bits, widened to 64 bits
    (floats to double, integers and bools to int64), over dims as the CPU's."""
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(5, 7, generator=g), torch.randn(3, generator=g).double(), torch.randn(4, 4, generator=g).half(),
             torch.randn(4, 4, generator=g).bfloat16(), torch.randint(-100, 100, (6, 5), generator=g),
             torch.randint(-100, 100, (6,), generator=g).to(torch.int8), torch.tensor([True, False, True]),
             torch.randint(0, 255, (9,), generator=g).to(torch.uint8), torch.tensor([NAN, -0.0, INF])]
    for x in cases:
        for kw in ({}, dict(dim=0), dict(dim=-1, keepdim=True), dict(dim=[0])):
            with lowered() as names:
                got = torch.hash_tensor(x.to("tpu"), **kw)
            assert "aten::hash_tensor" in names
            want = torch.hash_tensor(x, **kw)
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (x.dtype, kw)
