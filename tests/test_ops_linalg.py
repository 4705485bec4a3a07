"""Linear algebra (csrc/core/lower_linalg.c): "tpu" against PyTorch on the CPU,
forward and gradients, including batches, zero-size matrices, singular and
non positive-definite inputs, and PyTorch's output conventions (LU pivots,
QR signs, eigenvalue / singular value order)."""
import pytest
import torch

import torch_pjrt  # noqa: F401
from torch_pjrt import _C
from util import check

LOWERED = [
    "aten::linalg_lu_factor_ex", "aten::linalg_lu", "aten::lu_unpack", "aten::linalg_lu_solve",
    "aten::_linalg_solve_ex", "aten::linalg_inv_ex", "aten::_linalg_det", "aten::_linalg_slogdet",
    "aten::triangular_solve", "aten::linalg_solve_triangular", "aten::linalg_cholesky_ex",
    "aten::cholesky_inverse", "aten::_cholesky_solve_helper", "aten::geqrf", "aten::linalg_qr",
    "aten::linalg_householder_product", "aten::ormqr", "aten::_linalg_eigh", "aten::_linalg_svd",
    "aten::linalg_matrix_exp", "aten::linalg_lstsq",
]

# float32 results computed in f64 and rounded, against LAPACK's float32.
TOL = dict(rtol=1e-5, atol=1e-5)


def randn(*shape, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_(grad)


def spd(*shape, seed=0):
    a = randn(*shape, seed=seed)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def tpu(x):
    return x.detach().to("tpu")


def test_rules_are_registered():
    missing = [name for name in LOWERED if not _C.has_lowering(name)]
    assert not missing


# ---- LU family -----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 5, 3), (2, 3, 5), (0, 3, 3), (2, 0, 0), (3, 0)])
def test_lu_factor(shape):
    a = randn(*shape)
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    tlu, tpiv, tinfo = torch.linalg.lu_factor_ex(tpu(a))
    torch.testing.assert_close(tlu.cpu(), lu, **TOL)
    assert tpiv.dtype == torch.int32 and torch.equal(tpiv.cpu(), piv)
    assert torch.equal(tinfo.cpu(), info)


def test_lu_singular_info_and_pivots():
    # a zero column: the pivot is zero, info reports its (1-based) position
    a = torch.tensor([[[0.0, 2.0, 1.0], [0.0, 1.0, 3.0], [0.0, 4.0, 1.0]],
                      [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]]])
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    tlu, tpiv, tinfo = torch.linalg.lu_factor_ex(tpu(a))
    assert info.tolist() == [1, 3] and torch.equal(tinfo.cpu(), info)
    assert torch.equal(tpiv.cpu(), piv)
    torch.testing.assert_close(tlu.cpu(), lu, **TOL)


@pytest.mark.parametrize("shape", [(5, 5), (2, 5, 3), (2, 3, 5)])
def test_linalg_lu_and_unpack(shape):
    check(torch.linalg.lu, randn(*shape, grad=True), grad=True, **TOL)
    lu, piv = torch.linalg.lu_factor(randn(*shape))
    check(torch.lu_unpack, lu, piv, **TOL)
    check(lambda a, p: torch.lu_unpack(a, p, unpack_data=False), lu, piv, **TOL)
    check(lambda a, p: torch.lu_unpack(a, p, unpack_pivots=False), lu, piv, **TOL)


@pytest.mark.parametrize("left,adjoint", [(True, False), (True, True), (False, False), (False, True)])
def test_lu_solve(left, adjoint):
    a = randn(3, 4, 4)
    lu, piv = torch.linalg.lu_factor(a)
    b = randn(3, 4, 2, grad=True, seed=1) if left else randn(3, 2, 4, grad=True, seed=1)
    check(lambda l, p, b: torch.linalg.lu_solve(l, p, b, left=left, adjoint=adjoint), lu, piv, b, grad=True, **TOL)


