"""Ops PyTorch implements only for CPU and CUDA, yet calls on any PrivateUse1
device (torch_pjrt/_composite.py): nn.MultiheadAttention's and the
Transformer layers' inference fast path, and the fused optimizers.  Each is
compared with the CPU running the same code."""
import functools
import re

import pytest
import torch
import torch.nn as nn

import torch_pjrt
from torch_pjrt import _composite


@pytest.fixture
def calls(monkeypatch):
    """Counts calls of the tpu kernels, to show the fast path was taken."""
    seen = {}
    for name, fn in list(_composite.KERNELS.items()):
        def spy(*a, _fn=fn, _name=name, **k):
            seen[_name] = seen.get(_name, 0) + 1
            return _fn(*a, **k)
        monkeypatch.setitem(_composite.KERNELS, name, spy)
    from torch_pjrt import _dispatch
    monkeypatch.setattr(_dispatch, "_SPECIAL", {**_dispatch._SPECIAL, **_composite.KERNELS})
    return seen


def _both(make, run):
    out = []
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        m = make().to(dev).eval()
        with torch.no_grad():
            out.append(run(m, dev))
    return out


def _close(tpu, cpu, tol=1e-5):
    if isinstance(cpu, (tuple, list)):
        for a, b in zip(tpu, cpu):
            _close(a, b, tol)
    elif cpu is None:
        assert tpu is None
    else:
        assert tpu.device.type == "tpu"
        torch.testing.assert_close(tpu.cpu(), cpu, rtol=tol, atol=tol)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("masks", ["none", "padding", "attn", "both"])
def test_multihead_attention_fast_path(calls, need_weights, average, masks):
    B, T, D = 3, 6, 16
    x = torch.randn(B, T, D)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 1:] = True
    attn = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def run(m, dev):
        kw = {"need_weights": need_weights, "average_attn_weights": average}
        if masks in ("padding", "both"):
            kw["key_padding_mask"] = pad.to(dev)
        if masks in ("attn", "both"):
            kw["attn_mask"] = attn.to(dev)
        xd = x.to(dev)
        return m(xd, xd, xd, **kw)

    cpu, tpu = _both(lambda: nn.MultiheadAttention(D, 4, batch_first=True), run)
    _close(tpu, cpu)
    assert calls.get("aten::_native_multi_head_attention") == 1


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_fast_path(calls, norm_first, activation):
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])

    def make():
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=activation, batch_first=True,
                                          norm_first=norm_first)

    cpu, tpu = _both(make, lambda m, dev: (m(x.to(dev)), m(x.to(dev), src_key_padding_mask=pad.to(dev))))
    _close(tpu, cpu)
    assert calls.get("aten::_transformer_encoder_layer_fwd") == 2


def test_transformer_encoder_with_padding_mask():
    # On CPU this packs the batch into a NestedTensor; on tpu the layers take
    # the padding mask instead: unpadded positions agree.
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])

    def make():
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2)

    cpu, tpu = _both(make, lambda m, dev: m(x.to(dev), src_key_padding_mask=pad.to(dev)))
    torch.testing.assert_close(tpu.cpu()[~pad], cpu[~pad], rtol=1e-5, atol=1e-5)


def test_transformer_inference():
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    cpu, tpu = _both(lambda: nn.Transformer(16, 2, 2, 2, 32, dropout=0.0, batch_first=True),
                     lambda m, dev: m(src.to(dev), tgt.to(dev), tgt_mask=causal.to(dev)))
    _close(tpu, cpu, 1e-4)


