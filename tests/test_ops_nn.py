"""Neural-network ops (csrc/core/lower_nn.c) on "tpu" against PyTorch on CPU:
normalisations, losses, convolution, pooling and upsampling, forward and
backward."""
import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

from util import assert_close, check

aten = torch.ops.aten

F32 = torch.float32
BF16 = torch.bfloat16


def rnd(*shape, dtype=F32, grad=True, seed=0):
    # (offset: util.check seeds its output gradients with generator seed 0)
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    return x.requires_grad_(grad)


def check_lowp(fn, *args, grad=False, rtol=2e-2, atol=2e-2):
    """bf16/f16 inputs: PyTorch's CPU kernels round some intermediates to the
    low precision while the lowerings keep them in f32 (opmath), so compare
    the tpu results against the f32 computation on CPU (and dtypes/shapes
    against the low-precision CPU run)."""
    from torch.utils._pytree import tree_flatten, tree_map

    def up(x):
        if isinstance(x, torch.Tensor):
            y = x.detach().float() if x.is_floating_point() else x.detach().clone()
            return y.requires_grad_(x.requires_grad)
        return x

    ref_args = tree_map(up, args)
    lowp_args = tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad)
                         if isinstance(x, torch.Tensor) else x, args)
    tpu_args = tree_map(lambda x: x.detach().to("tpu").requires_grad_(x.requires_grad)
                        if isinstance(x, torch.Tensor) else x, args)
    ref, lowp, act = fn(*ref_args), fn(*lowp_args), fn(*tpu_args)
    r_flat, l_flat, a_flat = tree_flatten(ref)[0], tree_flatten(lowp)[0], tree_flatten(act)[0]
    assert len(r_flat) == len(a_flat)
    for r, l, a in zip(r_flat, l_flat, a_flat):
        if isinstance(l, torch.Tensor):
            assert a.dtype == l.dtype and a.shape == l.shape and a.device.type == "tpu"
            torch.testing.assert_close(a.cpu().float(), r.float(), rtol=rtol, atol=atol, equal_nan=True)
    if grad:
        outs = [(r, a) for r, a in zip(r_flat, a_flat) if isinstance(a, torch.Tensor) and a.requires_grad]
        gen = torch.Generator().manual_seed(0)
        seeds = [torch.randn(a.shape, generator=gen, dtype=a.dtype) for _, a in outs]
        torch.autograd.backward([r for r, _ in outs], [s.float() for s in seeds])
        torch.autograd.backward([a for _, a in outs], [s.to("tpu") for s in seeds])
        for r, a in zip(tree_flatten(ref_args)[0], tree_flatten(tpu_args)[0]):
            if isinstance(r, torch.Tensor) and r.requires_grad:
                assert a.grad is not None and a.grad.dtype == a.dtype
                torch.testing.assert_close(a.grad.cpu().float(), r.grad, rtol=rtol, atol=atol, equal_nan=True)
    return act


def check_any(fn, *args, dtype=F32, **kw):
    return check(fn, *args, **kw) if dtype == F32 else check_lowp(fn, *args, **kw)


def _uses_rule(name):
    from torch_pjrt import _C

    return _C.has_lowering(name)


# Some ops have CompositeExplicitAutograd kernels (native_layer_norm,
# convolution, convolution_backward, native_group_norm): PyTorch runs those
# kernels for PrivateUse1 instead of our fallback.  Route them to the
# fallback for this module's tests (unless the package already does), so the
# lowering rules are what runs.
_CEA_OPS = [
    "native_layer_norm",
    "native_group_norm",
    "convolution",
    "convolution_backward",
    "_native_batch_norm_legit_functional",
]


@pytest.fixture(scope="module", autouse=True)
def route_composite_ops():
    from torch_pjrt import _dispatch

    lib = torch.library.Library("aten", "IMPL")
    routed = []
    for name in _CEA_OPS:
        if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"):
            continue
        op = getattr(aten, name).default
        lib.impl(name, functools.partial(_dispatch._fallback, op), "PrivateUse1")
        routed.append(name)
    yield routed
    lib._destroy()


def test_composite_ops_reach_the_rules(route_composite_ops):
    for name in _CEA_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name
        assert _uses_rule("aten::" + name), name


def test_rules_registered():
    for name in ["aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::native_batch_norm",
                 "aten::native_batch_norm_backward", "aten::nll_loss_forward", "aten::nll_loss_backward",
                 "aten::nll_loss2d_forward", "aten::nll_loss2d_backward", "aten::mse_loss",
                 "aten::mse_loss_backward"]:
        assert _uses_rule(name), name


# ---------------------------------------------------------------------------
# layer norm


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape,ns", [((2, 3, 8), (8,)), ((2, 3, 8), (3, 8)), ((5, 16), (16,)), ((4,), (4,))])
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_layer_norm(dtype, shape, ns, affine):
    x = rnd(*shape, dtype=dtype)
    w = rnd(*ns, dtype=dtype, seed=1) if "w" in affine else None
    b = rnd(*ns, dtype=dtype, seed=2) if "b" in affine else None
    check_any(lambda x, w, b: F.layer_norm(x, ns, w, b, eps=1e-5), x, w, b, grad=True, dtype=dtype)


# Normalized sizes over 32 are computed as two dims (csrc/core/lower_nn.c,
# ln_shape): 64 = 2 x 32, 100 = 4 x 25, (3, 40) = 4 x 30; 37 and 300 do not split.
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape,ns", [((4, 64), (64,)), ((2, 3, 100), (100,)), ((2, 3, 40), (3, 40)),
                                      ((3, 37), (37,)), ((2, 300), (300,))])
def test_layer_norm_long_rows(dtype, shape, ns):
    x = rnd(*shape, dtype=dtype) * 3 + 1
    w, b = rnd(*ns, dtype=dtype, seed=1), rnd(*ns, dtype=dtype, seed=2)
    check_any(lambda x, w, b: F.layer_norm(x, ns, w, b, eps=1e-5), x, w, b, grad=True, dtype=dtype)
    check_any(lambda x: F.layer_norm(x, ns), x, grad=True, dtype=dtype)


def test_layer_norm_stats_and_dtypes():
    for dtype in (F32, BF16):
        x = rnd(2, 3, 8, dtype=dtype, grad=False)
        w = rnd(3, 8, dtype=dtype, grad=False, seed=1)
        # native_layer_norm itself: mean/rstd shaped [2, 1, 1], in CPU's dtype:
        # the input's (the meta function says f32 for bf16, as CUDA does).
        out = aten.native_layer_norm(x.to("tpu"), [3, 8], w.to("tpu"), None, 1e-5)
        exp = aten.native_layer_norm(x.float(), [3, 8], w.float(), None, 1e-5)
        assert out[0].dtype == dtype and out[1].dtype == dtype and out[2].dtype == dtype
        assert out[1].shape == (2, 1, 1) and out[2].shape == (2, 1, 1)
        tol = 1e-5 if dtype == F32 else 1e-2
        for a, b in zip(out, exp):
            torch.testing.assert_close(a.cpu().float(), b, rtol=tol, atol=tol)


def test_layer_norm_noncontiguous_and_eps():
    x = rnd(8, 6).t()  # (6, 8), transposed
    w = rnd(8, seed=1)
    check(lambda x, w: F.layer_norm(x, (8,), w, None, eps=0.5), x, w, grad=True)
    x = rnd(4, 10)[:, ::2]  # sliced
    check(lambda x: F.layer_norm(x, (5,)), x, grad=True)


def test_layer_norm_zero_batch_and_nan():
    check(lambda x: F.layer_norm(x, (8,)), rnd(0, 8), grad=True)
    x = rnd(3, 8, grad=False)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    out = check(lambda x: F.layer_norm(x, (8,)), x)
    assert torch.isnan(out[1].cpu()).all() and not torch.isnan(out[0].cpu()).any()


