"""torch.distributions with parameters on "tpu", against the same
distributions on the CPU: log_prob of the CPU's samples, entropy, mean,
variance, cdf/icdf where defined, and KL divergences; samples land on tpu with
the CPU's shape and (with a fixed seed) the distribution's mean; rsample
gradients reach every parameter."""
import math

import pytest
import torch
import torch.distributions as D

import torch_pjrt  # noqa: F401

TOL = dict(rtol=1e-4, atol=1e-4, equal_nan=True)


def _params(seed):
    g = torch.Generator().manual_seed(seed)

    def pos(*s):
        return torch.rand(*s, generator=g) + 0.5

    def unit(*s):
        return torch.rand(*s, generator=g) * 0.8 + 0.1

    def rn(*s):
        return torch.randn(*s, generator=g)

    tril = torch.tril(rn(3, 3))
    tril.diagonal().abs_().add_(1)
    # name -> (class, args, kwargs); StudentT's variance takes its finite,
    # inf and NaN branches, and in StudentT.heavy (every df below 2) the
    # finite one selects nothing
    return {
        "Normal": (D.Normal, (rn(4), pos(4)), {}), "LogNormal": (D.LogNormal, (rn(4), pos(4)), {}),
        "Bernoulli": (D.Bernoulli, (unit(4),), {}), "Beta": (D.Beta, (pos(4), pos(4)), {}),
        "Binomial": (D.Binomial, (10, unit(4)), {}), "Categorical": (D.Categorical, (unit(2, 5),), {}),
        "Cauchy": (D.Cauchy, (rn(4), pos(4)), {}), "Chi2": (D.Chi2, (pos(4),), {}),
        "ContinuousBernoulli": (D.ContinuousBernoulli, (unit(4),), {}),
        "Dirichlet": (D.Dirichlet, (pos(2, 3),), {}), "Exponential": (D.Exponential, (pos(4),), {}),
        "FisherSnedecor": (D.FisherSnedecor, (pos(4) * 4, pos(4) * 4), {}),
        "Gamma": (D.Gamma, (pos(4), pos(4)), {}), "Geometric": (D.Geometric, (unit(4),), {}),
        "Gumbel": (D.Gumbel, (rn(4), pos(4)), {}), "HalfCauchy": (D.HalfCauchy, (pos(4),), {}),
        "HalfNormal": (D.HalfNormal, (pos(4),), {}), "Kumaraswamy": (D.Kumaraswamy, (pos(4), pos(4)), {}),
        "Laplace": (D.Laplace, (rn(4), pos(4)), {}), "LKJCholesky": (D.LKJCholesky, (3, pos(1)[0]), {}),
        "LogisticNormal": (D.LogisticNormal, (rn(3), pos(3)), {}),
        "LowRankMultivariateNormal": (D.LowRankMultivariateNormal, (rn(3), rn(3, 2), pos(3)), {}),
        "MultivariateNormal": (D.MultivariateNormal, (rn(3),), {"scale_tril": tril}),
        "Multinomial": (D.Multinomial, (7, unit(5)), {}),
        "NegativeBinomial": (D.NegativeBinomial, (pos(4), unit(4)), {}),
        "OneHotCategorical": (D.OneHotCategorical, (unit(5),), {}), "Pareto": (D.Pareto, (pos(4), pos(4) * 3), {}),
        "Poisson": (D.Poisson, (pos(4),), {}),
        "RelaxedBernoulli": (D.RelaxedBernoulli, (pos(1)[0], unit(4)), {}),
        "RelaxedOneHotCategorical": (D.RelaxedOneHotCategorical, (pos(1)[0], unit(5)), {}),
        "StudentT": (D.StudentT, (torch.tensor([0.7, 1.5, 2.5, 6.0]), rn(4), pos(4)), {}),
        "StudentT.heavy": (D.StudentT, (torch.tensor([0.7, 0.9, 1.5, 1.8]), rn(4), pos(4)), {}),
        "Uniform": (D.Uniform, (rn(4), rn(4) + 3), {}), "VonMises": (D.VonMises, (rn(4), pos(4)), {}),
        "Weibull": (D.Weibull, (pos(4), pos(4)), {}), "Wishart": (D.Wishart, (torch.tensor(5.0),), {"scale_tril": tril}),
        "GeneralizedPareto": (D.GeneralizedPareto, (rn(4), pos(4), unit(4) - 0.5), {}),
    }


