"""Compare ops on "tpu" against PyTorch on CPU."""
import contextlib

import torch
from torch.utils._pytree import tree_flatten, tree_map

# Tolerances per dtype: (rtol, atol).  float32 math on XLA:CPU may differ from
# PyTorch's kernels in the last bits (different but correct algorithms, e.g.
# for exp or reductions); bfloat16 results are compared after one rounding.
TOL = {
    torch.float32: (1.3e-6 * 10, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        t.requires_grad_(x.requires_grad)
        return t
    return x


def assert_close(actual, expected, rtol=None, atol=None, msg=""):
    a_flat, _ = tree_flatten(actual)
    e_flat, _ = tree_flatten(expected)
    assert len(a_flat) == len(e_flat), f"{msg}: {len(a_flat)} outputs vs {len(e_flat)}"
    for a, e in zip(a_flat, e_flat):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{msg}: got {type(a)}"
            assert a.device.type == "tpu", f"{msg}: result on {a.device}"
            assert a.dtype == e.dtype, f"{msg}: dtype {a.dtype} vs {e.dtype}"
            assert a.shape == e.shape, f"{msg}: shape {a.shape} vs {e.shape}"
            r, t = TOL.get(e.dtype, (0, 0))
            torch.testing.assert_close(a.cpu(), e, rtol=rtol if rtol is not None else r,
                                       atol=atol if atol is not None else t, equal_nan=True, msg=msg or None)
        else:
            assert a == e, f"{msg}: {a} vs {e}"


def check(fn, *args, grad=False, rtol=None, atol=None, **kwargs):
    """Run fn on CPU args and on their tpu copies; compare outputs (and grads)."""
    cpu_args = tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad)
                        if isinstance(x, torch.Tensor) else x, args)
    tpu_args = tree_map(to_tpu, args)
    expected = fn(*cpu_args, **kwargs)
    actual = fn(*tpu_args, **kwargs)
    assert_close(actual, expected, rtol, atol, msg=getattr(fn, "__name__", "fn"))
    if grad:
        e_out = [x for x in tree_flatten(expected)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
        a_out = [x for x in tree_flatten(actual)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
        gen = torch.Generator().manual_seed(0)
        seeds = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in e_out]
        torch.autograd.backward(e_out, seeds)
        torch.autograd.backward(a_out, [s.to("tpu") for s in seeds])
        for c, t in zip(tree_flatten(cpu_args)[0], tree_flatten(tpu_args)[0]):
            if isinstance(c, torch.Tensor) and c.requires_grad:
                assert t.grad is not None, "no gradient reached the tpu input"
                assert_close(t.grad, c.grad, rtol, atol, msg="grad")
    return actual


@contextlib.contextmanager
def lowered():
    """Collect the names of the lowering rules the C core runs inside the
    block, through either entry: _C.run (the Python handler) or _C.fast_call
    (the C fast path), with the C++ fast kernels off."""
    from torch_pjrt import _C, _dispatch

    names = set()
    run, fast_call = _C.run, _C.fast_call

    def spy_run(name, *a, **k):
        names.add(name)
        return run(name, *a, **k)

    def spy_fast(plan, args):
        r = fast_call(plan, args)
        if r is not NotImplemented:
            names.add(plan[0])
        return r

    _C.run, _C.fast_call = spy_run, spy_fast
    fast = _dispatch.fast_kernels(False)  # the C++ kernels enter the core without Python
    try:
        yield names
    finally:
        _C.run, _C.fast_call = run, fast_call
        _dispatch.fast_kernels(fast)


@contextlib.contextmanager
def all_graphs_lowered():
    """Every graph torch.compile(backend="tpu") makes inside the block is
    lowered to one program: none runs op by op (the eager fallback of
    _compile.py, whose warning comes only once per cause), and some graph was
    compiled."""
    import torch_pjrt

    before = torch_pjrt.metrics()
    yield
    after = torch_pjrt.metrics()
    assert after["graphs_eager"] == before["graphs_eager"], "a compiled graph fell back to eager execution"
    assert after["graphs_lowered"] > before["graphs_lowered"], "nothing was compiled"


def one_program_per_call(fn, *args):
    """Call a compiled inference function twice under no_grad; the warm call
    must run exactly one program.  Returns its result."""
    import torch_pjrt

    with torch.no_grad():
        fn(*args)
        before = torch_pjrt.metrics()["executions"]
        out = fn(*args)
    assert torch_pjrt.metrics()["executions"] == before + 1, "the compiled call ran more than one program"
    return out