@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_layer_norm_backward_masks(mask, affine):
    """Masked-out outputs (and grads of absent weight/bias) are None."""
    if not (mask[0] or (mask[1] and "w" in affine) or (mask[2] and "b" in affine)):
        return  # nothing defined: PyTorch's CPU kernel itself fails
    x = rnd(4, 6, grad=False)
    mean = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    w = rnd(6, grad=False, seed=1) if "w" in affine else None
    b = rnd(6, grad=False, seed=2) if "b" in affine else None
    go = rnd(4, 6, grad=False, seed=3)
    args = (go, x, [6], mean, rstd, w, b)
    res = aten.native_layer_norm_backward(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args],
                                          list(mask))
    # (PyTorch's CPU kernel fails when grad_input is masked out, or when asked for the
    # grad of an absent weight: ask it for what exists)
    exp = aten.native_layer_norm_backward(*args, [True, w is not None, b is not None])
    meta = aten.native_layer_norm_backward(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args],
                                           list(mask))
    assert [r is None for r in res] == [m is None for m in meta]
    for r, e in zip(res, exp):
        if r is not None:
            assert_close(r, e, rtol=1e-5, atol=1e-5)


def test_layer_norm_frozen_params():
    x, w, b = rnd(3, 8), rnd(8, grad=False, seed=1), rnd(8, seed=2)
    check(lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b, grad=True)
    x, w, b = rnd(3, 8, grad=False), rnd(8, seed=1), rnd(8, grad=False, seed=2)
    check(lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b, grad=True)


def test_layer_norm_module_training_step():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    mt = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    x = rnd(5, 8, grad=False)
    m(x).square().mean().backward()
    mt(x.to("tpu")).square().mean().backward()
    for p, q in zip(m.parameters(), mt.parameters()):
        assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# batch norm


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4), (2, 3, 2, 2, 3)])
def test_batch_norm_eval(dtype, shape):
    C = shape[1]
    x = rnd(*shape, dtype=dtype)
    rm = rnd(C, grad=False, seed=4).to(dtype)
    rv = (rnd(C, grad=False, seed=5).abs() + 0.5).to(dtype)
    w, b = rnd(C, dtype=dtype, seed=1), rnd(C, dtype=dtype, seed=2)
    check_any(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3), x, rm, rv, w, b,
              grad=True, dtype=dtype)
    check_any(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False), x, rm, rv, grad=True, dtype=dtype)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_train_no_stats(dtype, shape):
    C = shape[1]
    x = rnd(*shape, dtype=dtype)
    w, b = rnd(C, dtype=dtype, seed=1), rnd(C, dtype=dtype, seed=2)
    check_any(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, grad=True, dtype=dtype)
    check_any(lambda x: F.batch_norm(x, None, None, training=True), x, grad=True, dtype=dtype)