@pytest.mark.parametrize("mask_type", [0, 1, 2])
def test_masked_softmax(mask_type):
    x = torch.randn(2, 3, 4, 4)
    if mask_type == 0:
        mask = torch.rand(4, 4) > 0.5
    elif mask_type == 1:
        mask = torch.tensor([[False, True, False, True], [True, True, True, True]])  # batch 1: every key masked
    else:
        mask = torch.rand(2, 3, 4, 4) > 0.5
    xt, mt = x.to("tpu"), mask.to("tpu")
    torch.testing.assert_close(torch._masked_softmax(xt, mt, 3, mask_type).cpu(),
                               torch._masked_softmax(x, mask, 3, mask_type), equal_nan=True)
    with pytest.raises(RuntimeError, match="boolean"):
        torch._masked_softmax(xt, mt.float(), 3, mask_type)
    # Gradients: the CPU takes only a mask shaped like the input.
    full = (mask.view(1, 1, 4, 4) if mask_type == 0 else mask.view(2, 1, 1, 4) if mask_type == 1 else mask)
    full = full.expand(2, 3, 4, 4).contiguous()
    g = torch.randn(2, 3, 4, 4)
    grads = []
    for dev in ("cpu", "tpu"):
        xd = x.to(dev).requires_grad_()
        y = torch._masked_softmax(xd, full.to(dev), 3, 2)
        grads.append(torch.autograd.grad(y, xd, g.to(dev))[0].cpu())
        if mask_type != 2:
            with pytest.raises(RuntimeError, match="Mask shape should match grad shape"):
                xd = x.to(dev).requires_grad_()
                torch._masked_softmax(xd, mask.to(dev), 3, mask_type).backward(g.to(dev))
    torch.testing.assert_close(grads[1], grads[0])


OPTIMIZERS = [
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.Adam, {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True}),
    (torch.optim.Adam, {"lr": torch.tensor(0.05), "maximize": True}),
    (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 0.05, "amsgrad": True, "betas": (0.8, 0.9)}),
    (torch.optim.SGD, {"lr": 0.05}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "maximize": True}),
    (torch.optim.Adagrad, {"lr": 0.05}),
    (torch.optim.Adagrad, {"lr": 0.05, "lr_decay": 0.1, "weight_decay": 0.1, "initial_accumulator_value": 0.2}),
    (torch.optim.Adagrad, {"lr": torch.tensor(0.05), "maximize": True, "eps": 1e-3}),
]


