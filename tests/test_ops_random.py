"""Random number ops on "tpu" (csrc/core/lower_random.c).

PyTorch's CPU generator is a different algorithm, so values cannot be
compared with CPU.  Instead: (1) the bits are checked exactly against a NumPy
transcription of the generator (Threefry-2x32-20, key hashed from the
device's (seed, counter)); (2) reproducibility and independence of calls;
(3) ranges; (4) statistics on 1e5-1e6 samples with bounds from the sample
size (every test is seeded, so results are deterministic); (5) formulas
that can be checked exactly (dropout scaling and backward).
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

DEV = "tpu"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield


# --------------------------------------------------------------------------
# NumPy reference of the generator

_R = [13, 15, 26, 6, 17, 29, 16, 24]


def threefry(k0, k1, c0, c1):
    u = np.uint32
    k0, k1 = np.asarray(k0, dtype=u), np.asarray(k1, dtype=u)
    x0, x1 = np.array(c0, dtype=u), np.array(c1, dtype=u)
    ks = [k0, k1, k0 ^ k1 ^ u(0x1BD11BDA)]
    with np.errstate(over="ignore"):
        x0 = x0 + ks[0]
        x1 = x1 + ks[1]
        for r in range(20):
            x0 = x0 + x1
            x1 = ((x1 << u(_R[r % 8])) | (x1 >> u(32 - _R[r % 8]))) ^ x0
            if r % 4 == 3:
                j = r // 4 + 1
                x0 = x0 + ks[j % 3]
                x1 = x1 + ks[(j + 1) % 3] + u(j)
    return x0, x1


def ref_words(seed, counter, count, stream=0):
    """The two u32 words of each element of one call."""
    K0, K1 = threefry(seed & 0xFFFFFFFF, seed >> 32, counter & 0xFFFFFFFF, counter >> 32)
    if stream:
        K1 = K1 ^ np.uint32((stream * 0x9E3779B9) & 0xFFFFFFFF)
    i = np.arange(count, dtype=np.uint64)
    return threefry(K0, K1, (i & np.uint64(0xFFFFFFFF)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32))


def test_threefry_reference_known_answers():
    # Random123's kat_vectors for threefry2x32_20.
    for key, ctr, expect in [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
                             ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
                             ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]:
        got = threefry(key[0], key[1], ctr[0], ctr[1])
        assert (int(got[0]), int(got[1])) == expect


# --------------------------------------------------------------------------
# Exact bits


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 12345, 2**64 - 1])
def test_rand_bits_exact(seed):
    torch.manual_seed(seed)
    seed &= 2**64 - 1
    a = torch.rand(1000, device=DEV).cpu().numpy()
    b = torch.rand(37, device=DEV).cpu().numpy()
    w0, _ = ref_words(seed, 0, 1000)
    np.testing.assert_array_equal(a, (w0 >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24))
    w0, _ = ref_words(seed, 1000, 37)  # the counter advanced by the first call's size
    np.testing.assert_array_equal(b, (w0 >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24))


def test_rand_float64_bits_exact():
    torch.manual_seed(99)
    a = torch.rand(500, dtype=torch.float64, device=DEV).cpu().numpy()
    w0, w1 = ref_words(99, 0, 500)
    b = (w0.astype(np.uint64) << np.uint64(32)) | w1.astype(np.uint64)
    np.testing.assert_array_equal(a, (b >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def test_randint_bits_exact():
    torch.manual_seed(5)
    a = torch.randint(-3, 7, (400,), device=DEV).cpu().numpy()
    w0, _ = ref_words(5, 0, 400)
    np.testing.assert_array_equal(a, (w0.astype(np.int64) % 10) - 3)
    # a range of 2^40 takes 64 bits
    lo = -(2**39)
    c = torch.randint(lo, lo + 2**40, (300,), device=DEV).cpu().numpy()
    w0, w1 = ref_words(5, 400, 300)
    b = (w0.astype(np.uint64) << np.uint64(32)) | w1.astype(np.uint64)
    np.testing.assert_array_equal(c, (b % np.uint64(2**40)).astype(np.int64) + lo)


def test_randn_matches_box_muller():
    torch.manual_seed(11)
    z = torch.randn(2000, device=DEV).cpu().numpy().astype(np.float64)
    w0, w1 = ref_words(11, 0, 2000)
    u1 = ((w0 >> np.uint32(8)).astype(np.float64) + 1) * 2.0**-24
    u2 = (w1 >> np.uint32(8)).astype(np.float64) * 2.0**-24
    np.testing.assert_allclose(z, np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2), rtol=2e-5, atol=2e-5)


def test_bernoulli_bits_exact():
    torch.manual_seed(3)
    m = torch.empty(1000, device=DEV).bernoulli_(0.3).cpu().numpy()
    w0, _ = ref_words(3, 0, 1000)
    np.testing.assert_array_equal(m, (w0.astype(np.uint64) < round(0.3 * 2**32)).astype(np.float32))


# --------------------------------------------------------------------------
# Reproducibility and independence


def test_same_seed_same_numbers_and_calls_differ():
    torch.manual_seed(0)
    a1, a2 = torch.rand(1000, device=DEV).cpu(), torch.rand(1000, device=DEV).cpu()
    torch.manual_seed(0)
    b1, b2 = torch.rand(1000, device=DEV).cpu(), torch.rand(1000, device=DEV).cpu()
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)
    # successive calls are uncorrelated (not shifted copies)
    assert abs(np.corrcoef(a1.numpy(), a2.numpy())[0, 1]) < 0.15
    assert len(set(a1.tolist()) & set(a2.tolist())) < 5
    torch.manual_seed(1)
    assert not torch.equal(torch.rand(1000, device=DEV).cpu(), a1)


def test_tpu_manual_seed_resets_stream():
    torch.tpu.manual_seed(42)
    a = torch.randn(100, device=DEV).cpu()
    torch.randn(100, device=DEV)
    torch.tpu.manual_seed(42)
    assert torch.equal(torch.randn(100, device=DEV).cpu(), a)
    torch.manual_seed(42)  # reaches the device through torch.tpu.manual_seed_all
    assert torch.equal(torch.randn(100, device=DEV).cpu(), a)
    assert torch.tpu.initial_seed() == 42
    torch.tpu.manual_seed_all(43)
    assert not torch.equal(torch.randn(100, device=DEV).cpu(), a)


def test_every_op_reproducible():
    def draw():
        x = torch.empty(64, device=DEV)
        out = [x.uniform_(-2, 3).cpu(), x.normal_(1, 2).cpu(), x.exponential_(2).cpu(), x.cauchy_().cpu(),
               x.log_normal_().cpu(), x.geometric_(0.3).cpu(), x.random_(0, 100).cpu(), x.bernoulli_(0.4).cpu(),
               torch.bernoulli(torch.full((64,), 0.5, device=DEV)).cpu(),
               torch.randperm(64, device=DEV).cpu(),
               torch.multinomial(torch.ones(64, device=DEV), 8).cpu(),
               torch.ops.aten.native_dropout(torch.ones(64, device=DEV), 0.5, True)[1].cpu()]
        return out

    torch.manual_seed(8)
    a = draw()
    b = draw()
    torch.manual_seed(8)
    c = draw()
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, z)
    assert sum(torch.equal(x, y) for x, y in zip(a, b)) == 0


def test_compiled_graph_calls_are_independent():
    # A graph whose outputs are smaller than what its RNG node draws.
    def f(x):
        r = torch.rand_like(x)
        return r.sum(), r[:8]

    cf = torch.compile(f, backend="tpu")
    x = torch.ones(1000, device=DEV)
    s1, a = cf(x)
    s2, b = cf(x)
    a, b = a.cpu(), b.cpu()
    assert not torch.equal(a, b)
    assert len(set(a.tolist()) & set(b.tolist())) == 0
    assert 0 <= a.min() and a.max() < 1
    assert abs(s1.cpu().item() / 1000 - 0.5) < 6 * math.sqrt(1 / 12 / 1000)


# --------------------------------------------------------------------------
# uniform_


_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
           torch.float16: torch.int16}


def _below(hi, dtype):
    """Largest value of dtype strictly below hi (hi > 0, exact in dtype)."""
    t = torch.tensor([hi], dtype=dtype)
    assert t.item() == hi
    return (t.view(_INT_OF[dtype]) - 1).view(dtype).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-3.0, 5.0), (1.0, 2.0), (1e6, 1e6 + 1)])
def test_uniform_range(dtype, lo, hi):
    if dtype in (torch.bfloat16, torch.float16) and lo == 1e6:
        lo, hi = 256.0, 258.0  # exact in both, spacing 2 in bf16 at 256 and 0.25 in f16
    x = torch.empty(200_000, dtype=dtype, device=DEV).uniform_(lo, hi).cpu().double()
    assert x.min() >= lo
    assert x.max() < hi, f"{dtype} [{lo}, {hi}) produced {x.max().item()}"
    # the top of the range is reached (after the clamp below `to`)
    span = hi - lo
    assert x.max() >= hi - max(span * 1e-3, hi - _below(hi, dtype))
    if dtype in (torch.float32, torch.float64):
        n = x.numel()
        assert abs(x.mean().item() - (lo + hi) / 2) < 6 * span * math.sqrt(1 / 12 / n)


def test_uniform_clamp_hits_top():
    # f32 around 1e6 has spacing 1/16, so lo + u * 1 rounds up to `hi` for
    # u > 1 - 1/32: the result must be clamped to the value just below hi.
    x = torch.empty(100_000, device=DEV).uniform_(1e6, 1e6 + 1).cpu().double()
    assert x.max().item() == 1e6 + 1 - 1 / 16
    assert (x == 1e6 + 1 - 1 / 16).float().mean() > 0.03
    # bf16 in [0, 1): u close to 1 rounds to 1.0
    y = torch.rand(1_000_000, dtype=torch.bfloat16, device=DEV).cpu().double()
    assert y.max().item() == 1 - 2**-8


def test_uniform_statistics():
    n = 1_000_000
    x = torch.rand(n, device=DEV).cpu().double()
    assert abs(x.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(x.var().item() - 1 / 12) < 6 * math.sqrt(1 / 180 / n)
    counts = torch.histc(x, bins=100, min=0, max=1)
    expect = n / 100
    chi2 = ((counts - expect) ** 2 / expect).sum().item()
    assert 40 < chi2 < 99 + 6 * math.sqrt(2 * 99), chi2  # chi-square, 99 degrees of freedom
    # neighbouring values are independent
    assert abs(np.corrcoef(x[:-1].numpy(), x[1:].numpy())[0, 1]) < 6 / math.sqrt(n)


def test_uniform_in_place_on_views():
    base = torch.zeros(6, 8, device=DEV)
    base[:, ::2].uniform_(1, 2)
    b = base.cpu()
    assert torch.equal(b[:, 1::2], torch.zeros(6, 4))
    assert (b[:, ::2] >= 1).all() and (b[:, ::2] < 2).all()
    t = torch.zeros(5, 7, device=DEV).t()
    t.uniform_(-1, 0)
    t = t.cpu()
    assert t.shape == (7, 5) and (t >= -1).all() and (t < 0).all() and len(set(t.flatten().tolist())) == 35


def test_rand_shapes_and_dtypes():
    assert torch.rand((), device=DEV).shape == ()
    assert torch.rand(0, 3, device=DEV).cpu().shape == (0, 3)
    assert torch.randn(0, device=DEV).cpu().shape == (0,)
    x = torch.rand(2, 3, 4, device=DEV, dtype=torch.float64)
    assert x.dtype == torch.float64 and x.shape == (2, 3, 4)
    assert len(set(x.cpu().flatten().tolist())) == 24
    like = torch.rand_like(torch.empty(3, 5, dtype=torch.bfloat16, device=DEV))
    assert like.dtype == torch.bfloat16 and like.shape == (3, 5)


def test_uniform_errors():
    with pytest.raises(RuntimeError, match="from"):
        torch.empty(3, device=DEV).uniform_(2, 1)
    with pytest.raises(Exception):
        torch.empty(3, dtype=torch.int32, device=DEV).uniform_()


# --------------------------------------------------------------------------
# normal and friends


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_normal_statistics(dtype):
    n = 500_000
    x = torch.randn(n, dtype=dtype, device=DEV).cpu().double()
    assert torch.isfinite(x).all()
    tol = 0.01 if dtype == torch.bfloat16 else 0.0  # bf16 rounding of each sample
    assert abs(x.mean().item()) < 6 / math.sqrt(n) + tol
    assert abs(x.std().item() - 1) < 6 / math.sqrt(2 * n) + tol
    p1 = ((x.abs() < 1).double().mean()).item()
    assert abs(p1 - 0.682689) < 6 * math.sqrt(0.2171 / n) + tol
    p3 = ((x.abs() > 3).double().mean()).item()
    assert abs(p3 - 0.0026998) < 6 * math.sqrt(0.0027 / n)
    # fourth moment (kurtosis 3)
    assert abs((x**4).mean().item() - 3) < 6 * math.sqrt(96 / n) + 10 * tol
    # quantiles against the normal distribution
    q = torch.quantile(x[:100_000].float(), torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95]))
    expect = torch.tensor([-1.6449, -0.6745, 0.0, 0.6745, 1.6449])
    assert (q - expect).abs().max() < 0.03


def test_normal_mean_std():
    n = 400_000
    x = torch.empty(n, device=DEV).normal_(3.0, 0.5).cpu().double()
    assert abs(x.mean().item() - 3) < 6 * 0.5 / math.sqrt(n)
    assert abs(x.std().item() - 0.5) < 6 * 0.5 / math.sqrt(2 * n)
    assert torch.equal(torch.empty(10, device=DEV).normal_(2.5, 0.0).cpu(), torch.full((10,), 2.5))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_randn_rand_normal(dtype):
    """Complex tensors are filled through their real view, as on the CPU:
    randn's parts each have variance 1/2 (E|z|^2 = 1); normal_(mean, std)
    gives both parts that mean and std / sqrt(2); rand's parts are in [0, 1)."""
    n = 200_000
    z = torch.randn(n, dtype=dtype, device=DEV).cpu()
    assert z.dtype == dtype
    for part in (z.real.double(), z.imag.double()):
        assert abs(part.mean().item()) < 6 / math.sqrt(2 * n)
        assert abs(part.var().item() - 0.5) < 0.02
    assert abs(z.real.double().mul(z.imag.double()).mean().item()) < 0.01  # the parts are independent
    w = torch.empty(n, dtype=dtype, device=DEV).normal_(1.0, 2.0).cpu()
    for part in (w.real.double(), w.imag.double()):
        assert abs(part.mean().item() - 1.0) < 0.02 and abs(part.std().item() - math.sqrt(2)) < 0.02
    u = torch.rand(n, dtype=dtype, device=DEV).cpu()
    for part in (u.real, u.imag):
        assert 0 <= part.min() and part.max() < 1 and abs(part.double().mean().item() - 0.5) < 0.01


