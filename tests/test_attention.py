"""scaled_dot_product_attention on "tpu": the fused overrideable backend
(torch_pjrt/_attention.py, r_sdpa/r_sdpa_backward in csrc/core/lower_nn.c),
and the math backend for the calls it does not take, against the CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_pjrt
from util import all_graphs_lowered, assert_close, check, lowered

F32 = torch.float32
aten = torch.ops.aten


def rnd(*shape, dtype=F32, seed=0, grad=True):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


def qkv(b, h, hk, l, s, e, ev, dtype=F32):
    return rnd(b, h, l, e, dtype=dtype, seed=1), rnd(b, hk, s, e, dtype=dtype, seed=2), rnd(b, hk, s, ev, dtype=dtype, seed=3)


def sdpa(q, k, v, mask=None, **kw):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def padding_mask():
    m = torch.rand(5, 7, generator=torch.Generator().manual_seed(4)) > 0.3
    m[2] = False  # a row that attends to nothing: zeros, as on the CPU
    return m


CASES = {
    "plain": ((2, 4, 4, 5, 5, 8, 8), {}),
    "cross, other value dim": ((2, 4, 4, 5, 7, 8, 6), {}),
    "causal": ((2, 4, 4, 5, 5, 8, 8), {"is_causal": True}),
    "causal, fewer queries": ((2, 4, 4, 3, 7, 8, 8), {"is_causal": True}),
    "causal, more queries": ((1, 2, 2, 7, 3, 8, 8), {"is_causal": True}),
    "grouped-query": ((2, 4, 2, 5, 5, 8, 8), {"enable_gqa": True}),
    "grouped-query, causal": ((2, 6, 2, 5, 5, 8, 8), {"enable_gqa": True, "is_causal": True}),
    "scale": ((2, 4, 4, 5, 7, 8, 8), {"scale": 0.3}),
    "bool mask": ((2, 4, 4, 5, 7, 8, 8), {"mask": padding_mask}),
    "float mask": ((2, 4, 4, 5, 7, 8, 8), {"mask": lambda: rnd(2, 1, 5, 7, seed=5, grad=False)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_attention_matches_cpu(case):
    dims, kw = CASES[case]
    kw = dict(kw)
    mask = (kw.pop("mask")(),) if "mask" in kw else ()
    with lowered() as names:
        check(sdpa, *qkv(*dims), *mask, grad=True, **kw)
    assert {"tp::sdpa", "tp::sdpa_backward"} <= names and "aten::bmm" not in names


@pytest.mark.parametrize("shape", [(2, 1, 5, 7), (4, 1, 7), (7,)])
def test_fused_attention_bias_gradient(shape):
    # A learned additive bias gets its gradient summed over the dims it broadcasts along.
    check(sdpa, *qkv(2, 4, 4, 5, 7, 8, 8), rnd(*shape, seed=6), grad=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_attention_low_precision(dtype):
    # Scores accumulate in float32, as the CPU's flash kernel does: the CPU's
    # float32 result, within the dtype's rounding.
    q, k, v = qkv(2, 4, 2, 6, 6, 8, 8, dtype=dtype)
    dev = [t.detach().to("tpu").requires_grad_() for t in (q, k, v)]
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out, exp = sdpa(*dev, is_causal=True, enable_gqa=True), sdpa(*ref, is_causal=True, enable_gqa=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), exp, rtol=2e-2, atol=2e-2)
    g = rnd(*out.shape, seed=7, grad=False)
    out.backward(g.to(dtype).to("tpu"))
    exp.backward(g.to(dtype).float())
    for a, r in zip(dev, ref):
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad.cpu().float(), r.grad, rtol=3e-2, atol=3e-2)


def test_fused_attention_float64_keeps_its_precision():
    q, k, v = qkv(1, 2, 2, 6, 6, 4, 4, dtype=torch.float64)
    check(sdpa, q, k, v, grad=True, is_causal=True, rtol=1e-12, atol=1e-12)


def test_fused_attention_is_one_program():
    q, k, v = (t.detach().to("tpu") for t in qkv(1, 2, 2, 3, 9, 8, 8))
    with torch.no_grad():
        sdpa(q, k, v)
        before = torch_pjrt.metrics()["executions"]
        sdpa(q, k, v)
    assert torch_pjrt.metrics()["executions"] == before + 1


@pytest.mark.parametrize("how", ["dropout", "3-d", "math selected"])
def test_other_calls_take_the_math_backend(how):
    q, k, v = qkv(2, 4, 4, 5, 5, 8, 8)
    if how == "3-d":
        q, k, v = (t.detach()[0].requires_grad_() for t in (q, k, v))
    with lowered() as names:
        if how == "dropout":
            out = sdpa(*(t.detach().to("tpu") for t in (q, k, v)), dropout_p=0.5)
            assert out.shape == q.shape  # random: only the shape is comparable
        elif how == "math selected":
            with sdpa_kernel(SDPBackend.MATH):
                check(sdpa, q, k, v, grad=True)
        else:
            check(sdpa, q, k, v, grad=True)
    assert "tp::sdpa" not in names and "aten::bmm" in names


def test_mismatched_heads_without_gqa_raise_as_on_cpu():
    q, k, v = qkv(2, 4, 2, 5, 5, 8, 8)
    with pytest.raises(RuntimeError) as cpu:
        sdpa(q, k, v)
    with pytest.raises(RuntimeError) as tpu:
        sdpa(*(t.to("tpu") for t in (q, k, v)))
    assert str(tpu.value) == str(cpu.value)


def compare_compiled(fn, ref, *ins):
    """fn compiled on tpu copies of ins against ref eagerly on the CPU: outputs and gradients."""
    cot = rnd(*ref(*ins).shape, seed=9, grad=False)
    dev = [t.detach().to("tpu").requires_grad_() for t in ins]
    with all_graphs_lowered():
        out = torch.compile(fn, backend="tpu", fullgraph=True)(*dev)
    expected = ref(*ins)
    assert_close(out, expected)
    out.backward(cot.to("tpu"))
    expected.backward(cot)
    for a, e in zip(dev, ins):
        assert_close(a.grad, e.grad)


def test_compiled_attention_matches_cpu():
    def f(q, k, v, m):
        return sdpa(q, k, v, m, enable_gqa=True).sin()

    compare_compiled(f, f, *qkv(2, 4, 2, 5, 7, 8, 8), rnd(2, 1, 5, 7, seed=8))


def test_traced_calls_take_the_math_backend():
    # Graphs keep the math backend's ops, which XLA fuses with the rest of
    # the graph (the fused kernels' backward recomputes the softmax, which
    # is slower there): fake tensors are not asked.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t.detach().to("tpu")) for t in qkv(2, 4, 4, 5, 5, 8, 8)]
        with Ops():
            sdpa(*fake, is_causal=True)
    assert "aten::bmm" in Ops.seen and not any("overrideable" in name for name in Ops.seen)


def test_compiled_graph_calling_the_fused_op_gets_its_kernels():
    def fused(q, k, v):
        return aten._scaled_dot_product_fused_attention_overrideable(q, k, v, None, 0.0, True)[0].sin()

    compare_compiled(fused, lambda q, k, v: sdpa(q, k, v, is_causal=True).sin(), *qkv(2, 4, 4, 5, 7, 8, 8))


def test_compiled_cpu_graph_attention_gradients():
    # A graph on CPU tensors compiled with backend="tpu" keeps the CPU's flash
    # attention whole (PyTorch's decomposition of it gave wrong gradients).
    def f(q, k, v):
        return sdpa(q, k, v, is_causal=True).sin()

    q, k, v = qkv(2, 4, 4, 5, 7, 8, 8)
    cot = rnd(2, 4, 5, 8, seed=10, grad=False)
    ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = torch.compile(f, backend="tpu")(*ins)
    out.backward(cot)
    f(q, k, v).backward(cot)
    for a, e in zip(ins, (q, k, v)):
        torch.testing.assert_close(a.grad, e.grad)


def test_vmap_takes_the_math_backend():
    # (aten::_fused_sdp_choice has no batching rule: vmap's calls are not asked.)
    q = rnd(3, 2, 4, 5, 8, grad=False)

    def f(x):
        return sdpa(x, x, x, is_causal=True)

    assert_close(torch.func.vmap(f)(q.to("tpu")), torch.func.vmap(f)(q))