NAMES = sorted(_params(0))
# sample means far from the mean: heavy tails, or angles that wrap at +-pi
NO_MOMENT = {"Cauchy", "HalfCauchy", "FisherSnedecor", "Pareto", "StudentT", "StudentT.heavy", "LKJCholesky", "Wishart", "VonMises",
             "GeneralizedPareto"}


def _tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _both(name):
    cls, args, kw = _params(0)[name]
    return cls(*args, **kw), cls(*map(_tpu, args), **{k: _tpu(v) for k, v in kw.items()})


def _close(actual, expected):
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_statistics(name):
    dc, dt = _both(name)
    torch.manual_seed(1)
    s = dc.sample((3,))
    _close(dt.log_prob(s.to("tpu")), dc.log_prob(s))
    for stat in ("entropy", "mean", "variance", "mode"):
        try:
            expected = getattr(dc, stat)
            expected = expected() if callable(expected) else expected
        except NotImplementedError:
            continue
        actual = getattr(dt, stat)
        _close(actual() if callable(actual) else actual, expected)
    for fn, arg in (("cdf", s), ("icdf", torch.full_like(s, 0.3) if s.is_floating_point() else None)):
        try:
            expected = getattr(dc, fn)(arg)
        except (NotImplementedError, TypeError, ValueError, AttributeError):
            continue
        _close(getattr(dt, fn)(arg.to("tpu")), expected)


@pytest.mark.parametrize("name", NAMES)
def test_sampling(name):
    dc, dt = _both(name)
    torch.manual_seed(0)
    big = dt.sample((20000,))
    assert big.device.type == "tpu" and big.shape == dc.sample((20000,)).shape and big.dtype == dc.sample().dtype
    try:
        mean = dc.mean.double()
    except NotImplementedError:
        mean = None
    if name not in NO_MOMENT and mean is not None and bool(torch.isfinite(mean).all()):
        torch.testing.assert_close(big.double().mean(0).cpu(), mean, rtol=0.05, atol=0.05)
    if dc.has_rsample and name != "Wishart":  # (Wishart's rsample cannot backpropagate on the CPU either)
        cls, args, kw = _params(0)[name]
        ps = [a.to("tpu").requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        cls(*ps, **{k: _tpu(v) for k, v in kw.items()}).rsample((5,)).sum().backward()
        for p in ps:
            if isinstance(p, torch.Tensor):
                assert p.grad is not None and bool(torch.isfinite(p.grad).all())


@pytest.mark.parametrize("pair", [("Normal", "Laplace"), ("Beta", "Beta"), ("Exponential", "Gamma"),
                                  ("Bernoulli", "Bernoulli"), ("Categorical", "Categorical"),
                                  ("MultivariateNormal", "LowRankMultivariateNormal"), ("Dirichlet", "Dirichlet"),
                                  ("Poisson", "Poisson"), ("Uniform", "Normal")])
def test_kl_divergence(pair):
    (pc, pt), (qc, qt) = _both(pair[0]), _both(pair[1])
    if pair[0] == pair[1]:  # against itself with other parameters
        cls, args, kw = _params(7)[pair[1]]
        qc, qt = cls(*args, **kw), cls(*map(_tpu, args), **{k: _tpu(v) for k, v in kw.items()})
    expected = D.kl_divergence(pc, qc)
    assert not math.isnan(float(expected.sum()))
    _close(D.kl_divergence(pt, qt), expected)