def test_normal_tensor_overloads():
    n = 200_000
    mean = torch.linspace(-5, 5, n)
    std = torch.linspace(0.5, 2, n)
    z1 = ((torch.normal(mean.to(DEV), 2.0).cpu() - mean) / 2.0).double()
    z2 = ((torch.normal(1.0, std.to(DEV)).cpu() - 1.0) / std).double()
    z3 = ((torch.normal(mean.to(DEV), std.to(DEV)).cpu() - mean) / std).double()
    for z in (z1, z2, z3):
        assert abs(z.mean().item()) < 6 / math.sqrt(n)
        assert abs(z.std().item() - 1) < 6 / math.sqrt(2 * n) + 1e-4
    # broadcasting mean (3, 1) against std (1, 4)
    out = torch.normal(torch.zeros(3, 1, device=DEV), torch.ones(1, 4, device=DEV))
    assert out.shape == (3, 4)
    assert torch.normal(2.0, 3.0, size=(5, 2), device=DEV).shape == (5, 2)
    with pytest.raises(RuntimeError, match="std"):
        torch.empty(3, device=DEV).normal_(0, -1)


def test_log_normal():
    n = 300_000
    x = torch.empty(n, device=DEV, dtype=torch.float64).log_normal_(0.5, 0.25).cpu()
    assert (x > 0).all()
    lx = x.log()
    assert abs(lx.mean().item() - 0.5) < 6 * 0.25 / math.sqrt(n)
    assert abs(lx.std().item() - 0.25) < 6 * 0.25 / math.sqrt(2 * n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_exponential(dtype):
    n = 400_000
    lam = 2.5
    x = torch.empty(n, dtype=dtype, device=DEV).exponential_(lam).cpu().double()
    assert (x > 0).all() and torch.isfinite(x).all()
    tol = 0.01 if dtype in (torch.bfloat16, torch.float16) else 0
    assert abs(x.mean().item() - 1 / lam) < 6 / lam / math.sqrt(n) + tol
    assert abs((x > 1).double().mean().item() - math.exp(-lam)) < 6 * math.sqrt(0.08 / n) + tol
    with pytest.raises(RuntimeError, match="lambda"):
        torch.empty(3, device=DEV).exponential_(-1)


def test_cauchy():
    n = 400_000
    x = torch.empty(n, device=DEV).cauchy_(2.0, 0.5).cpu().double()
    assert torch.isfinite(x).all()
    assert abs(x.median().item() - 2.0) < 0.01
    q = torch.quantile(x[:100_000], torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert (q - torch.tensor([1.5, 2.5], dtype=torch.float64)).abs().max() < 0.02  # quartiles at median -/+ sigma


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
def test_geometric(dtype):
    n = 300_000
    p = 0.2
    x = torch.empty(n, dtype=dtype, device=DEV).geometric_(p).cpu().double()
    assert x.min() >= 1 and torch.equal(x, x.round())
    assert abs(x.mean().item() - 1 / p) < 6 * math.sqrt((1 - p) / p**2 / n)
    assert abs((x == 1).double().mean().item() - p) < 6 * math.sqrt(p * (1 - p) / n)
    with pytest.raises(RuntimeError, match="p"):
        torch.empty(3, device=DEV).geometric_(1.5)


# --------------------------------------------------------------------------
# random_ / randint


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.float32,
                                   torch.bfloat16, torch.float64])