@pytest.mark.parametrize("opt_cls,kw", OPTIMIZERS)
def test_fused_optimizers(calls, opt_cls, kw):
    def run(dev):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dev)
        opt = opt_cls(m.parameters(), fused=True, **kw)
        x = torch.randn(10, 6).to(dev)
        for _ in range(4):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
        return [p.detach() for p in m.parameters()] + [
            v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]

    cpu, tpu = run("cpu"), run("tpu")
    assert len(cpu) == len(tpu)
    for a, b in zip(tpu, cpu):  # the CPU's bias corrections are in float64
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)
    name = {torch.optim.Adam: "_fused_adam_", torch.optim.AdamW: "_fused_adamw_", torch.optim.SGD: "_fused_sgd_",
            torch.optim.Adagrad: "_fused_adagrad_"}
    assert sum(n for k, n in calls.items() if k.startswith("aten::" + name[opt_cls])) == 4


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad])
def test_fused_optimizer_with_grad_scaler(opt_cls):
    # GradScaler hands the fused step grad_scale and found_inf: the grads are
    # unscaled in place, and a step with an inf changes nothing.
    def run(dev):
        torch.manual_seed(0)
        m = nn.Linear(6, 3).to(dev)
        opt = opt_cls(m.parameters(), lr=0.05, momentum=0.9, fused=True) if opt_cls is torch.optim.SGD \
            else opt_cls(m.parameters(), lr=0.05, fused=True)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 8)
        x = torch.randn(10, 6).to(dev)
        hist = []
        for i in range(4):
            opt.zero_grad()
            scaler.scale(m(x).pow(2).mean()).backward()
            if i == 2:
                m.weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            hist.append([p.detach().cpu().clone() for p in m.parameters()] + [m.bias.grad.cpu()])
        return hist

    cpu, tpu = run("cpu"), run("tpu")
    for a, b in zip(tpu, cpu):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    for x, y in zip(tpu[2][:2], tpu[1][:2]):  # the inf step changed nothing
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scaled", [False, True])
def test_fused_adagrad_op(dtype, scaled):
    # The op itself against the CPU kernel: grad_scale unscales the grads in
    # place; found_inf set leaves every tensor (grads included) untouched.
    # float16/bfloat16 compute in float32 and round each result once.
    torch.manual_seed(0)
    shapes = [(33,), (4, 5)]
    params = [torch.randn(s).to(dtype) for s in shapes]
    grads = [torch.randn(s).to(dtype) for s in shapes]
    sums = [torch.rand(s).to(dtype) for s in shapes]
    steps = [torch.tensor(3.0), torch.tensor(1.0)]
    kw = dict(lr=0.1, lr_decay=0.05, weight_decay=0.01, eps=1e-6, maximize=False)
    for inf in ([0.0, 1.0] if scaled else [None]):
        if scaled:
            kw.update(grad_scale=torch.tensor(8.0), found_inf=torch.tensor(inf))
        cpu = [[t.clone() for t in ts] for ts in (params, grads, sums, steps)]
        tpu = [[t.to("tpu") for t in ts] for ts in (params, grads, sums, steps)]
        torch._fused_adagrad_(*cpu, **kw)
        torch._fused_adagrad_(*tpu, **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
        tol = {torch.float32: 1e-6, torch.float64: 1e-12}.get(dtype, 1e-2)
        for a_list, b_list in zip(tpu, cpu):
            for a, b in zip(a_list, b_list):
                assert a.dtype == b.dtype
                torch.testing.assert_close(a.cpu(), b, rtol=tol, atol=tol)
        if inf:
            for a, b in zip(tpu[0] + tpu[1] + tpu[2], params + grads + sums):
                assert torch.equal(a.cpu(), b)
    # (No compiled case: Dynamo does not trace into fused optimizers, and
    # PyTorch has no fake kernel for _fused_adagrad_ to trace it directly.)


@pytest.mark.parametrize("x", [
    torch.tensor([3, 3, 1, 2, 2]),  # a tie: the smaller value, its last index
    torch.tensor([5.0, 1.0, 5.0, 1.0, 7.0]),
    torch.tensor([[1, 2, 2, 3], [4, 4, 1, 1]]),
    torch.tensor(3.0),
    torch.randint(0, 4, (3, 5, 7)),
    torch.tensor([True, False, True]),
    torch.empty(0, 3),
], ids=lambda t: f"{t.dtype}-{list(t.shape)}")
def test_mode(x):
    for dim in range(-1, max(x.dim(), 1)):
        for keepdim in (False, True):
            try:
                want = torch.mode(x, dim, keepdim)
            except IndexError as e:  # an empty reduced dim
                with pytest.raises(IndexError, match=re.escape(str(e))):
                    torch.mode(x.to("tpu"), dim, keepdim)
                continue
            got = torch.mode(x.to("tpu"), dim, keepdim)
            assert torch.equal(got.values.cpu(), want.values) and torch.equal(got.indices.cpu(), want.indices)


def test_rrelu():
    import torch.nn.functional as F

    x = torch.randn(1000)
    # eval: the mean slope, exactly as on the CPU (also in place)
    torch.testing.assert_close(F.rrelu(x.to("tpu")).cpu(), F.rrelu(x))
    y = x.to("tpu")
    F.rrelu(y, inplace=True)
    torch.testing.assert_close(y.cpu(), F.rrelu(x))
    # training: a slope in [lower, upper] per negative input, and the
    # gradient is that slope
    xt = x.to("tpu").requires_grad_()
    out = F.rrelu(xt, 0.1, 0.3, training=True)
    out.sum().backward()
    slope, grad = (out / xt).detach().cpu(), xt.grad.cpu()
    neg = x < 0
    assert ((slope[neg] >= 0.1) & (slope[neg] <= 0.3)).all() and slope[neg].std() > 0.03
    assert (slope[~neg] == 1).all()
    torch.testing.assert_close(grad, torch.where(neg, slope, torch.ones_like(slope)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss(reduction, zero_infinity, concatenated):
    import torch.nn.functional as F

    torch.manual_seed(0)
    T, N, C = 12, 5, 6
    lp = torch.randn(T, N, C, dtype=torch.float64).log_softmax(2)
    tl = torch.tensor([3, 0, 5, 2, 3])
    il = torch.tensor([12, 7, 9, 2, 3])
    tg = torch.randint(1, C, (N, 5))
    tg[0, :3] = torch.tensor([2, 2, 3])  # a repeated label needs a blank between
    tg[4, :3] = torch.tensor([4, 4, 4])  # 3 inputs cannot hold 4 4 4: infinite loss
    if concatenated:
        tg = torch.cat([tg[b, :tl[b]] for b in range(N)])
    out = []
    for dev in ("cpu", "tpu"):
        x = lp.to(dev).requires_grad_()
        loss = F.ctc_loss(x, tg.to(dev), il, tl, reduction=reduction, zero_infinity=zero_infinity)
        (g,) = torch.autograd.grad(loss.sum(), x)
        out.append((loss.detach().cpu(), g.cpu()))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-8, atol=1e-10, equal_nan=True)


def test_ctc_loss_unbatched_and_errors():
    import torch.nn.functional as F

    lp = torch.randn(8, 5).log_softmax(1)
    tg = torch.tensor([1, 2, 2])
    want = F.ctc_loss(lp, tg, torch.tensor(8), torch.tensor(3))
    torch.testing.assert_close(F.ctc_loss(lp.to("tpu"), tg.to("tpu"), torch.tensor(8), torch.tensor(3)).cpu(), want)
    with pytest.raises(RuntimeError, match="input_lengths to have value at most 8"):
        F.ctc_loss(lp.to("tpu").unsqueeze(1), tg.unsqueeze(0).to("tpu"), [9], [3])


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_backward(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6)
    grid = torch.rand(2, 4, 3, 2) * 2.4 - 1.2  # some points outside [-1, 1]
    _grid_sample_matches_cpu(x, grid, torch.randn(2, 3, 4, 3), 1e-4, mode=mode, padding_mode=padding_mode,
                             align_corners=align_corners)


def _grid_sample_matches_cpu(x, grid, go, tol, **kwargs):
    """grid_sample's output and its input and grid gradients on tpu match the CPU's."""
    import torch.nn.functional as F

    res = []
    for dev in ("cpu", "tpu"):
        xd, gd = x.to(dev).requires_grad_(), grid.to(dev).requires_grad_()
        y = F.grid_sample(xd, gd, **kwargs)
        res.append([t.cpu() for t in (y, *torch.autograd.grad(y, (xd, gd), go.to(dev)))])
    for a, b in zip(res[1], res[0]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    """5-d grid_sample (grid_sampler_3d: PyTorch has only CPU/CUDA kernels),
    forward and backward, float32 and float64."""
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        x = torch.randn(2, 3, 4, 5, 6, dtype=dtype)
        grid = torch.rand(2, 3, 4, 2, 3, dtype=dtype) * 2.6 - 1.3  # some points outside [-1, 1]
        _grid_sample_matches_cpu(x, grid, torch.randn(2, 3, 3, 4, 2, dtype=dtype), 1e-5, mode=mode,
                                 padding_mode=padding_mode, align_corners=align_corners)
    with pytest.raises(RuntimeError, match="bicubic interpolation only supports 4D input"):
        torch.ops.aten.grid_sampler_3d(x.to("tpu"), grid.to("tpu"), 2, 0, False)


@pytest.mark.parametrize("case", ["grid2d_bilinear", "grid2d_bicubic", "grid2d_nearest", "grid3d", "bicubic_up"])
def test_cpu_only_backward_in_compiled_graphs(case):
    """These ops' backward kernels exist only for CPU/CUDA; on tpu autograd
    differentiates their forward's tpu ops, which also works when AOTAutograd
    traces a compiled graph (a backward computed with torch.func could not be
    traced)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    if case == "bicubic_up":
        args = (torch.randn(2, 3, 5, 6),)

        def f(x):
            return F.interpolate(x, scale_factor=1.5, mode="bicubic", align_corners=True).sin().sum()
    else:
        five = case == "grid3d"
        args = (torch.randn(2, 3, *([4] * (3 if five else 2))), torch.rand(2, 3, 2, *([3] if five else []),
                                                                            3 if five else 2) * 2.4 - 1.2)
        mode = "bilinear" if five else case.split("_")[1]

        def f(x, g):
            return F.grid_sample(x, g, mode=mode, padding_mode="reflection", align_corners=False).sin().sum()
    want_args = [a.clone().requires_grad_() for a in args]
    f(*want_args).backward()
    got_args = [a.to("tpu").requires_grad_() for a in args]
    before = torch_pjrt.metrics()["graphs_eager"]
    torch.compile(f, backend="tpu")(*got_args).backward()
    assert torch_pjrt.metrics()["graphs_eager"] == before  # every graph lowered whole
    for a, b in zip(got_args, want_args):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [{"size": (7, 9)}, {"scale_factor": 1.7}, {"scale_factor": (2, 0.5)}],
                         ids=["size", "scale", "scales"])
def test_bicubic_upsample_backward(align_corners, size):
    # Autograd calls the out= form (upsample_bicubic2d_backward.grad_input).
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6)
    res = []
    for dev in ("cpu", "tpu"):
        xd = x.to(dev).requires_grad_()
        y = F.interpolate(xd, mode="bicubic", align_corners=align_corners, **size)
        g = torch.ones_like(y) * torch.arange(y.shape[-1], device=dev)
        res.append(torch.autograd.grad(y, xd, g)[0].cpu())
    torch.testing.assert_close(res[1], res[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(reduction, compiled):
    # Compiled: PyTorch's own decomposition (which tracing runs for the op,
    # also for Inductor) counts the targets after a row's first -1; graphs
    # keep the op whole instead.
    import torch._dynamo
    import torch.nn.functional as F

    torch.manual_seed(0)
    cases = [(torch.randn(4), torch.tensor([3, 0, -1, 1])),
             (torch.randn(3, 5), torch.tensor([[3, 0, -1, 1, 2], [1, 1, 2, -1, 0], [-1, 0, 0, 0, 0]])),
             (torch.randn(2, 4), torch.tensor([[0, 1, 2, 3], [3, 3, 3, 3]]))]
    fn = functools.partial(F.multilabel_margin_loss, reduction=reduction)
    for x, t in cases:
        out = []
        for dev in ("cpu", "tpu"):
            xd = x.to(dev).requires_grad_()
            if dev == "tpu" and compiled:
                torch._dynamo.reset()
                loss = torch.compile(fn, backend="tpu", fullgraph=True)(xd, t.to(dev))
            else:
                loss = fn(xd, t.to(dev))
            (g,) = torch.autograd.grad(loss.sum(), xd)
            out.append((loss.detach().cpu(), g.cpu()))
        torch.testing.assert_close(out[1][0], out[0][0])
        torch.testing.assert_close(out[1][1], out[0][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fake_quantize_matches_cpu_bit_for_bit(dtype):
    """Quantization-aware training's fake quantization (per tensor with float
    or tensor qparams, per channel), values and masks, and the gradient
    through the FakeQuantize modules."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 5, generator=g) * 3).to(dtype)
    x[0, :3] = torch.tensor([0.25, 0.35, 0.05]).to(dtype)  # ties at scale 0.1 (round half to even)
    tpu = lambda t: t.to("tpu")
    for args in ((0.1, 3, -128, 127), (0.0123, 0, 0, 255), (0.5, -2, -8, 7)):
        assert torch.equal(torch.fake_quantize_per_tensor_affine(tpu(x), *args).cpu(),
                           torch.fake_quantize_per_tensor_affine(x, *args))
        sc, zp = torch.tensor([args[0]]), torch.tensor([args[1]], dtype=torch.int32)
        assert torch.equal(torch.fake_quantize_per_tensor_affine(tpu(x), tpu(sc), tpu(zp), *args[2:]).cpu(),
                           torch.fake_quantize_per_tensor_affine(x, sc, zp, *args[2:]))
    sc = torch.rand(5, generator=g) * 0.2 + 0.01
    zp = torch.tensor([0, 1, -3, 4, 2], dtype=torch.int32)
    assert torch.equal(torch.fake_quantize_per_channel_affine(tpu(x), tpu(sc), tpu(zp), 1, -10, 10).cpu(),
                       torch.fake_quantize_per_channel_affine(x, sc, zp, 1, -10, 10))
    if dtype != torch.float32:
        return
    for make in (lambda: torch.ao.quantization.FakeQuantize(),
                 lambda: torch.ao.quantization.FakeQuantize(
                     observer=torch.ao.quantization.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                     quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0)):
        res = []
        for dev in ("cpu", "tpu"):
            fq = make().to(dev)
            xi = x.detach().clone().to(dev).requires_grad_()
            y = fq(xi)
            (y * torch.arange(5.0, device=dev)).sum().backward()
            res.append((y.detach().cpu(), xi.grad.cpu(), fq.scale.cpu(), fq.zero_point.cpu()))
        for a, b in zip(*res):
            assert torch.equal(a, b)


def test_fused_observer_fake_quantize_matches_cpu():
    """FusedMovingAvgObsFakeQuantize (PyTorch's default QAT qconfig, its fused
    observer): outputs, gradients, scales and zero points bit for bit, per
    tensor affine and symmetric and per channel, with the observer and the
    fake quantization switched off on the way."""
    import torch.ao.quantization as Q

    qc = Q.get_default_qat_qconfig("x86")
    sym = Q.FusedMovingAvgObsFakeQuantize.with_args(observer=Q.MovingAverageMinMaxObserver, quant_min=-128,
                                                    quant_max=127, dtype=torch.qint8,
                                                    qscheme=torch.per_tensor_symmetric)
    res = {}
    for dev in ("cpu", "tpu"):
        mods = [qc.activation().to(dev), qc.weight().to(dev), sym().to(dev)]
        g, outs = torch.Generator().manual_seed(3), []
        for step in range(4):
            x = (torch.randn(4, 6, generator=g) * (step + 1)).to(dev).requires_grad_()
            if step == 2:
                mods[0].disable_observer()
                mods[1].disable_fake_quant()
            for m in mods:
                y = m(x)
                (y * torch.arange(6.0, device=dev)).sum().backward()
                outs.append((y.detach().cpu(), x.grad.cpu(), m.scale.cpu().clone(), m.zero_point.cpu().clone()))
                x.grad = None
        res[dev] = outs
    for a, b in zip(res["cpu"], res["tpu"]):
        for u, v in zip(a, b):
            assert torch.equal(u, v)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_quantization_aware_training_matches_cpu(compiled):
    import copy

    import torch.ao.quantization as Q

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.dq = Q.QuantStub(), Q.DeQuantStub()
            self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.dq(self.l2(torch.relu(self.l1(self.q(x)))))

    torch.manual_seed(0)
    base = Net()
    base.qconfig = Q.get_default_qat_qconfig("x86")
    base = Q.prepare_qat(base.train())
    res = []
    for dev in ("cpu", "tpu"):
        m = copy.deepcopy(base).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        f = torch.compile(m, backend="tpu") if compiled and dev == "tpu" else m
        g, losses = torch.Generator().manual_seed(1), []
        for _ in range(4):
            x, y = torch.randn(5, 6, generator=g).to(dev), torch.randint(0, 3, (5,), generator=g).to(dev)
            loss = torch.nn.functional.cross_entropy(f(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        res.append((losses, {k: v.detach().cpu() for k, v in m.state_dict().items()}))
    torch.testing.assert_close(torch.tensor(res[1][0]), torch.tensor(res[0][0]), rtol=1e-6, atol=1e-6)
    for k, v in res[0][1].items():
        torch.testing.assert_close(res[1][1][k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.Adam, {"lr": 1e-2}),
    (torch.optim.AdamW, {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.1}),
])
def test_fused_optimizers_compute_half_precision_in_float32(dtype, opt_cls, kw):
    """PyTorch's fused kernels compute float16/bfloat16 parameters in float32
    and round once: tiny gradients (whose squares underflow in float16) must
    not turn Adam's step into inf/NaN."""
    def run(dev):
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(64).to(dtype).to(dev))
        opt = opt_cls([p], fused=True, **kw)
        for k in range(5):
            p.grad = (torch.randn(64) * 10.0 ** (-3 - k % 2)).to(dtype).to(dev)
            opt.step()
        return [p.detach().cpu()] + [v.cpu() for v in opt.state[p].values() if v.dim() > 0]

    cpu, tpu = run("cpu"), run("tpu")
    for a, b in zip(tpu, cpu):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("args,kw", [((5,), {}), ((8, False), {}), ((16, True, 5.0), {}), ((1,), {}), ((0,), {}),
                                     ((7,), {"dtype": torch.float64}), ((9, False, 3.0), {"dtype": torch.bfloat16})])
def test_kaiser_window(args, kw):
    """kaiser_window's composite kernel ends in a CPU/CUDA-only DispatchStub
    (an internal assert for tpu): a tpu kernel computes the CPU's formula."""
    got = torch.kaiser_window(*args, device="tpu", **kw)
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), torch.kaiser_window(*args, **kw), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="floating point dtypes"):
        torch.kaiser_window(4, dtype=torch.int64, device="tpu")