@pytest.mark.parametrize("mu, sd", [(100.0, 0.01), (3.0, 1e-3), (0.0, 1.0)])
def test_batch_norm_train_stats_where_mean_dwarfs_std(mu, sd):
    """PyTorch's CPU kernel sums float32 statistics in double; ours stay in
    float32 with a corrected two-pass mean and variance. Against float64, the
    output's error must stay at the CPU's level even where |mean| >> std (a
    plain two-pass mean was 6x the CPU's error at mean 100, std 0.01)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 5, 5, generator=g) * sd + mu
    running = (torch.zeros(16), torch.ones(16))
    ref = F.batch_norm(x.double(), running[0].double(), running[1].double(), training=True)
    cpu = F.batch_norm(x, *(r.clone() for r in running), training=True)
    rt = tuple(r.to("tpu") for r in running)
    got = F.batch_norm(x.to("tpu"), *rt, training=True).cpu()
    ulp = torch.finfo(torch.float32).eps * ref.abs().max().item()
    assert (got.double() - ref).abs().max().item() <= 2 * (cpu.double() - ref).abs().max().item() + 8 * ulp
    # the running statistics too (unbiased variance)
    torch.testing.assert_close(rt[0].cpu().double(), 0.1 * x.double().mean((0, 2, 3)), rtol=1e-6, atol=1e-7 * sd)
    torch.testing.assert_close(rt[1].cpu().double(), 0.9 + 0.1 * x.double().var((0, 2, 3)), rtol=1e-5, atol=1e-7)


def test_batch_norm_train_updates_running_stats():
    x = rnd(4, 3, 5, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    w, b = rnd(3, seed=1), rnd(3, seed=2)
    rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
    xt, wt, bt = (t.detach().to("tpu").requires_grad_() for t in (x, w, b))
    try:
        yt = F.batch_norm(xt, rm_t, rv_t, wt, bt, training=True, momentum=0.3)
    except RuntimeError as ex:
        if "outputs 3 and 4" in str(ex):
            pytest.xfail("the Python layer does not pass running_mean/running_var as outputs yet")
        raise
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
    assert_close(yt, y, rtol=1e-5, atol=1e-5)
    assert_close(rm_t, rm, rtol=1e-5, atol=1e-6)
    assert_close(rv_t, rv, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    yt.sum().backward()
    assert_close(xt.grad, x.grad, rtol=1e-4, atol=1e-5)


def test_batch_norm_functional_returns_running_stats():
    """The 5-output form: updated running stats come back as outputs 3 and 4."""
    x, w, b = rnd(4, 3, 5, grad=False), rnd(3, grad=False, seed=1), rnd(3, grad=False, seed=2)
    rm, rv = rnd(3, grad=False, seed=4), rnd(3, grad=False, seed=5).abs() + 0.5
    for training in (True, False):
        # (in eval mode PyTorch's CPU kernel returns empty save_mean/save_invstd, the meta function [C])
        pick = (lambda r: r) if training else (lambda r: (r[0], r[3], r[4]))
        check(lambda x, w, b, rm, rv: pick(aten._native_batch_norm_legit_functional(x, w, b, rm, rv, training, 0.2,
                                                                                     1e-5)),
              x, w, b, rm, rv, rtol=1e-5, atol=1e-5)
    check(lambda x, rm, rv: aten._native_batch_norm_legit_functional(x, None, None, rm, rv, True, 0.2, 1e-5),
          x, rm, rv, rtol=1e-5, atol=1e-5)


def test_batch_norm_backward_direct():
    x = rnd(4, 3, 5, grad=False)
    go = rnd(4, 3, 5, grad=False, seed=3)
    w = rnd(3, grad=False, seed=1)
    rm, rv = rnd(3, grad=False, seed=4), rnd(3, grad=False, seed=5).abs() + 0.5
    sm = x.mean((0, 2))
    si = torch.rsqrt(x.var((0, 2), unbiased=False) + 1e-5)
    for train in (True, False):
        for mask in itertools.product([False, True], repeat=3):
            res = check(lambda go, x, w, rm, rv, sm, si: aten.native_batch_norm_backward(
                go, x, w, rm, rv, sm, si, train, 1e-5, list(mask))[1:], go, x, w, rm, rv, sm, si,
                rtol=1e-4, atol=1e-5)
            if mask[0]:
                check(lambda go, x, w, rm, rv, sm, si: aten.native_batch_norm_backward(
                    go, x, w, rm, rv, sm, si, train, 1e-5, list(mask))[0], go, x, w, rm, rv, sm, si,
                    rtol=1e-4, atol=1e-5)
            assert len(res) == 2


def test_batch_norm_module_eval():
    torch.manual_seed(0)
    m = torch.nn.BatchNorm2d(3)
    m.running_mean.uniform_()
    m.running_var.uniform_(0.5, 2)
    m.eval()
    mt = torch.nn.BatchNorm2d(3)
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu").eval()
    x = rnd(2, 3, 4, 4)
    check(lambda x: m(x) if x.device.type == "cpu" else mt(x), x, grad=True)


# ---------------------------------------------------------------------------
# losses


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(dtype, reduction, weighted):
    x = rnd(6, 5, dtype=dtype)
    t = torch.tensor([0, 4, -100, 2, 2, 1])
    w = torch.rand(5, generator=torch.Generator().manual_seed(1)).to(dtype) if weighted else None
    check_any(lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction), x, t, w, grad=True, dtype=dtype)
    check_any(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction), x, t, w, grad=True, dtype=dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(6, 4, generator=g).clamp(0.02, 0.98).requires_grad_()
    t = torch.rand(6, 4, generator=g)
    w = torch.rand(4, generator=g)
    check(lambda x, t, w: F.binary_cross_entropy(x, t, weight=w, reduction=reduction), x, t, w, grad=True)
    # log(0) is clamped at -100, as on the CPU
    edge = torch.tensor([0.0, 1.0, 0.0, 1.0])
    check(lambda x, t: F.binary_cross_entropy(x, t, reduction=reduction), edge, torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert _uses_rule("aten::binary_cross_entropy") and _uses_rule("aten::binary_cross_entropy_backward")


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_max_unpool(dim):
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dim - 1]
    unpool = (F.max_unpool1d, F.max_unpool2d, F.max_unpool3d)[dim - 1]
    x = rnd(2, 3, *([6] * dim), grad=False)
    y, i = pool(x, 2, return_indices=True)
    y.requires_grad_()
    check(lambda y, i: unpool(y, i, 2), y, i, grad=True)
    check(lambda y, i: unpool(y, i, 2, output_size=[7] * dim), y, i, grad=True)
    check(lambda y, i: unpool(y, i, 2), y[0], i[0], grad=True)  # unbatched
    if dim > 1:
        assert _uses_rule(f"aten::max_unpool{dim}d")


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolate_antialias(mode, align_corners):
    """antialias=True (torchvision's Resize on tensors): the filter widens by
    the scale when downsampling; C lowerings of _upsample_*2d_aa and their
    backward, compared with the CPU kernels."""
    for (h, w), size, sf in [((16, 16), (8, 8), None), ((17, 23), (5, 9), None), ((8, 8), (19, 13), None),
                             ((10, 12), None, (0.3, 0.45)), ((9, 7), (9, 14), None)]:
        kw = dict(size=size, scale_factor=sf, mode=mode, align_corners=align_corners, antialias=True)
        for dtype in (torch.float32, torch.float64):
            check(lambda x: F.interpolate(x, **kw), rnd(2, 3, h, w, dtype=dtype), grad=True, rtol=1e-5, atol=1e-5)
    assert _uses_rule(f"aten::_upsample_{mode}2d_aa") and _uses_rule(f"aten::_upsample_{mode}2d_aa_backward")
    with pytest.raises(NotImplementedError, match="convert the input to a float dtype"):
        F.interpolate(torch.zeros(1, 1, 4, 4, dtype=torch.uint8, device="tpu"), size=(2, 2), mode=mode,
                      antialias=True).cpu()


def test_nll_loss_ignore_index_and_1d():
    x = rnd(5, 4)
    t = torch.tensor([3, 1, 1, 0, 2])
    check(lambda x, t: F.nll_loss(x, t, ignore_index=1), x, t, grad=True)
    check(lambda x, t: F.nll_loss(x, t, ignore_index=1, reduction="none"), x, t, grad=True)
    # 1-D input, 0-d target
    check(lambda x, t: F.nll_loss(x, t), rnd(7), torch.tensor(3), grad=True)
    check(lambda x, t: F.cross_entropy(x, t, reduction="sum"), rnd(7), torch.tensor(6), grad=True)


def test_nll_loss_all_ignored_and_empty():
    x = rnd(3, 4)
    t = torch.tensor([-100, -100, -100])
    out = check(lambda x, t: F.nll_loss(x, t), x, t, grad=True)
    assert torch.isnan(out.cpu())
    check(lambda x, t: F.nll_loss(x, t, reduction="sum"), x, t, grad=True)
    check(lambda x, t: F.nll_loss(x, t, reduction="sum"), rnd(0, 4), torch.zeros(0, dtype=torch.long), grad=True)


def test_nll_loss_forward_total_weight():
    x = rnd(6, 5, grad=False)
    t = torch.tensor([0, 4, -100, 2, 2, 1])
    w = torch.rand(5, generator=torch.Generator().manual_seed(1))
    for red in (0, 1, 2):
        check(lambda x, t, w: aten.nll_loss_forward(x, t, w, red, -100), x, t, w)


def test_nll_loss_nonfinite():
    x = rnd(4, 5, grad=False)
    x[0, 3] = float("nan")  # not a target: must not leak
    x[1, 2] = float("-inf")  # the target of an ignored row
    x[2, 1] = float("inf")
    t = torch.tensor([1, -100, 1, 4])
    check(lambda x, t: F.nll_loss(x, t, reduction="none"), x, t)
    check(lambda x, t: F.nll_loss(x, t), x, t)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss2d(dtype, reduction):
    x = rnd(2, 5, 3, 4, dtype=dtype)
    t = torch.randint(0, 5, (2, 3, 4), generator=torch.Generator().manual_seed(2))
    t[0, 1, 2] = -100
    w = torch.rand(5, generator=torch.Generator().manual_seed(1)).to(dtype)
    check_any(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t, grad=True, dtype=dtype)
    check_any(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction), x, t, w, grad=True, dtype=dtype)
    # 3-D input goes through nll_loss_nd's reshape to 2d/1d
    check_any(lambda x, t: F.nll_loss(x, t, reduction=reduction), rnd(2, 5, 3, dtype=dtype),
              torch.tensor([[0, 1, 4], [3, 3, -100]]), grad=True, dtype=dtype)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(dtype, reduction):
    a, b = rnd(4, 5, dtype=dtype), rnd(4, 5, dtype=dtype, seed=1)
    check_any(lambda a, b: F.mse_loss(a, b, reduction=reduction), a, b, grad=True, dtype=dtype)
    # non-contiguous, and a target that does not need grad
    a = rnd(5, 4, dtype=dtype).t()
    check_any(lambda a, b: F.mse_loss(a, b, reduction=reduction), a, b.detach(), grad=True, dtype=dtype)


def test_mse_loss_broadcast_nan_empty():
    a, b = rnd(3, 4), rnd(4, seed=1)
    with pytest.warns(UserWarning):
        check(lambda a, b: F.mse_loss(a, b), a, b, grad=True)
    a = rnd(3, 4, grad=False)
    a[1, 1] = float("nan")
    out = check(lambda a, b: F.mse_loss(a, b, reduction="sum"), a, rnd(3, 4, grad=False, seed=1))
    assert torch.isnan(out.cpu())
    check(lambda a, b: F.mse_loss(a, b, reduction="sum"), rnd(0, 3), rnd(0, 3, seed=1), grad=True)
    out = check(lambda a, b: F.mse_loss(a, b), rnd(0, 3), rnd(0, 3, seed=1))
    assert torch.isnan(out.cpu())


# ---------------------------------------------------------------------------
# convolution

CONV_CASES = [
    # (input shape, weight shape, kwargs)
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(padding=1)),
    ((2, 3, 9, 9), (4, 3, 3, 3), dict(stride=2, padding=1)),
    ((2, 3, 11, 10), (4, 3, 3, 2), dict(stride=(2, 1), padding=(2, 1), dilation=(2, 3))),
    ((2, 4, 9, 9), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    ((2, 4, 7, 7), (4, 1, 3, 3), dict(padding=1, groups=4)),  # depthwise
    ((2, 3, 10, 10), (5, 3, 4, 4), dict(stride=3)),  # floor drops input positions
    ((1, 3, 5, 5), (2, 3, 1, 1), dict()),
    ((2, 3, 17), (5, 3, 4), dict(stride=3, padding=2)),
    ((2, 4, 9), (4, 2, 3), dict(padding=2, dilation=2, groups=2)),
    ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), dict(padding=1)),
    ((1, 2, 6, 5, 7), (4, 1, 2, 3, 2), dict(stride=(2, 1, 3), groups=2)),
    # depthwise (conv_depthwise: a sum over the kernel's taps): strided, dilated, 7x7, 1-d and 3-d
    ((2, 6, 12, 11), (6, 1, 3, 3), dict(stride=2, padding=1, groups=6)),
    ((2, 5, 13, 13), (5, 1, 7, 7), dict(padding=3, groups=5)),
    ((2, 4, 10, 9), (4, 1, 3, 2), dict(stride=(1, 2), padding=(2, 0), dilation=(2, 1), groups=4)),
    ((2, 3, 21), (3, 1, 5), dict(stride=3, padding=2, dilation=2, groups=3)),
    ((1, 3, 5, 6, 7), (3, 1, 3, 3, 3), dict(padding=1, groups=3)),
    ((2, 4, 7, 7), (8, 1, 3, 3), dict(padding=1, groups=4)),  # a channel multiplier of 2: grouped
]


def _conv(x, w, b=None, **kw):
    return {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()](x, w, b, **kw)


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES)
def test_conv(xs, ws, kw):
    x, w, b = rnd(*xs), rnd(*ws, seed=1), rnd(ws[0], seed=2)
    check(lambda x, w, b: _conv(x, w, b, **kw), x, w, b, grad=True, rtol=1e-4, atol=1e-4)
    check(lambda x, w: _conv(x, w, **kw), x, w, grad=True, rtol=1e-4, atol=1e-4)


CONVT_CASES = [
    ((2, 3, 5, 5), (3, 4, 3, 3), dict(stride=2)),
    ((2, 3, 5, 5), (3, 4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ((2, 3, 5, 5), (3, 4, 3, 3), dict(stride=3, padding=3, output_padding=2)),  # padding > dilation*(k-1)
    ((2, 6, 5, 4), (6, 2, 3, 3), dict(stride=2, padding=1, groups=3, dilation=2, output_padding=1)),
    ((2, 4, 4, 4), (4, 2, 4, 4), dict(stride=2, padding=1)),  # the usual UNet/GAN upsampler
    ((2, 3, 7), (3, 4, 3), dict(stride=2, padding=1)),
    ((1, 2, 3, 3, 3), (2, 3, 2, 2, 2), dict(stride=2)),
    # output_padding >= stride (dilation > stride): grad_input must drop the extra rows
    ((2, 2, 4, 4), (2, 2, 4, 5), dict(stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=4)),
    ((2, 2, 4, 4, 4), (2, 2, 4, 5, 6), dict(stride=(3, 2, 1), padding=(1, 2, 3), output_padding=(2, 3, 1), groups=2,
                                            dilation=4)),
    ((2, 6, 5, 4), (6, 1, 3, 3), dict(stride=2, padding=1, groups=6, output_padding=1)),  # depthwise
    ((2, 4, 9), (4, 1, 4), dict(stride=3, padding=2, dilation=2, groups=4)),
]


@pytest.mark.parametrize("xs,ws,kw", CONVT_CASES)
def test_conv_transpose(xs, ws, kw):
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(xs)]
    g = kw.get("groups", 1)
    x, w, b = rnd(*xs), rnd(*ws, seed=1), rnd(ws[1] * g, seed=2)
    check(lambda x, w, b: fn(x, w, b, **kw), x, w, b, grad=True, rtol=1e-4, atol=1e-4)


def test_conv_bf16():
    x, w, b = rnd(2, 4, 8, 8, dtype=BF16), rnd(6, 2, 3, 3, dtype=BF16, seed=1), rnd(6, dtype=BF16, seed=2)
    check_lowp(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), x, w, b, grad=True,
               rtol=3e-2, atol=5e-2)
    x, w = rnd(2, 3, 5, 5, dtype=BF16), rnd(3, 4, 3, 3, dtype=BF16, seed=1)
    check_lowp(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), x, w, grad=True, rtol=3e-2, atol=5e-2)


def test_conv_noncontiguous_and_modules():
    x = rnd(2, 8, 8, 3).permute(0, 3, 1, 2)  # channels-last storage
    w = rnd(4, 3, 3, 3, seed=1).transpose(2, 3)
    check(lambda x, w: F.conv2d(x, w, padding=1), x, w, grad=True, rtol=1e-4, atol=1e-4)
    x = rnd(2, 3, 16, 16)[:, :, ::2, 1::2]  # strided slice
    check(lambda x, w: F.conv2d(x, w, stride=2), x, rnd(5, 3, 2, 2, seed=1), grad=True, rtol=1e-4, atol=1e-4)
    # padding='same' (resolved by PyTorch before aten::convolution)
    check(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), rnd(1, 2, 7, 6), rnd(3, 2, 3, 4, seed=1),
          grad=True, rtol=1e-4, atol=1e-4)


def test_conv_zero_batch_and_nan():
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1), rnd(0, 3, 5, 5), rnd(4, 3, 3, 3, seed=1),
          rnd(4, seed=2), grad=True)
    x = rnd(1, 2, 6, 6, grad=False)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, 5, 5] = float("inf")
    out = check(lambda x, w: F.conv2d(x, w), x, rnd(3, 2, 3, 3, seed=1, grad=False), rtol=1e-4, atol=1e-4)
    assert torch.isnan(out.cpu()[0, :, 0, 0]).all() and not torch.isnan(out.cpu()[0, :, 2:, :3]).any()


@pytest.mark.parametrize("mask", [m for m in itertools.product([False, True], repeat=3) if any(m)])
def test_convolution_backward_masks(mask):
    go, x, w = rnd(2, 4, 4, 4, grad=False), rnd(2, 6, 7, 7, grad=False, seed=1), rnd(4, 3, 3, 3, grad=False, seed=2)
    args = (go, x, w, [4], [2, 2], [1, 1], [1, 1], False, [0, 0], 2)
    res = aten.convolution_backward(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args], list(mask))
    exp = aten.convolution_backward(*args, [True, True, True])
    assert [r is None for r in res] == [not m for m in mask]
    for r, e, m in zip(res, exp, mask):
        if m:
            assert_close(r, e, rtol=1e-4, atol=1e-4)


def test_conv_module_training_step():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Conv2d(8, 4, 3, stride=2), torch.nn.AdaptiveAvgPool2d((2, 2)),
                            torch.nn.Flatten(), torch.nn.Linear(16, 5))
    mt = torch.nn.Sequential(*[torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(8, 4, 3, stride=2), torch.nn.AdaptiveAvgPool2d((2, 2)),
                               torch.nn.Flatten(), torch.nn.Linear(16, 5)])
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    x, t = rnd(3, 3, 16, 16, grad=False), torch.tensor([0, 3, 4])
    F.cross_entropy(m(x), t).backward()
    F.cross_entropy(mt(x.to("tpu")), t.to("tpu")).backward()
    for p, q in zip(m.parameters(), mt.parameters()):
        assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------------------
# pooling

MAXPOOL_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 10, 9), dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)),
    ((3, 7, 8), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1))),  # unbatched
    ((1, 2, 7, 7), dict(kernel_size=2, stride=2, ceil_mode=True)),
]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("xs,kw", MAXPOOL_CASES)
def test_max_pool2d(xs, kw, dtype):
    x = rnd(*xs, dtype=dtype)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), x, grad=True)


def test_max_pool_ties_nan_inf_ints():
    x = torch.zeros(1, 1, 4, 4, requires_grad=True)  # all ties: first index wins
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=True)
    x = torch.full((1, 1, 4, 4), float("-inf"))  # -inf everywhere, with padding
    check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True), x)
    x = rnd(1, 2, 6, 6, grad=False)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, 3, 4] = float("inf")
    check(lambda x: F.max_pool2d(x, 3, stride=1, return_indices=True), x)
    for dt in (torch.int64, torch.uint8, torch.int32):
        x = torch.randint(0, 100, (2, 3, 7, 7), generator=torch.Generator().manual_seed(3)).to(dt)
        check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True), x)


def test_max_pool3d_and_zero_batch():
    check(lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), padding=1, return_indices=True), rnd(1, 2, 4, 5, 4),
          grad=True)
    # (zero batch: PyTorch's own meta function for max_pool2d_with_indices fails on it)
    check(lambda x: F.avg_pool2d(x, 2), rnd(0, 3, 4, 4), grad=True)


AVGPOOL_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 10, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 10, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((3, 8, 8), dict(kernel_size=(2, 3), stride=(2, 1), divisor_override=5)),
    ((1, 2, 7, 7), dict(kernel_size=2, stride=2, ceil_mode=True)),
]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("xs,kw", AVGPOOL_CASES)
def test_avg_pool2d(xs, kw, dtype):
    check_any(lambda x: F.avg_pool2d(x, **kw), rnd(*xs, dtype=dtype), grad=True, dtype=dtype)


def test_avg_pool_int_nan_3d():
    x = torch.randint(-50, 50, (2, 3, 6, 6), generator=torch.Generator().manual_seed(3))
    check(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), x)  # integer division, like PyTorch
    x = rnd(1, 1, 4, 4, grad=False)
    x[0, 0, 0, 0] = float("nan")
    x[0, 0, 3, 3] = float("inf")
    out = check(lambda x: F.avg_pool2d(x, 2), x)
    assert torch.isnan(out.cpu()[0, 0, 0, 0]) and torch.isinf(out.cpu()[0, 0, 1, 1])
    check(lambda x: F.avg_pool3d(x, 2, stride=(1, 2, 2), padding=1, count_include_pad=False), rnd(1, 2, 4, 5, 4),
          grad=True)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("xs,out", [((2, 3, 8, 8), (3, 3)), ((2, 3, 8, 8), (4, 2)), ((2, 3, 3, 4), (5, 7)),
                                    ((3, 10, 7), (4, 7)), ((2, 3, 9, 9), (1, 2))])
def test_adaptive_avg_pool2d(xs, out, dtype):
    check_any(lambda x: F.adaptive_avg_pool2d(x, out), rnd(*xs, dtype=dtype), grad=True, dtype=dtype)


def test_adaptive_avg_pool_nonfinite_and_3d():
    x = rnd(1, 1, 7, 7, grad=False)
    x[0, 0, 0, 0] = float("inf")  # must not leak into other bins
    x[0, 0, 6, 6] = float("nan")
    out = check(lambda x: F.adaptive_avg_pool2d(x, (3, 3)), x)
    assert torch.isinf(out.cpu()[0, 0, 0, 0]) and torch.isfinite(out.cpu()[0, 0, 1:, :2]).all()
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), rnd(1, 2, 5, 5, 5), grad=True)


# ---------------------------------------------------------------------------
# upsampling

UPSAMPLE_CASES = [
    ((2, 3, 4, 4), dict(scale_factor=2)),
    ((2, 3, 4, 3), dict(size=(7, 5))),
    ((2, 3, 7, 5), dict(size=(3, 2))),
    ((2, 3, 4, 5), dict(scale_factor=1.7)),
    ((2, 3, 4, 5), dict(scale_factor=(0.6, 2.5))),
]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bilinear-ac"])
@pytest.mark.parametrize("xs,kw", UPSAMPLE_CASES)
def test_upsample2d(xs, kw, mode, dtype):
    kw = dict(kw)
    if mode == "bilinear-ac":
        mode, kw["align_corners"] = "bilinear", True
    check_any(lambda x: F.interpolate(x, mode=mode, **kw), rnd(*xs, dtype=dtype), grad=True, dtype=dtype)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("xs,kw", UPSAMPLE_CASES + [((2, 3, 270, 270), dict(size=(130, 130)))])
def test_bilinear_uint8_images(xs, kw, align_corners):
    # uint8 is the one integer dtype the CPU interpolates; its separable
    # kernel uses int16 fixed-point weights and rounds each pass, so a pixel
    # may differ from it by one (it had come out all zeros: weights in uint8).
    x = torch.randint(0, 256, xs, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    exp = F.interpolate(x, mode="bilinear", align_corners=align_corners, **kw)
    got = F.interpolate(x.to("tpu"), mode="bilinear", align_corners=align_corners, **kw).cpu()
    assert got.dtype == torch.uint8 and got.shape == exp.shape
    diff = (got.int() - exp.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.25, (diff.max(), (diff > 0).float().mean())


def test_upsample_1d_3d_nonfinite():
    check(lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), rnd(2, 3, 4), grad=True)
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear"), rnd(2, 3, 4), grad=True)
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="nearest"), rnd(1, 2, 2, 3, 2), grad=True)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="trilinear", align_corners=True), rnd(1, 2, 2, 3, 2),
          grad=True)
    x = rnd(1, 1, 3, 3, grad=False)
    x[0, 0, 0, 0] = float("inf")
    x[0, 0, 2, 2] = float("nan")
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), x)
    x = torch.randint(0, 255, (1, 2, 3, 3), dtype=torch.uint8)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x)


# F.interpolate(scale_factor=s) hands s to the kernels, and a dim whose size
# it keeps (floor(3 * 1.3) == 3) or doubles (floor(3 * 2.1) == 6) is where
# PyTorch's CPU kernels disagree with each other: linear ones copy a kept dim,
# bicubic and the generic nearest forward resample it with 1/s, nearest's
# backward (and 2-d forward with out_h + out_w <= 128) copy/halve it, the
# antialiased backward resamples it.  (shape, interpolate kwargs) per dims.
KEPT_SIZE_CASES = {
    1: [((2, 3, 3), dict(scale_factor=1.3)), ((2, 3, 3), dict(scale_factor=2.1)),
        ((2, 3, 5), dict(scale_factor=0.7)), ((2, 3, 4), dict(scale_factor=1.3, recompute_scale_factor=True))],
    2: [((1, 2, 3, 5), dict(scale_factor=1.3)), ((1, 2, 3, 3), dict(scale_factor=1.3)),  # both dims kept
        ((1, 2, 3, 4), dict(scale_factor=(2.1, 1.1))),
        ((1, 2, 4, 3), dict(scale_factor=(0.6, 1.3))),
        ((1, 2, 3, 70), dict(scale_factor=(1.3, 2.1))),  # out_h + out_w > 128: the generic nearest kernel
        ((1, 2, 3, 4), dict(size=(3, 7)))],
    3: [((1, 2, 3, 5, 2), dict(scale_factor=1.3)), ((1, 2, 2, 3, 4), dict(scale_factor=(2.1, 1.3, 0.6)))],
}
KEPT_SIZE_MODES = {1: ["nearest", "nearest-exact", "linear"],
                   2: ["nearest", "nearest-exact", "bilinear", "bicubic", "bilinear-aa", "bicubic-aa"],
                   3: ["nearest", "nearest-exact", "trilinear"]}


@pytest.mark.parametrize("dtype", [F32, torch.float64])
@pytest.mark.parametrize("dims,mode", [(d, m) for d, ms in KEPT_SIZE_MODES.items() for m in ms])
def test_interpolate_kept_size_with_scale_factor(dims, mode, dtype):
    """Dims that keep (or double) their size under a scale_factor: indices
    and weights as PyTorch's CPU kernels compute them, forward and backward,
    align_corners either way."""
    aa = mode.endswith("-aa")
    mode = mode.removesuffix("-aa")
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == F32 else dict(rtol=1e-10, atol=1e-10)
    for xs, kw in KEPT_SIZE_CASES[dims]:
        if aa and xs[-1] > 64:
            continue  # far from 0 the aa weights, computed in double here (float on the CPU), differ by 2e-5
        for ac in ([None] if mode.startswith("nearest") else [False, True]):
            kw = dict(kw, mode=mode, align_corners=ac, antialias=aa)
            check(lambda x: F.interpolate(x, **kw), rnd(*xs, dtype=dtype), grad=True, **tol)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear", "bicubic"])
def test_interpolate_kept_size_compiled(mode):
    """The same in torch.compile graphs, where tracing would otherwise run
    PyTorch's Python decompositions of the upsampling ops (indices of their
    own); forward and backward lower to one program each."""
    from util import all_graphs_lowered

    cases = {"linear": [1, 2, 3], "bicubic": [2]}.get(mode, [1, 2, 3])
    for dims in cases:
        for xs, kw in KEPT_SIZE_CASES[dims]:
            for ac in ([None] if mode.startswith("nearest") else [False, True]):
                m = mode if mode != "linear" else ("linear", "bilinear", "trilinear")[dims - 1]
                kw = dict(kw, mode=m, align_corners=ac)
                torch._dynamo.reset()
                x = rnd(*xs)
                xt = x.detach().to("tpu").requires_grad_()
                want = F.interpolate(x, **kw)
                with all_graphs_lowered():
                    got = torch.compile(lambda a: F.interpolate(a, **kw), backend="tpu")(xt)
                    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
                    want.backward(g)
                    got.backward(g.to("tpu"))
                assert_close(got, want, 1e-5, 1e-5, msg=f"{xs} {kw}")
                assert_close(xt.grad, x.grad, 1e-5, 1e-5, msg=f"grad {xs} {kw}")


def test_interpolate_kept_size_values():
    """The CPU's numbers for the kept dims, spelled out."""
    x = torch.arange(3.0).reshape(1, 1, 3)
    for mode, want in [("nearest", [0, 0, 1]), ("linear", [0, 1, 2]), ("nearest-exact", [0, 1, 1])]:
        got = F.interpolate(x.to("tpu"), scale_factor=1.3, mode=mode).cpu().flatten()
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=0, atol=0)
    x2 = torch.arange(15.0).reshape(1, 1, 3, 5)
    got = F.interpolate(x2.to("tpu"), scale_factor=1.3, mode="bilinear").cpu()
    torch.testing.assert_close(got[0, 0, :, 0], torch.tensor([0.0, 5.0, 10.0]), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------
# group norm


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("G,xs", [(2, (2, 4, 4, 4)), (1, (3, 6, 5)), (3, (2, 6, 5)), (2, (2, 4, 3, 2, 2))])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(G, xs, affine, dtype):
    C = xs[1]
    w, b = (rnd(C, dtype=dtype, seed=1), rnd(C, dtype=dtype, seed=2)) if affine else (None, None)
    check_any(lambda x, w, b: F.group_norm(x, G, w, b), rnd(*xs, dtype=dtype), w, b, grad=True, dtype=dtype,
              **({"rtol": 1e-4, "atol": 1e-5} if dtype == F32 else {}))


@pytest.mark.parametrize("mask", [m for m in itertools.product([False, True], repeat=3) if any(m)])
def test_group_norm_backward_masks(mask):
    x, go, w = rnd(2, 4, 6, grad=False), rnd(2, 4, 6, grad=False, seed=1), rnd(4, grad=False, seed=2)
    _, mean, rstd = aten.native_group_norm(x, w, None, 2, 4, 6, 2, 1e-5)
    args = (go, x, mean, rstd, w, 2, 4, 6, 2)
    res = aten.native_group_norm_backward(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args],
                                          list(mask))
    exp = aten.native_group_norm_backward(*args, [True, True, True])
    assert [r is None for r in res] == [not m for m in mask]
    for r, e, m in zip(res, exp, mask):
        if m:
            assert_close(r, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("xd,pd", [(F32, F32), (BF16, BF16), (BF16, F32), (torch.float16, None)])
def test_norm_saved_stats_like_cpu(xd, pd):
    # The saved statistics have CPU's dtypes (the input's; float32 when a
    # reduced-precision input has float32 parameters) and, for batch norm
    # outside training, CPU's empty shape [0].
    x = rnd(3, 2, 4, grad=False).to(xd)
    p = (lambda k, s: None) if pd is None else (lambda k, s: rnd(k, grad=False, seed=s).to(pd))
    rm, rv = rnd(2, grad=False, seed=3).to(pd or xd), (rnd(2, grad=False, seed=4).abs() + 0.5).to(pd or xd)
    cases = [
        lambda x, w, b, rm, rv: aten.native_layer_norm(x, [4], None if w is None else w.new_ones(4), None, 1e-5),
        lambda x, w, b, rm, rv: aten.native_group_norm(x, w, b, 3, 2, 4, 2, 1e-5),
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5),
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
    ]
    for training in (True, False):
        cases.append(lambda x, w, b, rm, rv, t=training: aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), t,
                                                                                 0.1, 1e-5))
        cases.append(lambda x, w, b, rm, rv, t=training: aten._native_batch_norm_legit(x, w, b, rm.clone(), rv.clone(),
                                                                                        t, 0.1, 1e-5))
    w, b = p(2, 1), p(2, 2)
    for fn in cases:
        exp = fn(x, w, b, rm, rv)
        got = fn(*[None if a is None else a.to("tpu") for a in (x, w, b, rm, rv)])
        for e, g in zip(exp, got):
            assert (g.dtype, g.shape) == (e.dtype, e.shape)
            tol = 1e-5 if e.dtype == F32 and xd == F32 else 2e-2
            torch.testing.assert_close(g.cpu().float(), e.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("fn,xs,out", [
    (F.adaptive_max_pool1d, (3, 4, 4), 3), (F.adaptive_max_pool1d, (2, 3, 7), 5),
    (F.adaptive_max_pool2d, (1, 4, 4, 4), (2, 3)), (F.adaptive_max_pool2d, (2, 3, 5, 7), (3, 4)),
    (F.adaptive_max_pool2d, (3, 5, 7), (4, None)), (F.adaptive_max_pool2d, (2, 3, 5, 7), (7, 9)),
    (F.adaptive_max_pool2d, (2, 3, 6, 8), (3, 4)), (F.adaptive_max_pool3d, (3, 3, 4, 4, 6), (2, 3, None)),
    (F.adaptive_max_pool3d, (2, 5, 7, 3), (3, 4, 2))])
def test_adaptive_max_pool(fn, xs, out, dtype):
    # Uneven, overlapping, larger-than-input and even bins; values, indices
    # and gradients.
    x = rnd(*xs, dtype=dtype)
    check_any(lambda x: fn(x, out, True), x, grad=True, dtype=dtype)
    # Ties (the first maximum in row-major order wins) and NaN (the last NaN
    # in the window wins, as in PyTorch's CPU kernel): indices compared exactly.
    g = torch.Generator().manual_seed(3)
    xt = torch.randint(0, 3, xs, generator=g).to(dtype)
    xn = xt.masked_fill(xt == 2, float("nan"))
    for v in (xt, xn):
        ev, ei = fn(v, out, True)
        av, ai = fn(v.to("tpu"), out, True)
        assert torch.equal(ai.cpu(), ei)
        torch.testing.assert_close(av.cpu(), ev, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [F32, BF16, torch.float16, torch.float64])
@pytest.mark.parametrize("fn,xs,k,out", [
    (F.fractional_max_pool2d, (2, 3, 9, 11), (2, 3), (5, 4)), (F.fractional_max_pool2d, (3, 10, 7), 3, (4, 5)),
    (F.fractional_max_pool2d, (1, 2, 5, 5), 2, (1, 4)),
    (F.fractional_max_pool3d, (2, 2, 7, 8, 9), (2, 3, 2), (3, 4, 5)), (F.fractional_max_pool3d, (2, 6, 6, 6), 2, 3)])
def test_fractional_max_pool(fn, xs, k, out, dtype):
    # Given random samples (one per plane and spatial dim, in the input's
    # dtype), the window starts follow the CPU's interval formula in that
    # dtype: values and indices exact for every dtype, ties and NaNs too.
    # Gradients of overlapping windows sum in float32 for float16/bfloat16
    # where the CPU adds in the low precision: compared with a tolerance.
    nsp = 2 if fn is F.fractional_max_pool2d else 3
    g = torch.Generator().manual_seed(5)
    # (unbatched inputs take the first row of any number of rows)
    samples = torch.rand(xs[0] if len(xs) == nsp + 2 else 2, xs[-nsp - 1], nsp, generator=g).to(dtype)
    xt = torch.randint(0, 3, xs, generator=g).to(dtype)
    for x in (rnd(*xs).to(dtype), xt, xt.masked_fill(xt == 2, float("nan"))):
        xc = x.detach().clone().requires_grad_()
        xd = x.detach().to("tpu").requires_grad_()
        ev, ei = fn(xc, k, output_size=out, _random_samples=samples, return_indices=True)
        av, ai = fn(xd, k, output_size=out, _random_samples=samples.to("tpu"), return_indices=True)
        assert torch.equal(ai.cpu(), ei)
        torch.testing.assert_close(av.cpu(), ev, equal_nan=True, rtol=0, atol=0)
        cot = torch.randn(ev.shape, generator=g).to(dtype)
        ev.backward(cot)
        av.backward(cot.to("tpu"))
        tol = 0 if dtype in (F32, torch.float64) else 2e-2
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=tol, atol=tol)


