"""PyTorch's module database (`torch.testing._internal.common_modules.module_db`,
the ModuleInfo entries PyTorch's own test_modules.py runs: every nn layer,
loss, RNN and Transformer module, with the constructor and forward inputs
PyTorch chose for them) on "tpu" against the CPU.

For each module and each of its samples, in train mode (and in eval mode
where its ModuleInfo says the two differ), the module is built on the CPU
(seeded), copied to "tpu", and both run the sample.  Outputs, the gradients
of every input and parameter for a fixed random cotangent, and the buffers
after the call (BatchNorm's running statistics) must match the CPU's.  Lazy
modules are materialised on the CPU first, so both start from the same
weights.  A module whose CPU outputs change with the seed has only its output
shapes and dtypes checked.  A sample the CPU refuses must raise the same
exception type on "tpu".  `test_module_compiled` runs the tpu side of the
first sample of each module through torch.compile(backend="tpu"): every
graph must be one program.
"""
import copy

import pytest
import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch._dynamo.utils import counters
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt

F32 = torch.float32
TOL = dict(rtol=1e-4, atol=1e-4)
COMPILED_SAMPLES = 1
MAX_SAMPLES = 40
MODULES = {m.name: m for m in module_db}


def _to(x, dev):
    if not isinstance(x, torch.Tensor):
        return x
    y = x.detach().to(dev)
    return y.requires_grad_(x.requires_grad and (x.is_floating_point() or x.is_complex()))


def _call(mod, fin, dev, seed, compiled=False):
    args, kwargs = tree_map(lambda x: _to(x, dev), (fin.args, fin.kwargs))
    torch.manual_seed(seed)
    fn = torch.compile(mod, backend="tpu") if compiled else mod
    return (args, kwargs), fn(*args, **kwargs)


def _tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _differs(a, b):
    return any(not torch.equal(x, y) and not (x.is_floating_point() and torch.allclose(x, y, equal_nan=True))
               for x, y in zip(_tensors(a), _tensors(b)))


def _close(actual, expected, what):
    assert actual.device.type == "tpu", f"{what} is on {actual.device}"
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **TOL,
                               msg=lambda m: f"{what}: {m}")


def _check_sample(mi, sample, training, compiled):
    ctor, fin = sample.constructor_input, sample.forward_input
    torch.manual_seed(0)
    try:
        mod = mi.module_cls(*ctor.args, **ctor.kwargs).train(training)
        if isinstance(mod, LazyModuleMixin):
            with torch.no_grad():
                _call(mod, fin, "cpu", 1)
        mod2 = copy.deepcopy(mod)
        ins_c, out_c = _call(mod, fin, "cpu", 1)
    except Exception as e:  # the CPU refuses this sample: so must tpu
        with pytest.raises(type(e)):
            mod = mi.module_cls(*ctor.args, **ctor.kwargs).train(training).to("tpu")
            _call(mod, fin, "tpu", 1, compiled)
        return
    mod_t = copy.deepcopy(mod2).to("tpu")
    _, out_c2 = _call(mod2, fin, "cpu", 2)
    ins_t, out_t = _call(mod_t, fin, "tpu", 1, compiled)
    flat_c, flat_t = _tensors(out_c), _tensors(out_t)
    assert len(flat_c) == len(flat_t), "output structure"
    if _differs(out_c, out_c2):  # random outputs
        for c, t in zip(flat_c, flat_t):
            assert (t.shape, t.dtype, t.device.type) == (c.shape, c.dtype, "tpu")
        return
    for i, (c, t) in enumerate(zip(flat_c, flat_t)):
        _close(t, c, f"output {i}")
    diff = [(c, t) for c, t in zip(flat_c, flat_t) if c.requires_grad]
    if diff:
        g = torch.Generator().manual_seed(5)
        cots = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c, _ in diff]
        torch.autograd.backward([c for c, _ in diff], cots)
        torch.autograd.backward([t for _, t in diff], [x.to("tpu") for x in cots])
        for i, (c, t) in enumerate(zip(_tensors(ins_c), _tensors(ins_t))):
            if c.grad is not None:
                assert t.grad is not None, f"no gradient reached input {i}"
                _close(t.grad, c.grad, f"grad of input {i}")
        for (name, c), (_, t) in zip(mod.named_parameters(), mod_t.named_parameters()):
            if c.grad is not None:
                assert t.grad is not None, f"no gradient reached {name}"
                _close(t.grad, c.grad, f"grad of {name}")
    for (name, c), (_, t) in zip(mod.named_buffers(), mod_t.named_buffers()):
        _close(t, c, f"buffer {name}")


def _samples(mi, training):
    """The module's samples; of a long list (LinearCrossEntropyLoss has 857,
    one per combination of its options) an evenly spaced MAX_SAMPLES, which
    keep the file at about 2 minutes of the suite on 2 cores."""
    s = [s for s in mi.module_inputs_func(mi, device="cpu", dtype=F32, requires_grad=True, training=training)
         if s.forward_input is not None]
    return s if len(s) <= MAX_SAMPLES else s[::-(-len(s) // MAX_SAMPLES)]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module(name, training):
    mi = MODULES[name]
    if not training and not mi.train_and_eval_differ:
        pytest.skip("the module's ModuleInfo says train and eval mode do not differ")
    for i, sample in enumerate(_samples(mi, training)):
        try:
            _check_sample(mi, sample, training, compiled=False)
        except AssertionError as e:
            raise AssertionError(f"sample {i} ({sample.desc or 'default'}): {e}") from None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_compiled(name):
    mi = MODULES[name]
    torch._dynamo.reset()
    before = torch_pjrt.metrics()
    graphs = counters["stats"]["unique_graphs"]
    for i, sample in enumerate(_samples(mi, True)[:COMPILED_SAMPLES]):
        try:
            _check_sample(mi, sample, True, compiled=True)
        except AssertionError as e:
            raise AssertionError(f"sample {i} ({sample.desc or 'default'}): {e}") from None
    after = torch_pjrt.metrics()
    for kind in ("graphs_eager", "graphs_split"):
        assert after[kind] == before[kind], f"a compiled graph ran (partly) op by op: {kind}"
    # (Dynamo itself leaves some modules to eager mode: RNNs, and code before
    # a data-dependent branch such as GaussianNLLLoss's check of var)
    if counters["stats"]["unique_graphs"] > graphs:
        assert after["graphs_lowered"] > before["graphs_lowered"], "Dynamo made graphs that were not lowered"
