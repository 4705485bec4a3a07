"""FlexAttention (torch.nn.attention.flex_attention) on tpu: eager through
PyTorch's dense implementation, compiled as that implementation's ops inside
the graph's program.  The CPU has no FlexAttention backward, so gradients
are checked against the same attention written with plain ops in float64."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

import torch_pjrt

B, H, L, D = 2, 4, 64, 16


def causal(b, h, q, k):
    return q >= k


def sliding(b, h, q, k):
    return (q >= k) & (q - k < 16)


def reference(q, k, v, bias, mask_mod=causal):
    """The attention of `relative_bias` under mask_mod, in plain ops."""
    i = torch.arange(q.shape[-2])
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s + bias.to(s.dtype)[None, :, None, None] * (i[:, None] - i[None, :]) * 0.1
    s = s.masked_fill(~mask_mod(0, 0, i[:, None], i[None, :]), float("-inf"))
    return s.softmax(-1) @ v


def inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3)] + [torch.randn(H, generator=g)]


def run(fn, q, k, v, bias, mask_mod=causal):
    def relative_bias(score, b, h, qi, ki):  # reads a captured tensor
        return score + bias[h] * (qi - ki) * 0.1

    bm = create_block_mask(mask_mod, None, None, L, L, device=q.device.type)
    return fn(q, k, v, score_mod=relative_bias, block_mask=bm)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_forward_matches_cpu(dtype):
    q, k, v, bias = inputs(dtype)
    expected = run(flex_attention, q, k, v, bias)
    got = run(flex_attention, *(t.to("tpu") for t in (q, k, v, bias)))
    assert got.device.type == "tpu" and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gradients_match_float64(compiled):
    q, k, v, bias = inputs()
    g = torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(1))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    reference(*ref, bias.double()).backward(g.double())
    dev = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    before = torch_pjrt.metrics()
    out = run(fn, *dev, bias.to("tpu"))
    out.backward(g.to("tpu"))
    torch.testing.assert_close(out.detach().cpu().double(), reference(*(t.double() for t in (q, k, v)), bias.double()),
                               rtol=1e-5, atol=1e-5)
    for d, r in zip(dev, ref):
        torch.testing.assert_close(d.grad.cpu().double(), r.grad, rtol=1e-5, atol=1e-5)
    if compiled:  # forward and backward each one program, not run op by op
        after = torch_pjrt.metrics()
        assert after["graphs_eager"] == before["graphs_eager"]
        assert after["graphs_lowered"] >= before["graphs_lowered"] + 2


def test_default_compile_and_logsumexp():
    """torch.compile(flex_attention) without a backend (PyTorch's advice)
    takes the tpu backend; the log-sum-exp it returns is the CPU's."""
    q, k, v, bias = inputs()
    aux = AuxRequest(lse=True)
    expected, ref_aux = flex_attention(q, k, v, return_aux=aux)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, got_aux = torch.compile(flex_attention)(*(t.to("tpu") for t in (q, k, v)), return_aux=aux)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_aux.lse.cpu(), ref_aux.lse, rtol=1e-5, atol=1e-5)


class _Attention(nn.Module):
    """Grouped-query attention with a soft-capped score and a sliding window."""

    def __init__(self, d=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.dh = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.dh)
        self.o = nn.Linear(d, d)

    def forward(self, x, block_mask=None):
        n, t, _ = x.shape
        q = self.q(x).view(n, t, self.h, self.dh).transpose(1, 2)
        k, v = self.kv(x).view(n, t, 2, self.kvh, self.dh).permute(2, 0, 3, 1, 4)
        if block_mask is None:  # the same attention in plain ops
            k, v = (a.repeat_interleave(self.h // self.kvh, 1) for a in (k, v))
            s = 20 * torch.tanh(q @ k.transpose(-1, -2) / self.dh ** 0.5 / 20)
            i = torch.arange(t)
            y = s.masked_fill(~sliding(0, 0, i[:, None], i[None, :]), float("-inf")).softmax(-1) @ v
        else:
            y = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: 20 * torch.tanh(s / 20),
                               block_mask=block_mask, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(n, t, -1))


def test_training_matches_cpu_eager_and_compiled():
    torch.manual_seed(0)
    model = _Attention()
    x = torch.randn(2, L, 32)

    def train(m, x, bm, steps=4):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        losses = []
        for _ in range(steps):
            loss = m(x, bm).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ref = copy.deepcopy(model).double()
    expected = train(ref, x.double(), None)
    bm = create_block_mask(sliding, None, None, L, L, device="tpu")
    for compiled in (False, True):
        m = copy.deepcopy(model).to("tpu")
        got = train(torch.compile(m, backend="tpu") if compiled else m, x.to("tpu"), bm)
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                                   rtol=1e-4, atol=1e-6)
        for p, r in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu().double(), r.detach(), rtol=1e-4, atol=1e-4)


def test_other_devices_keep_pytorchs_check():
    q = torch.randn(1, 1, 16, 8, device="meta")
    with pytest.raises(ValueError, match="FlexAttention is only supported"):
        flex_attention(q, q, q)