def test_fractional_max_pool_module_and_refusals():
    # Without samples the module draws them on the device; shapes as on CPU.
    x = torch.randn(2, 3, 10, 10)
    m = torch.nn.FractionalMaxPool2d(3, output_ratio=0.5)
    assert m.to("tpu")(x.to("tpu")).shape == m(x).shape
    for fn, nsp in ((F.fractional_max_pool2d, 2), (F.fractional_max_pool3d, 3)):
        with pytest.raises(RuntimeError, match="_random_samples to have the same dtype"):
            fn(torch.ones((1, 2) + (6,) * nsp, device="tpu"), 2, output_size=3,
               _random_samples=torch.rand(1, 2, nsp, dtype=torch.float64, device="tpu"))
    for dtype, name in ((torch.int64, "Long"), (torch.complex64, "ComplexFloat")):
        with pytest.raises(NotImplementedError, match=f"fractional_max_pool2d_out_frame.*'{name}'"):
            F.fractional_max_pool2d(torch.ones(1, 2, 6, 6, dtype=dtype, device="tpu"), 2, output_size=3,
                                    _random_samples=torch.rand(1, 2, 2).to(dtype).to("tpu"))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("dtype", [F32, BF16, torch.float16])
@pytest.mark.parametrize("xs,pad", [((1, 3), (1, 2)), ((2, 3, 4), (3, 0)), ((2, 3, 4, 5), (1, 2, 2, 1)),
                                    ((1, 2, 3, 4, 5), (1, 1, 2, 1, 0, 2)), ((5, 3, 4, 4), (-1, 2, 0, -2))])