def test_randint_bounds_and_coverage(dtype):
    lo, hi = (-5, 12) if dtype != torch.uint8 else (3, 20)
    x = torch.randint(lo, hi, (50_000,), dtype=dtype, device=DEV)
    assert x.dtype == dtype
    x = x.cpu().double()
    assert x.min() == lo and x.max() == hi - 1
    counts = torch.bincount((x - lo).long(), minlength=hi - lo)
    assert len(counts) == hi - lo and (counts > 0).all()
    expect = x.numel() / (hi - lo)
    chi2 = ((counts - expect) ** 2 / expect).sum().item()
    dof = hi - lo - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


def test_randint_forms():
    x = torch.randint(7, (3, 4), device=DEV).cpu()
    assert x.shape == (3, 4) and x.dtype == torch.int64 and x.min() >= 0 and x.max() < 7
    y = torch.randint_like(torch.empty(1000, dtype=torch.int16, device=DEV), 3, 9).cpu()
    assert y.dtype == torch.int16 and y.min() == 3 and y.max() == 8
    z = torch.empty(1000, device=DEV).random_(50).cpu()
    assert z.min() >= 0 and z.max() <= 49 and torch.equal(z, z.round())
    b = torch.randint(0, 2, (1000,), dtype=torch.bool, device=DEV).cpu()
    assert b.dtype == torch.bool and 400 < b.sum() < 600
    big = torch.randint(-(2**62), 2**62, (100_000,), device=DEV).cpu().double()
    assert big.min() >= -(2**62) and big.max() < 2**62
    assert abs(big.mean().item()) < 6 * 2**62 / math.sqrt(3 * 100_000)
    assert big.abs().max() > 2**61.9  # the top bits are random
    assert torch.randint(0, 5, (0,), device=DEV).cpu().shape == (0,)


