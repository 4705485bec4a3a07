"""Every torch.optim optimizer on "tpu" against the same optimizer on the CPU:
five steps of a small MLP, for-loop and foreach implementations, losses and
final weights; LR schedulers; LBFGS with a strong-Wolfe line search.

LBFGS is compared over few iterations: near the minimum its curvature pairs
amplify rounding, so that on the CPU alone one float64 ulp of change in the
initial weights moves the result of 20 iterations by 2.6e-6; differences there
measure the problem, not the device."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt  # noqa: F401

O = torch.optim
TOL = dict(rtol=1e-4, atol=1e-5)

CASES = {
    "SGD-nesterov": (O.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "Adam-amsgrad": (O.Adam, dict(lr=0.01, amsgrad=True)),
    "AdamW": (O.AdamW, dict(lr=0.01)),
    "Adagrad": (O.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    "RMSprop-centered": (O.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    "Adamax": (O.Adamax, dict(lr=0.01)),
    "NAdam-decoupled": (O.NAdam, dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1)),
    "RAdam": (O.RAdam, dict(lr=0.01)),
    "ASGD": (O.ASGD, dict(lr=0.01)),
    "Rprop": (O.Rprop, dict(lr=0.01)),
    "Adadelta": (O.Adadelta, dict(lr=1.0)),
    "Adafactor": (O.Adafactor, dict(lr=0.01)),
}


def _train(device, cls, kw, sched=None, steps=5):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    opt = cls(model.parameters(), **kw)
    scheduler = sched(opt) if sched else None
    x, y = torch.randn(10, 6).to(device), torch.randn(10, 3).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
        if scheduler:
            scheduler.step()
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


def _assert_same(cpu, tpu):
    torch.testing.assert_close(tpu[0], cpu[0], **TOL)
    for a, b in zip(cpu[1], tpu[1]):
        torch.testing.assert_close(b, a, **TOL)


# Adafactor has one implementation (no foreach argument).
@pytest.mark.parametrize("name,foreach", [
    (n, fe) for n in CASES for fe in (False, True) if not (n == "Adafactor" and fe)])
def test_optimizer_matches_cpu(name, foreach):
    cls, kw = CASES[name]
    if cls is not O.Adafactor:
        kw = dict(kw, foreach=foreach)
    _assert_same(_train("cpu", cls, kw), _train("tpu", cls, kw))


@pytest.mark.parametrize("sched", [
    lambda o: O.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10),
    lambda o: O.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2),
    lambda o: O.lr_scheduler.StepLR(o, 2, 0.5),
], ids=["OneCycle", "CosineWarmRestarts", "StepLR"])
def test_lr_schedulers_match_cpu(sched):
    kw = dict(lr=0.01, momentum=0.9)
    _assert_same(_train("cpu", O.SGD, kw, sched), _train("tpu", O.SGD, kw, sched))


def _lbfgs(device, dtype, max_iter):
    torch.manual_seed(0)
    model = nn.Linear(6, 3).to(device, dtype)
    x, y = torch.randn(10, 6).to(device, dtype), torch.randn(10, 3).to(device, dtype)
    opt = O.LBFGS(model.parameters(), lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")
    evals = []

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        evals.append(loss.item())
        return loss

    opt.step(closure)
    return evals, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("dtype,max_iter,tol", [
    (torch.float64, 10, 1e-12), (torch.float32, 4, 1e-5)], ids=["float64", "float32"])
def test_lbfgs_matches_cpu(dtype, max_iter, tol):
    cpu, tpu = _lbfgs("cpu", dtype, max_iter), _lbfgs("tpu", dtype, max_iter)
    assert len(tpu[0]) == len(cpu[0])  # the same number of closure evaluations
    torch.testing.assert_close(torch.tensor(tpu[0]), torch.tensor(cpu[0]), rtol=tol, atol=tol)
    for a, b in zip(cpu[1], tpu[1]):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)