def test_pad_modes(mode, dtype, xs, pad):
    # reflect/replicate decompose through out= overloads that compute f16/bf16
    # in f32 (their results must land in the out tensor); replicate's
    # backward is a rule; exact values, float32 gradients.
    if mode != "replicate" and min(pad) < 0:
        pytest.skip("negative padding is replicate/constant only")
    x = rnd(*xs, dtype=dtype, grad=dtype == F32)
    got = check(lambda x: F.pad(x, pad, mode), x, grad=dtype == F32, rtol=0 if dtype != F32 else None,
                atol=0 if dtype != F32 else None)
    assert got.dtype == dtype


def test_pad_out_overload_writes_out():
    x = rnd(2, 3, 4, dtype=BF16, grad=False)
    out = torch.empty(2, 3, 7, dtype=BF16, device="tpu")
    r = aten.reflection_pad1d.out(x.to("tpu"), [1, 2], out=out)
    assert r is out
    assert torch.equal(out.cpu(), F.pad(x, (1, 2), "reflect"))
    g = rnd(2, 3, 7, grad=False, seed=1)
    gi = torch.empty(2, 3, 4, device="tpu")
    aten.replication_pad1d_backward.grad_input(g.to("tpu"), x.float().to("tpu"), [1, 2], grad_input=gi)
    torch.testing.assert_close(gi.cpu(), aten.replication_pad1d_backward(g, x.float(), [1, 2]))