def test_solve():
    a, b = randn(2, 1, 4, 4, grad=True), randn(3, 4, 2, grad=True, seed=1)
    check(torch.linalg.solve, a, b, grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.solve, randn(3, 4, 4), randn(3, 4, seed=1), **TOL)  # batch of vectors
    check(torch.linalg.solve, randn(4, 4), randn(4, seed=1), **TOL)
    check(lambda a, b: torch.linalg.solve(a, b, left=False), randn(4, 4, grad=True), randn(2, 4, grad=True, seed=1),
          grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.solve_ex, randn(0, 3, 3), randn(0, 3, 2))
    # LU / pivots / info outputs of the solve itself
    check(torch.ops.aten._linalg_solve_ex, randn(3, 4, 4), randn(3, 4, 2, seed=1), **TOL)
    check(torch.ops.aten._linalg_solve_ex, randn(4, 4).mT, randn(4, 2, seed=1), **TOL)


def test_inv_and_errors():
    check(torch.linalg.inv, randn(3, 4, 4, grad=True), grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.inv_ex, randn(2, 0, 0))
    z = torch.zeros(2, 3, 3)
    _, info = torch.linalg.inv_ex(tpu(z))
    assert info.cpu().tolist() == [1, 1]
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(tpu(z))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv_ex(tpu(z), check_errors=True)


def test_det_slogdet():
    a = randn(3, 5, 5, grad=True)
    check(torch.linalg.det, a, grad=True, rtol=1e-4, atol=1e-5)
    check(torch.linalg.slogdet, a, grad=True, rtol=1e-4, atol=1e-5)
    check(torch.logdet, spd(2, 4, 4).requires_grad_(), grad=True, rtol=1e-4, atol=1e-5)
    # the LU / pivots outputs: PyTorch factors A^T for a contiguous A, A otherwise
    for m in [randn(4, 4), randn(4, 4).mT]:
        check(torch.ops.aten._linalg_det, m, **TOL)
        check(torch.ops.aten._linalg_slogdet, m, **TOL)
    sing = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    check(torch.linalg.det, sing)
    check(torch.linalg.slogdet, sing)
    check(torch.linalg.det, randn(0, 0))
    check(torch.linalg.det, randn(2, 0, 0))


@pytest.mark.parametrize("fn", [torch.linalg.det, lambda a: torch.linalg.slogdet(a)[1], torch.logdet],
                         ids=["det", "slogdet", "logdet"])
@pytest.mark.parametrize("transposed", [False, True])
def test_det_gradient_compiled(fn, transposed):
    # The backward reads _linalg_det's LU as that of A^T when A is contiguous
    # (PyTorch's CPU convention): compiled graphs must factor A^T there too.
    import torch._dynamo

    a = spd(2, 5, 5) + 0.3 * randn(2, 5, 5)  # not symmetric
    if transposed:
        a = a.mT
    g = []
    for dev in ("cpu", "tpu"):
        torch._dynamo.reset()
        x = a.detach().to(dev).requires_grad_()
        f = torch.compile(fn, backend="tpu") if dev == "tpu" else fn
        f(x).sum().backward()
        g.append(x.grad.cpu())
    torch.testing.assert_close(g[1], g[0], rtol=1e-4, atol=1e-5)


# ---- triangular solves and Cholesky -------------------------------------------------------

@pytest.mark.parametrize("upper,left,unit", [(True, True, False), (False, True, True), (False, False, False),
                                             (True, False, True)])
def test_solve_triangular(upper, left, unit):
    a = spd(2, 4, 4).requires_grad_()
    b = randn(3, 1, 4, 2, grad=True, seed=1) if left else randn(3, 1, 2, 4, grad=True, seed=1)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), a, b,
          grad=True, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("upper,trans,unit", [(True, False, False), (False, True, False), (False, False, True)])