@pytest.mark.parametrize("dtype,top", [(torch.uint8, 255), (torch.int8, 127), (torch.int16, 32767),
                                       (torch.int32, 2**31 - 1), (torch.bool, 1), (torch.float32, 2**24),
                                       (torch.bfloat16, 2**8), (torch.float16, 2**11)])
def test_random_default_range(dtype, top):
    x = torch.empty(100_000, dtype=dtype, device=DEV).random_().cpu().double()
    assert x.min() >= 0 and x.max() <= top
    assert x.max() >= top * 0.99  # the whole range is used
    assert torch.equal(x, x.round())


def test_random_int64_and_full_range():
    x = torch.empty(100_000, dtype=torch.int64, device=DEV).random_().cpu()
    assert x.min() >= 0 and x.max() > 2**62
    y = torch.empty(100_000, dtype=torch.int64, device=DEV).random_(-(2**63), None).cpu()
    assert y.min() < -(2**62) and y.max() > 2**62  # [lowest, max]
    z = torch.empty(1000, dtype=torch.int8, device=DEV).random_(-5, None).cpu()
    assert z.min() >= -5 and z.max() <= 127 and z.min() < 0
    f = torch.empty(100_000, device=DEV).random_(3, None).cpu()  # [3, 2^24]
    assert f.min() >= 3 and f.max() <= 2**24 and f.max() > 2**23