# ---------------------------------------------------------------------------
# low-precision batch norm: rounded like PyTorch's CPU kernels


@pytest.mark.parametrize("dtype", [torch.float16, BF16])
@pytest.mark.parametrize("op", ["legit", "with_update", "instance_norm"])
def test_batch_norm_lowp_train_matches_cpu(dtype, op):
    """Training-mode statistics are stored (rounded) in the input dtype by
    PyTorch's CPU kernel; the outputs must match it to the last bit (within
    one ulp for the rare f64-vs-FMA double rounding), and save_mean/save_invstd
    come back in the input's dtype."""
    for seed in range(4):
        x = (rnd(5, 5, 7, grad=False, seed=seed) * 3 + 1).to(dtype)
        w, b = rnd(5, grad=False, seed=seed + 10).to(dtype), rnd(5, grad=False, seed=seed + 20).to(dtype)
        rm, rv = rnd(5, grad=False, seed=seed + 30).to(dtype), (rnd(5, grad=False, seed=seed + 40).abs() + 0.5).to(dtype)
        if op == "legit":
            fn = lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.5, 0.6)
        elif op == "with_update":
            fn = lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.5, 0.6)[:3]
        else:
            fn = lambda x, w, b, rm, rv: F.instance_norm(x, rm, rv, w, b, momentum=0.5, eps=0.6)
        check(fn, x, w, b, rm, rv, rtol=0, atol=0 if dtype == BF16 else 1e-3)


