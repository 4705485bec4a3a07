"""torch.fft on "tpu" (csrc/core/lower_fft.c: aten::_fft_c2c, _fft_r2c,
_fft_c2r) against PyTorch on the CPU, forward and gradients.

Tolerances are relative to the largest magnitude of the expected result
(FFT errors grow with the sum, not with each element): 1e-5 for float32 and
complex64, 1e-12 for float64 and complex128."""
import warnings

import pytest
import torch

from util import lowered

FFT_OPS = {"aten::_fft_c2c", "aten::_fft_r2c", "aten::_fft_c2r"}


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def close(actual, expected, rel=None):
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if rel is None:
        rel = 1e-12 if expected.dtype in (torch.float64, torch.complex128) else 1e-5
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(actual.cpu(), expected, rtol=rel, atol=rel * scale)


def check(fn, x, rel=None, **kwargs):
    """fn on the CPU and on tpu; the tpu run must use the FFT lowerings."""
    expected = fn(x, **kwargs)
    with lowered() as names:
        actual = fn(x.to("tpu"), **kwargs)
    close(actual, expected, rel)
    assert names & FFT_OPS, f"no FFT lowering ran: {sorted(names)}"
    return actual


NORMS = [None, "ortho", "forward", "backward"]
C2C_1D = [torch.fft.fft, torch.fft.ifft]
R2C_1D = [torch.fft.rfft, torch.fft.ihfft]
C2R_1D = [torch.fft.irfft, torch.fft.hfft]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", C2C_1D + R2C_1D + C2R_1D, ids=lambda f: getattr(f, "__name__", str(f)))
def test_1d_norms(fn, norm):
    real_in = fn in R2C_1D
    x = rnd(3, 10, dtype=torch.float32 if real_in else torch.complex64)
    check(fn, x, norm=norm)
    # real inputs to the complex transforms are promoted
    if fn in C2C_1D + C2R_1D:
        check(fn, rnd(3, 9), norm=norm)


@pytest.mark.parametrize("fn", C2C_1D + R2C_1D + C2R_1D, ids=lambda f: f.__name__)
@pytest.mark.parametrize("n", [1, 4, 7, 16])  # trimming (below 10) and zero padding (16)
@pytest.mark.parametrize("dim", [0, 1, -1, -3])
def test_1d_n_and_dim(fn, n, dim):
    x = rnd(6, 10, 5, dtype=torch.float32 if fn in R2C_1D else torch.complex64, seed=1)
    check(fn, x, n=n, dim=dim)


ND = {
    "fft2": torch.fft.fft2, "ifft2": torch.fft.ifft2, "rfft2": torch.fft.rfft2, "irfft2": torch.fft.irfft2,
    "hfft2": torch.fft.hfft2, "ihfft2": torch.fft.ihfft2,
    "fftn": torch.fft.fftn, "ifftn": torch.fft.ifftn, "rfftn": torch.fft.rfftn, "irfftn": torch.fft.irfftn,
    "hfftn": torch.fft.hfftn, "ihfftn": torch.fft.ihfftn,
}
REAL_IN = {"rfft2", "ihfft2", "rfftn", "ihfftn"}


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
@pytest.mark.parametrize("name", sorted(ND))
def test_nd_norms(name, norm):
    x = rnd(2, 6, 5, 4, dtype=torch.float32 if name in REAL_IN else torch.complex64, seed=2)
    check(ND[name], x, norm=norm)


@pytest.mark.parametrize("name", sorted(ND))
@pytest.mark.parametrize("s,dim", [
    ((4, 9), (-1, 0)),   # dims out of order; padding and trimming
    ((3, 7), (1, -2)),   # negative dim
    ((5,), (2,)),        # one non-last dim
    (None, (0, 2)),      # non-adjacent dims, batch dims around them
])
def test_nd_s_and_dim(name, s, dim):
    if name.endswith("2") and len(dim) != 2:
        pytest.skip("the 2-d transforms take two dims")
    x = rnd(4, 6, 5, 3, dtype=torch.float32 if name in REAL_IN else torch.complex64, seed=3)
    check(ND[name], x, s=s, dim=dim)