def test_random_errors():
    with pytest.raises(RuntimeError, match="from"):
        torch.empty(3, device=DEV).random_(5, 3)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.empty(3, dtype=torch.uint8, device=DEV).random_(0, 300)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.empty(3, dtype=torch.uint8, device=DEV).random_(-5, None)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.randint(-200, 0, (3,), dtype=torch.int8, device=DEV)


# --------------------------------------------------------------------------
# bernoulli


@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 0.9, 1.0])
def test_bernoulli_scalar(p):
    n = 200_000
    x = torch.empty(n, device=DEV).bernoulli_(p).cpu().double()
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    assert abs(x.mean().item() - p) < 6 * math.sqrt(p * (1 - p) / n) + 1e-9
    y = torch.bernoulli(torch.empty(1000, device=DEV), p)  # bernoulli.p
    assert y.shape == (1000,) and set(y.cpu().unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(RuntimeError, match="p"):
        torch.empty(3, device=DEV).bernoulli_(1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_bernoulli_tensor(dtype):
    rows = 2000
    p = torch.tensor([0.0, 0.1, 0.3, 0.5, 0.75, 1.0], dtype=dtype)
    probs = p.repeat(rows, 1)
    x = torch.bernoulli(probs.to(DEV))  # bernoulli(self) with self as p
    assert x.dtype == dtype
    x = x.cpu().double()
    rate = x.mean(0)
    pp = p.double()
    assert ((rate - pp).abs() <= 6 * (pp * (1 - pp) / rows).sqrt() + 1e-9).all(), rate
    # bernoulli_(Tensor p): broadcast p into self, self's dtype
    out = torch.empty(rows, 6, dtype=torch.int32, device=DEV).bernoulli_(p.to(DEV)).cpu().double()
    assert ((out.mean(0) - pp).abs() <= 6 * (pp * (1 - pp) / rows).sqrt() + 1e-9).all()


# --------------------------------------------------------------------------
# dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_native_dropout(dtype, p):
    n = 100_000
    x = (torch.rand(n, dtype=torch.float64) + 0.5).to(dtype)
    out, mask = torch.ops.aten.native_dropout(x.to(DEV), p, True)
    out, mask = out.cpu(), mask.cpu()
    assert out.dtype == dtype and mask.dtype == torch.bool
    zero_frac = 1 - mask.double().mean().item()
    assert abs(zero_frac - p) < 6 * math.sqrt(p * (1 - p) / n)
    expect = x * mask * (1.0 / (1.0 - p))  # PyTorch's CPU formula, from the returned mask
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
    assert torch.equal(out == 0, ~mask)


def test_dropout_edge_cases():
    x = torch.randn(1000).to(DEV)
    out, mask = torch.ops.aten.native_dropout(x, 0.5, False)
    assert torch.equal(out.cpu(), x.cpu()) and mask.cpu().all()
    out, mask = torch.ops.aten.native_dropout(x, 0.0, True)
    assert torch.equal(out.cpu(), x.cpu()) and mask.cpu().all()
    out, mask = torch.ops.aten.native_dropout(x, 1.0, True)
    assert torch.equal(out.cpu(), torch.zeros(1000)) and not mask.cpu().any()
    out, mask = torch.ops.aten.native_dropout(torch.empty(0, 3, device=DEV), 0.5, True)
    assert out.shape == (0, 3) and mask.shape == (0, 3)
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), x.cpu())
    # NaN and inf in kept positions survive, scaled
    y = torch.tensor([math.nan, math.inf, -math.inf] * 100).to(DEV)
    out, mask = torch.ops.aten.native_dropout(y, 0.5, True)
    out, mask = out.cpu(), mask.cpu()
    torch.testing.assert_close(out[mask], y.cpu()[mask] * 2, equal_nan=True)