def test_batch_norm_eval_stats_are_empty_like_cpu():
    x, w = rnd(2, 3, 4, grad=False, dtype=BF16), rnd(3, grad=False, dtype=BF16)
    check(lambda x, w, rm, rv: aten._native_batch_norm_legit(x, w, w, rm, rv, False, 0.1, 1e-5),
          x, w, w.clone(), w.abs() + 1)
    wf = w.float()
    check(lambda x, w, rm, rv: aten._native_batch_norm_legit(x, w, w, rm, rv, True, 0.1, 1e-5),
          x, wf, wf.clone(), wf.abs() + 1)


@pytest.mark.parametrize("dtype", [torch.float16, BF16])
@pytest.mark.parametrize("shape", [(7,), (40, 5), (300, 3), (2, 3, 9, 17)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nll_loss_lowp_reductions_match_cpu(dtype, shape, weighted, reduction):
    """PyTorch's CPU nll_loss sums f16/bf16 in the dtype with a cascade of
    partial sums; the lowering replays it, so results match exactly (the
    f32 sum rounded once differs on these sizes)."""
    g = torch.Generator().manual_seed(len(shape) * 7 + shape[0])
    C = shape[0] if len(shape) == 1 else shape[1]
    x = (torch.randn(*shape, generator=g) * 4).to(dtype)
    tshape = () if len(shape) == 1 else (shape[0],) + tuple(shape[2:])
    t = torch.randint(0, C, tshape, generator=g)
    if t.dim():
        t.view(-1)[::5] = -100
    w = (torch.rand(C, generator=g) + 0.3).to(dtype) if weighted else None
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction), x, t, w, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, BF16])
def test_mse_loss_lowp_rounds_like_cpu(dtype):
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randn(3000, generator=g) * 30).to(dtype), (torch.randn(3000, generator=g) * 30).to(dtype)
    expected = F.mse_loss(a, b, reduction="none")
    assert ((a.float() - b.float()).square().to(dtype) != expected).any(), "sample too easy"
    check(lambda a, b: F.mse_loss(a, b, reduction="none"), a, b, rtol=0, atol=0)
    check(lambda a, b: F.mse_loss(a, b, reduction="sum"), a, b)


