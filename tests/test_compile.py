"""torch.compile(backend="tpu"): whole graphs lowered with the eager rules."""
import warnings

import pytest
import torch

import torch_pjrt


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def test_inference_matches_cpu():
    m = _mlp()
    x = torch.randn(5, 8)
    ref = m(x)
    cm = torch.compile(_mlp().to("tpu"), backend="tpu")
    with torch.no_grad():
        out = cm(x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-6)


def test_one_program_per_graph():
    cm = torch.compile(_mlp().to("tpu"), backend="tpu")
    x = torch.randn(5, 8, device="tpu")
    with torch.no_grad():
        cm(x)
        before = torch_pjrt.metrics()["executions"]
        cm(x)
    assert torch_pjrt.metrics()["executions"] == before + 1


def test_training_matches_cpu():
    mc, mt = _mlp(), _mlp().to("tpu")
    oc = torch.optim.SGD(mc.parameters(), lr=0.1)
    ot = torch.optim.SGD(mt.parameters(), lr=0.1)
    cm = torch.compile(mt, backend="tpu")
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    for _ in range(5):
        lc = ((mc(x) - y) ** 2).mean()
        oc.zero_grad()
        lc.backward()
        oc.step()
        lt = ((cm(x.to("tpu")) - y.to("tpu")) ** 2).mean()
        ot.zero_grad()
        lt.backward()
        ot.step()
        assert abs(lt.item() - lc.item()) <= 1e-5 * abs(lc.item())
    for pc, pt in zip(mc.parameters(), mt.parameters()):
        torch.testing.assert_close(pt.cpu(), pc.detach(), rtol=1e-5, atol=1e-6)


def test_unsupported_op_runs_eagerly_with_warning():
    def f(x):
        return torch.fft.rfft(x).abs() + 1

    x = torch.randn(16)
    torch_pjrt.set_cpu_fallback(True)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = torch.compile(f, backend="tpu")(x.to("tpu"))
    finally:
        torch_pjrt.set_cpu_fallback(False)
    torch.testing.assert_close(out.cpu(), f(x), rtol=1e-5, atol=1e-5)
    assert any("eagerly" in str(x.message) and "fft" in str(x.message) for x in w)


def test_recompile_warning_names_the_input():
    def g(x, y):
        return x * 2 + y

    cg = torch.compile(g, backend="tpu", dynamic=False)
    y = torch.ones(1, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, 8):
            cg(torch.ones(n, device="tpu"), y)
    msgs = [str(x.message) for x in w if "compiled" in str(x.message) and "torch-pjrt" in str(x.message)]
    assert msgs, "no recompile warning"
    assert "x" in msgs[-1] and "->" in msgs[-1]


def test_bucket_pads_and_masks():
    x = torch.arange(5, device="tpu").reshape(1, 5)
    padded, mask = torch_pjrt.bucket(x, dim=1, sizes=(4, 8, 16))
    assert padded.shape == (1, 8) and mask.shape == (8,)
    assert torch.equal(padded.cpu(), torch.tensor([[0, 1, 2, 3, 4, 0, 0, 0]]))
    assert torch.equal(mask.cpu(), torch.tensor([True] * 5 + [False] * 3))
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        torch_pjrt.bucket(x, dim=1, sizes=(2, 4))


def test_bucketing_avoids_recompiles():
    f = torch.compile(lambda t: (t * 2).sum(), backend="tpu", dynamic=False)
    before = torch_pjrt.compile_counts()
    for n in (3, 5, 6, 7, 9, 12):
        padded, _ = torch_pjrt.bucket(torch.ones(n, device="tpu"), sizes=(8, 16))
        assert f(padded).item() == 2 * n
    new = {k: v - before.get(k, 0) for k, v in torch_pjrt.compile_counts().items() if v != before.get(k, 0)}
    assert sum(new.values()) == 2  # one compile per bucket size


def test_metrics_report():
    torch_pjrt.metrics()
    rep = torch_pjrt.metrics_report()
    for key in ("compiles", "compile_seconds", "cache_hits", "disk_hits", "executions", "h2d_bytes",
                "d2h_transfers", "cpu_fallbacks"):
        assert key in rep