@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn", "hfftn", "ihfftn"])
def test_more_than_three_dims(name):
    # stablehlo.fft takes at most 3 dims: several passes
    x = rnd(2, 3, 4, 5, 3, dtype=torch.float32 if name in REAL_IN else torch.complex64, seed=4)
    check(ND[name], x)
    check(ND[name], x, dim=(4, 0, 2, 1), norm="ortho")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_double_precision(dtype):
    x = rnd(4, 12, dtype=dtype, seed=5)
    if dtype.is_complex:
        check(torch.fft.fft, x)
        check(torch.fft.ifft, x, norm="ortho")
        check(torch.fft.irfft, x, n=9)
        check(torch.fft.hfft2, x)
    else:
        check(torch.fft.rfft, x)
        check(torch.fft.fftn, x, s=(5, 13))
        check(torch.fft.ihfft, x, norm="forward")


def test_non_contiguous_inputs():
    x = rnd(8, 6, 10, dtype=torch.complex64, seed=6)
    check(lambda t: torch.fft.fft(t.transpose(0, 2)[1:, :, ::2]), x)
    check(lambda t: torch.fft.fftn(t.permute(2, 0, 1), dim=(0, 2)), x)
    r = rnd(8, 6, 10, seed=7)
    check(lambda t: torch.fft.rfft(t.transpose(1, 2), dim=1), r)
    check(lambda t: torch.fft.irfft2(t.expand(3, 4, 5)), rnd(4, 5, dtype=torch.complex64))
    check(lambda t: torch.fft.irfft(t[::2], n=6, dim=0), x)


def test_non_hermitian_c2r_input_matches_cpu():
    # irfft/irfftn read only half of the spectrum and ignore what a Hermitian
    # input would have real (imaginary parts at 0 and n/2): done as the CPU
    # does (c2c over the leading dims, then c2r over the last).
    x = rnd(5, 6, 4, dtype=torch.complex64, seed=8)
    for n in (6, 7):
        check(torch.fft.irfft, x, n=n)
        check(torch.fft.irfftn, x, s=(5, 4, n))
        check(torch.fft.hfftn, x, s=(3, n))


def test_c2r_input_longer_than_half():
    # The ATen op itself, given more than last_dim_size/2+1 entries on the
    # last dim: only the first ones are read (the CPU accepts this when the
    # input holds last_dim_size entries; other lengths are out of its contract).
    x = rnd(3, 8, dtype=torch.complex64, seed=9)
    close(torch.ops.aten._fft_c2r(x.to("tpu"), [1], 0, 8), torch.ops.aten._fft_c2r(x, [1], 0, 8))
    close(torch.ops.aten._fft_c2r(x.to("tpu"), [0, 1], 2, 8), torch.ops.aten._fft_c2r(x, [0, 1], 2, 8))
    close(torch.ops.aten._fft_c2r(x.to("tpu"), [1], 1, 14), torch.ops.aten._fft_c2r(x, [1], 1, 14))
    # fewer entries read as zeros, as torch.fft.irfft pads them
    close(torch.ops.aten._fft_c2r(x.to("tpu"), [1], 0, 20), torch.fft.irfft(x, n=20, norm="forward"))


def test_direct_aten_calls_and_out():
    x = rnd(4, 6, dtype=torch.complex64, seed=10)
    r = rnd(4, 6, seed=11)
    for fwd in (True, False):
        for norm in (0, 1, 2):
            close(torch.ops.aten._fft_c2c(x.to("tpu"), [0, 1], norm, fwd), torch.ops.aten._fft_c2c(x, [0, 1], norm, fwd))
    for onesided in (True, False):
        close(torch.ops.aten._fft_r2c(r.to("tpu"), [1, 0], 1, onesided), torch.ops.aten._fft_r2c(r, [1, 0], 1, onesided))
    out = torch.empty(4, 4, dtype=torch.complex64, device="tpu")
    torch.fft.rfft(r.to("tpu"), out=out)
    close(out, torch.fft.rfft(r))
    out = torch.empty(0, dtype=torch.float32, device="tpu")
    torch.fft.irfft(x.to("tpu"), n=5, out=out)
    close(out, torch.fft.irfft(x, n=5))