def test_multilabel_margin_loss_stops_at_the_first_minus_one():
    # PyTorch's decomposition counts targets after a row's first -1; the CPU
    # kernel stops there, and so does the device kernel (_composite.py).
    inp = torch.randn(3, 4)
    tgt = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [-1, 1, 2, 3]])
    torch.testing.assert_close(F.multilabel_margin_loss(inp.to("tpu"), tgt.to("tpu")).cpu(),
                               F.multilabel_margin_loss(inp, tgt))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_linear_cross_entropy_chunked_accumulates_in_float32(dtype, reduction):
    """The chunked path picks its accumulation dtype by device type; on tpu it
    is float32, as on CPU and CUDA, not the input's dtype (which puts the
    bfloat16 per-sample losses below 15% off)."""
    from torch.nn import LinearCrossEntropyOptions

    resolved = LinearCrossEntropyOptions()._adjust(num_batches=16, in_features=8, num_classes=32, dtype=dtype,
                                                   device=torch.device("tpu"))
    assert resolved.acc_dtype == torch.float32 and resolved.acc_policy == "accurate"  # the CPU's policy
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 8, generator=g).to(dtype)
    w = (torch.randn(32, 8, generator=g) * 3).to(dtype)
    b = (torch.randn(32, generator=g) * 4).to(dtype)
    t = torch.randint(0, 32, (16,), generator=g)
    opts = LinearCrossEntropyOptions(batch_chunk_size=4)
    ref = F.linear_cross_entropy(x.double(), w.double(), t, linear_bias=b.double(), reduction=reduction)
    got = F.linear_cross_entropy(x.to("tpu"), w.to("tpu"), t.to("tpu"), linear_bias=b.to("tpu"),
                                 reduction=reduction, options=opts)
    cpu = F.linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, options=opts)
    torch.testing.assert_close(got.cpu().double(), ref, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(got.cpu(), cpu, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "LSTMCell", "GRUCell", "LSTM_proj"])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_forward_and_backward(kind, bias):
    # on a PrivateUse1 device PyTorch's RNNs call the fused cell ops CUDA
    # implements (_thnn_fused_lstm_cell, _thnn_fused_gru_cell) and their backward
    import copy

    import torch.nn as nn

    torch.manual_seed(0)
    if kind in ("LSTM", "GRU"):
        m = getattr(nn, kind)(6, 5, num_layers=2, batch_first=True, bias=bias, bidirectional=True)
        x = torch.randn(3, 7, 6)
    elif kind == "LSTM_proj":
        m, x = nn.LSTM(6, 5, proj_size=3, bias=bias), torch.randn(7, 3, 6)
    else:
        m, x = getattr(nn, kind)(6, 5, bias=bias), torch.randn(3, 6)
    mt = copy.deepcopy(m).to("tpu")
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    oc, ot = m(xc), mt(xt)
    oc, ot = (oc[0], ot[0]) if isinstance(oc, tuple) else (oc, ot)
    oc.pow(2).sum().backward()
    ot.pow(2).sum().backward()
    torch.testing.assert_close(ot.cpu(), oc, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    for a, b in zip(mt.parameters(), m.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


# ---- weight norm (_weight_norm_interface and its backward; lower_nn.c) ----


@pytest.mark.parametrize("dtype", [F32, torch.float64, BF16, torch.float16])
@pytest.mark.parametrize("vs,dim", [((6, 4, 3), 0), ((6, 4, 3), 2), ((5, 7), 1), ((9,), 0)])
def test_weight_norm_interface(vs, dim, dtype):
    # The CPU kernels accept the first and last dim; the norm is float32 for
    # float16/bfloat16 and w rounds v * (g / norm) once (so the low-precision
    # results match the CPU's to their own rounding).
    from util import lowered

    gs = [1] * len(vs)
    gs[dim] = vs[dim]
    v, g = rnd(*vs, dtype=dtype, grad=False), rnd(*gs, dtype=dtype, grad=False, seed=1) + 2
    gw = rnd(*vs, dtype=dtype, grad=False, seed=2)
    with lowered() as names:
        w, norm = check(aten._weight_norm_interface, v, g, dim)
        check(lambda *a: aten._weight_norm_interface_backward(*a, dim), gw, v, g, norm.cpu())
    assert {"aten::_weight_norm_interface", "aten::_weight_norm_interface_backward"} <= names
    assert norm.dtype == (F32 if dtype in (BF16, torch.float16) else dtype)


def test_weight_norm_interface_whole_tensor_and_empty():
    # dim -1 (or any dim outside the tensor): the norm over the whole tensor,
    # as norm_except_dim and the meta function take it (the CPU kernels
    # accept only the first and last dim and assert).
    v, g, gw = rnd(4, 3, 5, grad=False), rnd(1, 1, 1, grad=False, seed=1), rnd(4, 3, 5, grad=False, seed=2)
    for dim in (-1, 3):
        w, norm = aten._weight_norm_interface(v.to("tpu"), g.to("tpu"), dim)
        ref_norm = v.double().norm().reshape(1, 1, 1)
        torch.testing.assert_close(norm.cpu().double(), ref_norm, rtol=1e-6, atol=0)
        torch.testing.assert_close(w.cpu().double(), v.double() * g.double() / ref_norm, rtol=1e-5, atol=1e-6)
        gv, gg = aten._weight_norm_interface_backward(gw.to("tpu"), v.to("tpu"), g.to("tpu"), norm, dim)
        vd, gd = v.double().requires_grad_(), g.double().requires_grad_()
        (vd * (gd / vd.norm())).backward(gw.double())
        torch.testing.assert_close(gv.cpu().double(), vd.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gg.cpu().double(), gd.grad, rtol=1e-5, atol=1e-6)
    # an empty v: a zero norm, and grad_g 0 / 0 (NaN), as on the CPU
    e, ge = torch.empty(3, 0), rnd(3, 1, grad=False)
    check(aten._weight_norm_interface, e, ge, 0)
    w, norm = aten._weight_norm_interface(e, ge, 0)
    check(lambda *a: aten._weight_norm_interface_backward(*a, 0), torch.empty(3, 0), e, ge, norm)


@pytest.mark.parametrize("api", ["utils", "parametrizations"])
@pytest.mark.parametrize("dim", [0, 1, None, -1])
def test_weight_norm_module_forward_backward(api, dim):
    # nn.utils.weight_norm and the parametrization call torch._weight_norm:
    # the fused interface for the first/last dim, norm_except_dim's ops
    # otherwise (dim None/-1: the whole tensor).
    import copy

    import torch.nn as nn

    if api == "parametrizations" and dim is None:
        pytest.skip("the parametrization takes an int dim")
    torch.manual_seed(0)
    wrap = nn.utils.weight_norm if api == "utils" else nn.utils.parametrizations.weight_norm
    base = nn.Conv1d(3, 4, 3)
    base_t = copy.deepcopy(base)  # (a module with weight norm cannot be deep-copied)
    m, mt = wrap(base, dim=dim), wrap(base_t, dim=dim).to("tpu")
    x = torch.randn(2, 3, 8)
    oc, ot = m(x), mt(x.to("tpu"))
    torch.testing.assert_close(ot.cpu(), oc, rtol=1e-5, atol=1e-6)
    oc.sin().sum().backward()
    ot.sin().sum().backward()
    for (n, a), b in zip(mt.named_parameters(), m.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_weight_norm_compiled_lowers_whole():
    import copy

    import torch.nn as nn

    from util import all_graphs_lowered

    torch.manual_seed(0)
    m = nn.utils.parametrizations.weight_norm(nn.Linear(5, 6), dim=0)
    mt = copy.deepcopy(m).to("tpu")
    x = torch.randn(4, 5)
    f = torch.compile(lambda x: mt(x).tanh().sum(), backend="tpu")
    with all_graphs_lowered():
        ot = f(x.to("tpu"))
        ot.backward()
    oc = m(x).tanh().sum()
    oc.backward()
    torch.testing.assert_close(ot.cpu(), oc, rtol=1e-5, atol=1e-5)
    for (n, a), b in zip(mt.named_parameters(), m.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_weight_norm_compiled_1d_follows_the_meta_function():
    # A 1-d v: eager mode takes each element as a slice, as the CPU kernel
    # does; in a compiled graph the meta function (and torch.compile on the
    # CPU, through PyTorch's decomposition) norms it whole, w = v * g / |v|.
    # The graph computes that form and its exact derivative.
    from util import all_graphs_lowered

    v, g = rnd(5, grad=False), rnd(5, grad=False, seed=1)
    vt, gt = v.to("tpu").requires_grad_(), g.to("tpu").requires_grad_()
    torch.testing.assert_close(torch._weight_norm(vt, gt, 0).detach().cpu(), torch._weight_norm(v, g, 0))
    f = torch.compile(lambda v, g: torch._weight_norm(v, g, 0).sin().sum(), backend="tpu")
    with all_graphs_lowered():
        out = f(vt, gt)
        out.backward()
    vd, gd = v.double().requires_grad_(), g.double().requires_grad_()
    ref = (vd * gd / vd.norm()).sin().sum()
    ref.backward()
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vt.grad.cpu().double(), vd.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gt.grad.cpu().double(), gd.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims", [2, 3])
def test_conv_channels_last_keeps_the_layout(dims):
    """A channels-last input gives a channels-last result and input gradient,
    as on the CPU (mkldnn) and CUDA (cuDNN)."""
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    conv = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv3d
    torch.manual_seed(0)
    x = torch.randn(2, 3, *[6] * dims).to(memory_format=fmt)
    w = torch.randn(4, 3, *[3] * dims)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    y, yt = conv(xc, wc, padding=1), conv(xt, wt, padding=1)
    assert yt.stride() == y.stride() and yt.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(yt.cpu(), y, rtol=1e-4, atol=1e-5)
    y.square().sum().backward()
    yt.square().sum().backward()
    assert xt.grad.stride() == xc.grad.stride()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-4)