def test_dropout_functional_and_backward():
    n = 50_000
    p = 0.3
    x = (torch.rand(n) + 0.5).to(DEV).requires_grad_(True)
    y = F.dropout(x, p, training=True)
    g = torch.randn(n)
    y.backward(g.to(DEV))
    yc = y.detach().cpu()
    mask = yc != 0
    assert abs((~mask).double().mean().item() - p) < 6 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(yc, x.detach().cpu() * mask / (1 - p), rtol=1e-6, atol=0)
    torch.testing.assert_close(x.grad.cpu(), g * mask * (1 / (1 - p)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_native_dropout_backward(dtype):
    g = torch.randn(3, 1000).to(dtype)
    _, mask = torch.ops.aten.native_dropout(torch.ones(3, 1000, device=DEV), 0.4, True)
    mask = mask.cpu()
    got = torch.ops.aten.native_dropout_backward(g.to(DEV), mask.to(DEV), 1 / 0.6).cpu()
    expect = torch.ops.aten.native_dropout_backward(g, mask, 1 / 0.6)
    torch.testing.assert_close(got, expect, rtol=0, atol=0)
    # non-contiguous grad
    gt = g.t()
    got = torch.ops.aten.native_dropout_backward(gt.to(DEV), mask.t().to(DEV), 2.0).cpu()
    torch.testing.assert_close(got, torch.ops.aten.native_dropout_backward(gt, mask.t(), 2.0), rtol=0, atol=0)


def test_dropout_module_training():
    m = torch.nn.Dropout(0.25).to(DEV)
    x = torch.ones(40_000, device=DEV)
    y = m(x).cpu()
    assert set(y.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    assert abs((y == 0).double().mean().item() - 0.25) < 6 * math.sqrt(0.1875 / 40_000)
    m.eval()
    assert torch.equal(m(x).cpu(), torch.ones(40_000))


# --------------------------------------------------------------------------
# randperm and multinomial


@pytest.mark.parametrize("n", [0, 1, 2, 10, 1000, 70_000])
def test_randperm_is_permutation(n):
    x = torch.randperm(n, device=DEV).cpu()
    assert x.dtype == torch.int64
    assert torch.equal(x.sort().values, torch.arange(n))
    if n >= 10:
        assert not torch.equal(x, torch.arange(n))
        assert not torch.equal(x, torch.randperm(n, device=DEV).cpu())


def test_randperm_dtypes_and_uniformity():
    assert torch.equal(torch.randperm(50, dtype=torch.float32, device=DEV).cpu().sort().values,
                       torch.arange(50, dtype=torch.float32))
    assert torch.randperm(50, dtype=torch.int32, device=DEV).dtype == torch.int32
    # position of each value over many permutations of 4 elements
    trials = 600
    counts = torch.zeros(4, 4)
    for _ in range(trials):
        perm = torch.randperm(4, device=DEV).cpu()
        counts[torch.arange(4), perm] += 1
    expect = trials / 4
    chi2 = ((counts - expect) ** 2 / expect).sum().item()
    assert chi2 < 9 + 6 * math.sqrt(18), counts  # 9 degrees of freedom


def test_multinomial_with_replacement():
    p = torch.tensor([[0.1, 0.0, 0.2, 0.7], [1.0, 1.0, 1.0, 1.0]])  # unnormalised rows are fine
    n = 50_000
    s = torch.multinomial(p.to(DEV), n, replacement=True).cpu()
    assert s.shape == (2, n) and s.dtype == torch.int64
    for r in range(2):
        freq = torch.bincount(s[r], minlength=4).double() / n
        q = (p[r] / p[r].sum()).double()
        assert ((freq - q).abs() <= 6 * (q * (1 - q) / n).sqrt() + 1e-9).all(), freq
    s1 = torch.multinomial(torch.tensor([0.3, 0.7], device=DEV), 10, replacement=True)
    assert s1.shape == (10,)


def test_multinomial_without_replacement():
    rows = 40_000
    p = torch.tensor([0.1, 0.2, 0.7, 0.0])
    s = torch.multinomial(p.to(DEV).expand(rows, 4).contiguous(), 3).cpu()
    assert s.shape == (rows, 3)
    assert (s[:, 0] != s[:, 1]).all() and (s[:, 1] != s[:, 2]).all() and (s[:, 0] != s[:, 2]).all()
    assert (s != 3).all()  # zero probability never drawn while others remain
    first = torch.bincount(s[:, 0], minlength=4).double() / rows
    q = p.double()
    assert ((first - q).abs() <= 6 * (q * (1 - q) / rows).sqrt() + 1e-9).all(), first
    # the second draw: P(c) = sum_a p_a p_c / (1 - p_a)
    q2 = torch.tensor([sum(p[a] * p[c] / (1 - p[a]) for a in range(4) if a != c) for c in range(4)]).double()
    second = torch.bincount(s[:, 1], minlength=4).double() / rows
    assert ((second - q2).abs() <= 6 * (q2 * (1 - q2) / rows).sqrt() + 1e-9).all(), second
    # all categories: a permutation per row
    full = torch.multinomial(torch.rand(5, 30).to(DEV), 30).cpu()
    assert torch.equal(full.sort(1).values, torch.arange(30).expand(5, 30))
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.ones(3, device=DEV), 4)


# --------------------------------------------------------------------------
# Compiled graphs and the table


def test_compiled_graph_random_ops():
    import warnings

    def f(x):
        return (F.dropout(x, 0.5, training=True), torch.randn(1000, device=x.device),
                torch.randint(2, 5, (1000,), device=x.device), torch.bernoulli(x * 0.5),
                torch.randint_like(x, 3), torch.normal(x, 1.0), torch.randperm(50, device=x.device),
                torch.rand(10, 100, device=x.device), x.clone().uniform_(2, 3), torch.multinomial(x + 1, 2))

    cf = torch.compile(f, backend="tpu")
    x = torch.ones(1000, device=DEV)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a, b, c, d, e, g, h, i, j, k = [t.cpu() for t in cf(x)]
    assert not [m for m in w if "eagerly" in str(m.message)], [str(m.message) for m in w]
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert abs(b.mean()) < 0.25 and 0.8 < b.std() < 1.2
    assert c.min() == 2 and c.max() == 4
    assert set(d.unique().tolist()) == {0.0, 1.0}
    assert set(e.unique().tolist()) == {0.0, 1.0, 2.0}
    assert abs((g - 1).mean()) < 0.25
    assert torch.equal(h.sort().values, torch.arange(50))
    assert i.shape == (10, 100) and 0 <= i.min() and i.max() < 1 and len(i.unique()) == 1000
    assert 2 <= j.min() and j.max() < 3
    assert k.shape == (2,) and k[0] != k[1]
    a2 = cf(x)[0].cpu()
    assert not torch.equal(a, a2)


def test_lowering_names():
    from torch_pjrt import _C

    names = ["aten::uniform", "aten::normal_", "aten::normal_functional", "aten::normal.out",
             "aten::normal.Tensor_float", "aten::normal.float_Tensor", "aten::normal.Tensor_Tensor",
             "aten::normal.float_float", "aten::log_normal", "aten::log_normal_", "aten::exponential",
             "aten::cauchy", "aten::cauchy_", "aten::geometric", "aten::geometric_", "aten::random.from",
             "aten::random.to", "aten::random", "aten::bernoulli", "aten::bernoulli.p", "aten::bernoulli_.float",
             "aten::bernoulli.Tensor", "aten::native_dropout", "aten::native_dropout_backward",
             "aten::randperm", "aten::randperm.generator", "aten::randperm.out", "aten::randperm.generator_out",
             "aten::multinomial", "aten::rand", "aten::rand.generator", "aten::rand_like",
             "aten::rand_like.generator", "aten::randn", "aten::randn.generator", "aten::randn_like",
             "aten::randn_like.generator", "aten::randint", "aten::randint.generator", "aten::randint.low",
             "aten::randint.low_generator", "aten::randint_like", "aten::randint_like.generator",
             "aten::randint_like.low_dtype", "aten::randint_like.low_generator_dtype"]
    for name in names:
        assert _C.has_lowering(name), name
        ns, rest = name.split("::")
        base, _, ovl = rest.partition(".")
        assert ovl or "default" in getattr(torch.ops.aten, base).overloads(), name
        assert getattr(getattr(torch.ops.aten, base), ovl or "default") is not None, name


def test_user_generators_are_independent_and_reproducible():
    """torch.Generator("tpu") keeps its own state, as on CPU and CUDA: the
    same seed gives the same numbers, and drawing from it leaves the default
    generator alone."""
    g = torch.Generator("tpu").manual_seed(1)
    p = torch.rand(2, 6, device="tpu")
    draws = lambda: (torch.randn(6, generator=g, device="tpu"), torch.rand(3, 4, generator=g, device="tpu"),
                     torch.empty(5, device="tpu").normal_(2.0, 3.0, generator=g),
                     torch.empty(5, device="tpu").uniform_(-1, 1, generator=g),
                     torch.bernoulli(torch.full((8,), 0.5, device="tpu"), generator=g),
                     torch.multinomial(p, 3, generator=g),
                     torch.randint(0, 9, (7,), generator=g, device="tpu"),
                     torch.randperm(9, generator=g, device="tpu"))
    first = [t.cpu() for t in draws()]
    g.manual_seed(1)
    again = [t.cpu() for t in draws()]
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], torch.randn(6, generator=g, device="tpu").cpu())  # it advanced
    torch.tpu.manual_seed(5)
    ref = torch.randn(4, device="tpu").cpu()
    torch.tpu.manual_seed(5)
    torch.randn(100, generator=torch.Generator("tpu").manual_seed(3), device="tpu")
    assert torch.equal(torch.randn(4, device="tpu").cpu(), ref)  # the default stream did not move
    state = g.get_state()
    a = torch.rand(4, generator=g, device="tpu").cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(4, generator=g, device="tpu").cpu(), a)