def test_size_one_and_zero_size():
    check(torch.fft.fft, rnd(3, 1, dtype=torch.complex64))
    check(torch.fft.rfft, rnd(1))
    check(torch.fft.irfft, rnd(3, 1, dtype=torch.complex64), n=1)
    check(torch.fft.fftn, rnd(1, 1, 1, 4, dtype=torch.complex64))
    # zero-size batches (PyTorch's MKL build raises an MKL configuration
    # error here; the result is the empty tensor numpy gives)
    for fn, x, shape in [(torch.fft.fft, rnd(0, 5, dtype=torch.complex64), (0, 5)),
                         (torch.fft.rfft, rnd(3, 0, 5), (3, 0, 3)),
                         (torch.fft.irfft, rnd(0, 4, dtype=torch.complex64), (0, 6))]:
        y = fn(x.to("tpu"))
        assert y.shape == shape and y.device.type == "tpu"
    with pytest.raises(RuntimeError, match="Invalid number of data points"):
        torch.fft.fft(rnd(4).to("tpu"), n=0)


def test_half_is_refused_like_cpu():
    for dt in (torch.float16, torch.bfloat16):
        with pytest.raises(RuntimeError, match="Unsupported dtype"):
            torch.fft.fft(rnd(8).to(dt).to("tpu"))


@pytest.mark.parametrize("fn", [torch.fft.fftshift, torch.fft.ifftshift])
def test_shifts(fn):
    x = rnd(5, 6, 7, seed=12)
    for kw in ({}, {"dim": 1}, {"dim": (0, -1)}):
        torch.testing.assert_close(fn(x.to("tpu"), **kw).cpu(), fn(x, **kw), rtol=0, atol=0)


def test_freqs_on_device():
    for n, d in ((1, 1.0), (7, 1.0), (8, 0.25)):
        for f in (torch.fft.fftfreq, torch.fft.rfftfreq):
            a = f(n, d=d, device="tpu")
            assert a.device.type == "tpu"
            torch.testing.assert_close(a.cpu(), f(n, d=d), rtol=1e-6, atol=1e-7)


def test_fftshift_of_fftfreq_roundtrip():
    x = rnd(16, dtype=torch.complex64, seed=13)
    f = torch.fft.fftshift(torch.fft.fftfreq(16, device="tpu"))
    y = torch.fft.fftshift(torch.fft.fft(x.to("tpu")))
    close(f, torch.fft.fftshift(torch.fft.fftfreq(16)))
    close(y, torch.fft.fftshift(torch.fft.fft(x)))


def vr(z):
    return torch.view_as_real(z.resolve_conj())


GRADS = {
    "fft": (lambda t: vr(torch.fft.fft(t, n=12)), torch.float32),
    "fft_c": (lambda t: vr(torch.fft.fft(t, dim=0, norm="ortho")), torch.complex64),
    "ifft": (lambda t: vr(torch.fft.ifft(t)), torch.float32),
    "rfft": (lambda t: vr(torch.fft.rfft(t, n=7)), torch.float32),
    "rfft_fwd": (lambda t: vr(torch.fft.rfft(t, norm="forward")), torch.float32),
    "irfft": (lambda t: torch.fft.irfft(t), torch.float32),
    "irfft_c": (lambda t: torch.fft.irfft(t, n=9, norm="ortho"), torch.complex64),
    "fftn": (lambda t: vr(torch.fft.fftn(t, s=(3, 8))), torch.float32),
    "rfftn": (lambda t: vr(torch.fft.rfftn(t)), torch.float32),
    "irfftn_c": (lambda t: torch.fft.irfftn(t), torch.complex64),
    "hfft": (lambda t: torch.fft.hfft(t), torch.float32),
    "ihfft": (lambda t: vr(torch.fft.ihfft(t)), torch.float32),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients(name):
    fn, dtype = GRADS[name]
    x = rnd(4, 6, 5, dtype=dtype, seed=14)
    xc = x.clone().requires_grad_()
    xt = x.to("tpu").requires_grad_()
    yc, yt = fn(xc), fn(xt)
    close(yt, yc.detach())
    cot = rnd(*yc.shape, seed=15)
    yc.backward(cot)
    yt.backward(cot.to("tpu"))
    close(xt.grad, xc.grad)


def test_compiled():
    def f(x):
        n = x.shape[-1]
        y = torch.fft.irfft(torch.fft.rfft(x) * torch.fft.rfftfreq(n, device=x.device), n=n)
        return y + torch.fft.fftshift(torch.fft.fftfreq(n, d=0.5, device=x.device))

    x = rnd(3, 15, seed=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no op of it may run eagerly
        y = torch.compile(f, backend="tpu")(x.to("tpu"))
    close(y, f(x))