def test_triangular_solve(upper, trans, unit):
    check(lambda b, a: torch.triangular_solve(b, a, upper=upper, transpose=trans, unitriangular=unit),
          randn(2, 4, 3, grad=True, seed=1), spd(2, 4, 4).requires_grad_(), grad=True, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    a = spd(3, 4, 4).requires_grad_()
    check(lambda a: torch.linalg.cholesky(a, upper=upper), a, grad=True, rtol=1e-4, atol=1e-5)
    check(lambda a: torch.cholesky(a, upper=upper), a, **TOL)
    f = torch.linalg.cholesky(spd(3, 4, 4), upper=upper)
    check(lambda f: torch.cholesky_inverse(f, upper=upper), f.requires_grad_(), grad=True, rtol=1e-4, atol=1e-5)
    check(lambda b, f: torch.cholesky_solve(b, f, upper=upper), randn(3, 4, 2, grad=True, seed=1),
          f.detach().requires_grad_(), grad=True, rtol=1e-4, atol=1e-5)


def test_cholesky_not_pd():
    a = spd(3, 4, 4)
    a[1, 2, 2] = -100.0  # leading minor of order 3 is not positive-definite
    _, info = torch.linalg.cholesky_ex(a)
    _, tinfo = torch.linalg.cholesky_ex(tpu(a))
    assert info.tolist() == [0, 3, 0] and torch.equal(tinfo.cpu(), info)
    # the factor of a failed matrix is LAPACK's: L's columns, the failed pivot, then the input
    check(torch.linalg.cholesky_ex, a, rtol=1e-4, atol=1e-5)
    check(lambda a: torch.linalg.cholesky_ex(a, upper=True), a, rtol=1e-4, atol=1e-5)
    with pytest.raises(torch.linalg.LinAlgError, match="order 3 is not positive-definite"):
        torch.linalg.cholesky(tpu(a))
    with pytest.raises(torch.linalg.LinAlgError, match="order 3 is not positive-definite"):
        torch.cholesky(tpu(a))
    check(torch.linalg.cholesky_ex, randn(2, 0, 0))


# ---- QR ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4), (2, 0, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(shape, mode):
    # Q and R are compared directly: LAPACK's sign conventions
    check(lambda a: torch.linalg.qr(a, mode=mode), randn(*shape, grad=mode != "r" and shape[-2] >= shape[-1]),
          grad=mode == "reduced" and shape[-2] >= shape[-1], rtol=1e-4, atol=1e-5)


def test_geqrf_householder_ormqr():
    a = randn(2, 5, 3)
    check(torch.geqrf, a, **TOL)
    g, tau = torch.geqrf(a)
    check(torch.linalg.householder_product, g.requires_grad_(), tau.requires_grad_(), grad=True, rtol=1e-4, atol=1e-5)
    for left in [True, False]:
        for trans in [False, True]:
            c = randn(2, 5, 2, seed=1) if left else randn(2, 2, 5, seed=1)
            check(lambda a, t, c: torch.ormqr(a, t, c, left=left, transpose=trans), g.detach(), tau.detach(), c, **TOL)
    # a column already zero below the diagonal: tau = 0 (LAPACK)
    z = torch.tensor([[2.0, 1.0], [0.0, 3.0], [0.0, 1.0]])
    check(torch.geqrf, z, **TOL)


def test_householder_product_derivatives_in_float64():
    """Derivatives are computed in float64 on tpu (torch_pjrt/_composite.py):
    closer to the float64 result than the CPU's float32 formula on an
    ill-conditioned input, and forward AD, double backward and torch.func
    work through them."""
    g = torch.Generator().manual_seed(7)
    A = torch.randn(5, 4, generator=g) * 3
    tau = torch.rand(3, generator=g) + 0.5
    cot = torch.randn(5, 4, generator=g)
    f = torch.linalg.householder_product

    def grads(a, t, c):
        a = a.detach().requires_grad_()
        t = t.detach().requires_grad_()
        return torch.autograd.grad(f(a, t), (a, t), c)

    ref = grads(A.double(), tau.double(), cot.double())
    cpu = grads(A, tau, cot)
    tpu = grads(A.to("tpu"), tau.to("tpu"), cot.to("tpu"))
    for r, c, t in zip(ref, cpu, tpu):
        err_tpu = (t.cpu().double() - r).abs().max().item()
        err_cpu = (c.double() - r).abs().max().item()
        assert err_tpu <= max(err_cpu, 1e-6 * r.abs().max().item()), (err_tpu, err_cpu)
    dA, dt = torch.randn(5, 4, generator=g), torch.randn(3, generator=g)
    _, jc = torch.func.jvp(f, (A.double(), tau.double()), (dA.double(), dt.double()))
    _, jt = torch.func.jvp(f, (A.to("tpu"), tau.to("tpu")), (dA.to("tpu"), dt.to("tpu")))
    torch.testing.assert_close(jt.cpu(), jc.float(), rtol=1e-5, atol=1e-5 * jc.abs().max().item())
    a64, t64 = A.double().requires_grad_(), tau.double().requires_grad_()
    a2, t2 = A.double().to("tpu").requires_grad_(), tau.double().to("tpu").requires_grad_()
    outs = []
    for a, t in ((a64, t64), (a2, t2)):
        ga, = torch.autograd.grad(f(a, t).pow(2).sum(), a, create_graph=True)
        outs.append(torch.autograd.grad(ga.sum(), t)[0].cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-9, atol=1e-9)
    with torch.no_grad():  # no derivatives needed: the one-program lowering
        torch.testing.assert_close(f(A.to("tpu"), tau.to("tpu")).cpu(), f(A.double(), tau.double()).float(),
                                   rtol=1e-5, atol=1e-5)


# ---- eigh / SVD --------------------------------------------------------------------------------

def _sym(n, batch=(), seed=0):
    a = randn(*batch, n, n, seed=seed)
    return a + a.mT


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(uplo):
    a = _sym(5, (3,))
    # the other triangle must not be read
    other = torch.triu(torch.ones(5, 5), 1) if uplo == "L" else torch.tril(torch.ones(5, 5), -1)
    noisy = a + 100 * other
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    tw, tv = torch.linalg.eigh(tpu(noisy), UPLO=uplo)
    torch.testing.assert_close(tw.cpu(), w, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(tv.cpu().abs(), v.abs(), rtol=1e-4, atol=1e-4)
    check(lambda a: torch.linalg.eigvalsh(a, UPLO=uplo), a.requires_grad_(), grad=True, rtol=1e-5, atol=2e-5)
    check(lambda a: [x.abs() if i else x for i, x in enumerate(torch.linalg.eigh(a))], _sym(4).requires_grad_(),
          grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.eigvalsh, randn(2, 0, 0))
    check(torch.linalg.eigvalsh, randn(3, 1, 1))


def test_eigh_repeated_eigenvalues():
    # reconstruction is what is defined when eigenvalues repeat
    a = torch.diag(torch.tensor([2.0, 2.0, -1.0, 5.0]))
    q, _ = torch.linalg.qr(randn(4, 4))
    a = q @ a @ q.mT
    w, v = torch.linalg.eigh(tpu(a))
    torch.testing.assert_close(w.cpu(), torch.tensor([-1.0, 2.0, 2.0, 5.0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((v @ torch.diag_embed(w) @ v.mT).cpu(), a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((v.mT @ v).cpu(), torch.eye(4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (2, 6, 2)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(shape, full):
    a = randn(*shape)
    u, s, vh = torch.linalg.svd(a, full_matrices=full)
    tu, ts, tvh = torch.linalg.svd(tpu(a), full_matrices=full)
    assert tu.shape == u.shape and ts.shape == s.shape and tvh.shape == vh.shape
    k = s.shape[-1]
    torch.testing.assert_close(ts.cpu(), s, **TOL)
    torch.testing.assert_close(tu.cpu()[..., :k].abs(), u[..., :k].abs(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tvh.cpu()[..., :k, :].abs(), vh[..., :k, :].abs(), rtol=1e-4, atol=1e-5)
    # full bases are orthonormal, and U S Vh = A
    eye_u = torch.eye(tu.shape[-1]).expand(tu.shape[:-2] + (tu.shape[-1], tu.shape[-1]))
    torch.testing.assert_close((tu.mT @ tu).cpu(), eye_u, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((tvh @ tvh.mT).cpu(), torch.eye(tvh.shape[-2]).expand_as(tvh @ tvh.mT).cpu(),
                               rtol=1e-5, atol=1e-5)
    rec = tu[..., :k] @ torch.diag_embed(ts) @ tvh[..., :k, :]
    torch.testing.assert_close(rec.cpu(), a, rtol=1e-5, atol=1e-5)


def test_svd_grad_and_derived():
    check(lambda a: [x.abs() if i != 1 else x for i, x in enumerate(torch.linalg.svd(a, full_matrices=False))],
          randn(5, 3, grad=True), grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.svdvals, randn(3, 4, 6, grad=True), grad=True, rtol=1e-5, atol=1e-5)
    check(torch.linalg.pinv, randn(2, 5, 3, grad=True), grad=True, rtol=1e-4, atol=1e-4)
    check(torch.linalg.matrix_rank, randn(3, 5, 4))
    check(lambda a: torch.linalg.matrix_norm(a, "nuc"), randn(2, 4, 3, grad=True), grad=True, rtol=1e-5, atol=1e-5)
    check(lambda a: torch.linalg.matrix_norm(a, 2), randn(2, 4, 3, grad=True), grad=True, rtol=1e-5, atol=1e-5)


def test_svd_rank_deficient_and_empty():
    a = randn(5, 3)
    a[:, 2] = a[:, 0] - a[:, 1]
    u, s, vh = torch.linalg.svd(tpu(a))
    assert abs(s.cpu()[2].item()) < 1e-5
    torch.testing.assert_close((u.mT @ u).cpu(), torch.eye(5), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((u[:, :3] @ torch.diag(s) @ vh).cpu(), a, rtol=1e-5, atol=1e-5)
    for shape in [(0, 3), (3, 0), (2, 0, 0)]:
        check(torch.linalg.svd, randn(*shape))
    check(lambda a: torch.linalg.svd(a, full_matrices=False), randn(3, 0))


# ---- matrix_exp / lstsq / refusals --------------------------------------------------------------

def test_matrix_exp():
    a = randn(3, 4, 4) * 3
    ref = torch.linalg.matrix_exp(a.double())
    got = torch.linalg.matrix_exp(tpu(a)).cpu()
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    check(torch.linalg.matrix_exp, randn(2, 3, 3, grad=True), grad=True, rtol=1e-5, atol=1e-5)
    check(torch.linalg.matrix_exp, torch.zeros(2, 0, 0))
    nan = torch.linalg.matrix_exp(tpu(torch.full((2, 2), float("nan"))))
    assert torch.isnan(nan.cpu()).all()


def test_matrix_exp_float32_within_an_ulp_and_low_precision_dtypes():
    """On the OpInfo's samples (entries up to ~9e4 after several squarings)
    the float32 result is within an ulp of the exact value, closer than
    PyTorch's CPU kernel.  float16/bfloat16 are computed the same way and
    rounded once (the CPU kernel gives NaN or wrong values for them)."""
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "matrix_exp")
    for s in op.sample_inputs("cpu", torch.float32):
        ref = torch.linalg.matrix_exp(s.input.double())
        got = torch.linalg.matrix_exp(tpu(s.input)).cpu().double()
        ulp = torch.finfo(torch.float32).eps * ref.abs().clamp(min=1)
        assert ((got - ref).abs() <= ulp).all()
    a = randn(2, 3, 3) * 0.5
    for dt in (torch.float16, torch.bfloat16):
        x = a.to(dt)
        got = torch.linalg.matrix_exp(tpu(x)).cpu()
        assert got.dtype == dt
        ref = torch.linalg.matrix_exp(x.double()).to(dt)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 3), (2, 4), (2, 4, 3)])
def test_lstsq(driver, shape):
    a = randn(*shape, grad=True)
    b = randn(*shape[:-1], 2, grad=True, seed=1)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), a, b, rtol=1e-4, atol=1e-5)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver).solution, a, b, grad=True, rtol=1e-4, atol=1e-4)


def test_lstsq_rank_deficient_and_vector():
    a = randn(5, 3)
    a[:, 2] = a[:, 1]
    check(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd")[:3], a, randn(5, 2, seed=1), rtol=1e-4, atol=1e-5)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver="gelss")[:3], a, randn(5, 2, seed=1), rtol=1e-4, atol=1e-5)
    check(torch.linalg.lstsq, randn(5, 3), randn(5, seed=1), rtol=1e-4, atol=1e-5)


def test_non_finite_input_raises():
    for x in [torch.full((3, 3), float("nan")), torch.tensor([[1.0, float("inf")], [0.0, 1.0]])]:
        for f in [torch.linalg.svd, torch.linalg.svdvals, torch.linalg.pinv]:
            with pytest.raises(torch.linalg.LinAlgError, match="linalg.svd: The algorithm failed to converge"):
                f(tpu(x))
        with pytest.raises(torch.linalg.LinAlgError, match="linalg.eigh: The algorithm failed to converge"):
            torch.linalg.eigvalsh(tpu(x.mT))  # the lower triangle is read


def test_refusals():
    c = torch.randn(3, 3, dtype=torch.complex64)
    with pytest.raises(NotImplementedError, match="complex"):
        torch.linalg.inv(tpu(c))
    with pytest.raises(RuntimeError):
        torch.linalg.inv(tpu(randn(3, 4)))  # not square (PyTorch's own check)
    with pytest.raises(RuntimeError):
        torch.linalg.det(tpu(torch.ones(3, 3, dtype=torch.int64)))


# PyTorch hands conjugate and negative views to these ops unresolved (its
# Conjugate/Negative fallthroughs); the results must still be the logical
# values', on every path: first call, repeated calls (fast kernels), out=.
_BITS = {
    "mm_conj_a": lambda a, b: a.conj() @ b,
    "mm_conj_b": lambda a, b: a @ b.conj(),
    "mm_neg": lambda a, b: torch._neg_view(a) @ b,
    "addmm": lambda a, b: torch.addmm(b.conj(), a.conj(), b, beta=0.5, alpha=2.0),
    "bmm": lambda a, b: torch.bmm(a.conj()[None], torch._neg_view(b)[None]),
    "baddbmm": lambda a, b: torch.baddbmm(b[None], a.conj()[None], b[None]),
    "dot": lambda a, b: torch.dot(a[0].conj(), b[1]),
    "vdot": lambda a, b: torch.vdot(a[0].conj(), torch._neg_view(b[1])),
    "conj_physical": lambda a, b: torch.conj_physical(a.conj()),
    "solve_triangular": lambda a, b: torch.linalg.solve_triangular(
        (a.triu() + 4 * torch.eye(4, dtype=a.dtype, device=a.device)).conj(), b, upper=True),
    "mm_out": lambda a, b: torch.mm(a.conj(), b, out=torch.empty(4, 4, dtype=a.dtype, device=a.device)),
}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32])
@pytest.mark.parametrize("name", sorted(_BITS))
def test_conjugate_and_negative_views_in_blas_ops(name, dtype):
    torch.manual_seed(0)
    a, b = torch.randn(4, 4, dtype=dtype), torch.randn(4, 4, dtype=dtype)
    want = _BITS[name](a, b)
    if name == "solve_triangular" and dtype.is_complex:  # complex linalg: a clear "not yet"
        with pytest.raises(NotImplementedError, match="complex"):
            _BITS[name](a.to("tpu"), b.to("tpu"))
        return
    for _ in range(3):
        got = _BITS[name](a.to("tpu"), b.to("tpu"))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_writing_into_a_conjugate_view_says_so():
    a = torch.randn(3, 3, dtype=torch.complex64).to("tpu")
    with pytest.raises(NotImplementedError, match="conjugate or negative view"):
        a.conj().addmm_(a, a)


def test_resolving_bits_on_the_device():
    # resolve_conj/resolve_neg go through empty_like and copy_, which must not
    # resolve again (fft.hfft recursed without end when they did)
    a = torch.randn(5, 6, 7, dtype=torch.complex64)
    t = a.to("tpu")
    for _ in range(2):
        torch.testing.assert_close(t.conj().resolve_conj().cpu(), a.conj())
        torch.testing.assert_close(torch._neg_view(t).resolve_neg().cpu(), -a)
        torch.testing.assert_close(torch.fft.hfft(t, n=7).cpu(), torch.fft.hfft(a, n=7))