def test_generator_of_another_device_type_raises():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, generator=torch.Generator().manual_seed(0), device="tpu")
    # A tpu generator given to a CPU op: the CPU's message (it was a mixed-device error).
    g = torch.Generator("tpu")
    for f in (lambda: torch.randn(3, generator=g), lambda: torch.empty(3).normal_(generator=g),
              lambda: torch.multinomial(torch.ones(3), 2, generator=g)):
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'tpu'"):
            f()


def test_gamma_family_samplers_on_the_host():
    """Gamma, Beta, Dirichlet, Poisson and Binomial sampling (rejection loops
    in PyTorch's kernels) run on the host from a CPU generator seeded by the
    tpu generator: right moments, reproducible with torch.manual_seed and
    tpu Generators, and rsample's gradients as the CPU's."""
    from torch.distributions import Beta, Binomial, Dirichlet, Gamma, Poisson

    D = "tpu"
    torch.manual_seed(0)
    cases = [Gamma(torch.tensor([0.5, 2.0, 9.0], device=D), torch.tensor([1.0, 2.0, 0.5], device=D)),
             Beta(torch.tensor([2.0, 0.5], device=D), torch.tensor([3.0, 0.5], device=D)),
             Dirichlet(torch.tensor([1.0, 2.0, 3.0], device=D)),
             Poisson(torch.tensor([0.5, 4.0, 30.0], device=D)),
             Binomial(torch.tensor([10.0, 50.0], device=D), torch.tensor([0.3, 0.9], device=D))]
    for dist in cases:
        s = dist.sample((20000,))
        assert s.device.type == "tpu"
        sem = (dist.variance / 20000).sqrt()
        assert ((s.mean(0) - dist.mean).abs() <= 5 * sem + 1e-6).all(), type(dist).__name__
    torch.manual_seed(1)
    a = torch._standard_gamma(torch.full((5,), 2.0, device=D)).cpu()
    torch.manual_seed(1)
    assert torch.equal(torch._standard_gamma(torch.full((5,), 2.0, device=D)).cpu(), a)
    g = torch.Generator(device=D).manual_seed(3)
    c = torch.poisson(torch.full((4,), 3.0, device=D), generator=g).cpu()
    g.manual_seed(3)
    assert torch.equal(torch.poisson(torch.full((4,), 3.0, device=D), generator=g).cpu(), c)
    x, alpha = torch.tensor([0.3, 1.5, 4.0]), torch.tensor([0.5, 2.0, 3.0])
    torch.testing.assert_close(torch._standard_gamma_grad(alpha.to(D), x.to(D)).cpu(),
                               torch._standard_gamma_grad(alpha, x))
