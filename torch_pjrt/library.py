"""Custom operators with a device body: a `torch.library` op whose "tpu"
implementation is a StableHLO function (MLIR text) or, with `jax` installed, a
JAX function.  Documented in docs/custom_ops.md.

    @torch.library.custom_op("mylib::scale_add", mutates_args=())
    def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return x + alpha * y                              # the CPU's implementation

    @scale_add.register_fake
    def _(x, y, alpha):
        return torch.empty_like(x)

    @torch_pjrt.library.register_stablehlo("mylib::scale_add")
    def _(x, y, alpha):                                    # meta tensors and the op's other arguments
        t = torch_pjrt.library.mlir_type(x)
        return f'''
        func.func @main(%x: {t}, %y: {t}) -> {t} {{
          %a = stablehlo.constant dense<{alpha}> : {t}
          %0 = stablehlo.multiply %a, %y : {t}
          %1 = stablehlo.add %x, %0 : {t}
          return %1 : {t}
        }}'''

The body function is called with each call's tensors as meta tensors (shape
and dtype) and its other arguments as given; it returns the text of a
`func.func` (or a module of functions, whose `@main` is the entry) taking the
op's tensor arguments in order and returning its results, typed as the op's
fake function gives them.  Eagerly the op runs as one program; in a compiled
graph the function is inlined into the graph's program (the graph is not cut).
Autograd comes from `torch.library.register_autograd`, its backward made of
ops (custom ones too) that compile the same way.  The program caches key on
the body's text.
"""
import functools
import hashlib
import re
import threading

import torch
from torch.utils import _pytree as pytree

__all__ = ["register_stablehlo", "register_jax", "mlir_type"]

_MLIR = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
         torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "ui8",
         torch.bool: "i1", torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
         torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2"}

_lock = threading.Lock()
_ops = {}  # OpOverload -> _Body


def mlir_type(t):
    """The MLIR tensor type of a tensor (or of a (shape, dtype) pair):
    "tensor<4x8xf32>", "tensor<f32>" for a 0-dim one."""
    shape, dtype = (t.shape, t.dtype) if isinstance(t, torch.Tensor) else t
    if dtype not in _MLIR:
        raise TypeError(f"torch_pjrt.library: no MLIR element type for {dtype}")
    return "tensor<" + "".join(f"{d}x" for d in shape) + _MLIR[dtype] + ">"


def _overload(op):
    """The OpOverload a user names: "ns::name[.overload]", an OpOverload, an
    OpOverloadPacket (its default) or a torch.library.custom_op."""
    if isinstance(op, str):
        ns, _, rest = op.partition("::")
        name, _, ovl = rest.partition(".")
        try:
            return getattr(getattr(getattr(torch.ops, ns), name), ovl or "default")
        except AttributeError:
            raise ValueError(f"torch_pjrt.library: there is no operator {op!r}; define it first "
                             f"(torch.library.custom_op or torch.library.define)") from None
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    if isinstance(op, torch._ops.OpOverload):
        return op
    inner = getattr(op, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(inner, torch._ops.OpOverload):
        return inner
    raise TypeError(f"torch_pjrt.library: expected an operator or its name, got {type(op).__name__}")


def _header(text, entry):
    """(argument types, result types) of function @entry in text."""
    at = text.find("@" + entry + "(")
    i = at + len(entry) + 1
    depth, j = 0, i
    for j in range(i, len(text)):
        depth += text[j] == "("
        depth -= text[j] == ")"
        if depth == 0:
            break
    args = re.findall(r"%[\w.$-]+\s*:\s*(tensor<[^>]*>)", text[i:j + 1])
    rest = text[j + 1:]
    m = re.match(r"\s*->\s*", rest)
    if not m:
        return args, []
    rest = rest[m.end():]
    if rest.startswith("("):
        depth = 0
        for k, c in enumerate(rest):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                return args, re.findall(r"tensor<[^>]*>", rest[:k + 1])
    return args, re.findall(r"tensor<[^>]*>", rest.split("{")[0])[:1]


def _normalize(text, name):
    """The functions of a body as private functions whose symbols are unique
    to this text, and the entry's symbol."""
    if not isinstance(text, str):
        raise TypeError(f"{name}: the StableHLO body must return a str of MLIR text, got {type(text).__name__}")
    m = re.match(r"\s*module\b(?:\s*@[\w$.-]+)?(?:\s*attributes\s*\{[^{}]*\})?\s*\{(.*)\}\s*$", text, re.S)
    inner = m.group(1) if m else text
    names = re.findall(r"func\.func\s+(?:public\s+|private\s+)?@([\w$.-]+)\s*\(", inner)
    if not names:
        raise ValueError(f"{name}: the StableHLO body holds no func.func")
    entry = "main" if "main" in names else names[0]
    prefix = "tp_" + hashlib.sha1(inner.encode()).hexdigest()[:16] + "_"
    for nm in sorted(set(names), key=len, reverse=True):
        inner = re.sub(r"@" + re.escape(nm) + r"(?![\w$.-])", "@" + prefix + nm, inner)
    inner = re.sub(r"func\.func\s+(?:public\s+|private\s+)?@", "func.func private @", inner)
    return inner.strip(), prefix + entry


class _Body:
    def __init__(self, op, make, kind):
        self.op, self.make, self.kind = op, make, kind
        self.name = f"torch_pjrt.library ({kind} body of {op._schema.name})"
        self.cache = {}  # signature -> (text, entry)

    def text(self, metas, kwmetas, out_types):
        """(text, entry) of the body for these meta arguments."""
        key = repr([(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in pytree.tree_leaves((metas, kwmetas))])
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        raw = self.make(*metas, **kwmetas)
        text, entry = _normalize(raw, self.name)
        args, results = _header(text, entry)
        want_in = [mlir_type(a) for a in pytree.tree_leaves((metas, kwmetas)) if isinstance(a, torch.Tensor)]
        if args != want_in:
            raise ValueError(f"{self.name}: its entry function takes ({', '.join(args)}), but the op's tensor "
                             f"arguments are ({', '.join(want_in)}); the body must take them in order")
        if results != out_types:
            raise ValueError(f"{self.name}: its entry function returns ({', '.join(results)}), but the op's fake "
                             f"function gives ({', '.join(out_types)}); make the two agree")
        with _lock:
            self.cache[key] = (text, entry)
        return text, entry


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def body_for(op, args, kwargs, outs, metas=None):
    """(text, entry, tensor arguments) of a registered op's call, or None when
    it has no device body.  outs: its result tensors (meta or fake);
    metas: (args, kwargs) as meta tensors, when the caller has them."""
    b = _ops.get(op)
    if b is None:
        return None
    metas, kwmetas = pytree.tree_map(_meta, (tuple(args), dict(kwargs))) if metas is None else metas
    flat = outs if isinstance(outs, (tuple, list)) else [outs]
    text, entry = b.text(metas, kwmetas, [mlir_type(o) for o in flat])
    tensors = [a for a in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(a, torch.Tensor)]
    return text, entry, tensors


def _kernel(op, *args, **kwargs):
    from . import _C
    from ._dispatch import _ref

    metas, kwmetas = pytree.tree_map(_meta, (args, kwargs))
    out_meta = op(*metas, **kwmetas)
    flat = list(out_meta) if isinstance(out_meta, (tuple, list)) else [out_meta]
    text, entry, tensors = body_for(op, args, kwargs, flat, (metas, kwmetas))
    device = tensors[0].device if tensors else torch.device("tpu", torch.tpu.current_device())
    outs = [torch.empty(o.shape, dtype=o.dtype, device=device) for o in flat]
    try:
        _C.run("tp::custom", (text, entry, *[_ref(t) for t in tensors]), None, tuple(_ref(o) for o in outs))
    except RuntimeError as e:
        raise RuntimeError(f"{_ops[op].name}: {e}") from None
    if isinstance(out_meta, (tuple, list)):
        return type(out_meta)(outs)
    return outs[0]


def _register(op, make, kind):
    ov = _overload(op)
    if ov._schema.is_mutable:
        raise NotImplementedError(f"torch_pjrt.library: {ov._schema.name} mutates its arguments; a device body "
                                  f"must return new tensors (define the op without mutates_args)")
    if not callable(make):
        raise TypeError(f"torch_pjrt.library.register_{kind}: expected a function, got {type(make).__name__}")
    first = ov not in _ops
    with _lock:
        _ops[ov] = _Body(ov, make, kind)
    if first:
        torch.library.register_kernel(ov, "tpu", functools.partial(_kernel, ov))
    return make


def register_stablehlo(op, fn=None):
    """Give `op` a "tpu" implementation written in StableHLO: fn(*args,
    **kwargs) -> MLIR text, called with the call's tensors as meta tensors.
    Usable as a decorator."""
    if fn is None:
        return lambda f: _register(op, f, "stablehlo")
    return _register(op, fn, "stablehlo")


def register_jax(op, fn=None):
    """Give `op` a "tpu" implementation written as a JAX function of the op's
    arguments (jax arrays for its tensors, the other arguments as Python
    values, static): lowered with jax.jit(...).lower(...) to StableHLO for
    each call's shapes.  Needs `jax`."""
    if fn is None:
        return lambda f: register_jax(op, f)
    try:
        import jax
    except ImportError:
        raise ImportError("torch_pjrt.library.register_jax needs jax (pip install jax)") from None

    def make(*args, **kwargs):
        import numpy as np

        flat, spec = pytree.tree_flatten((args, kwargs))
        at = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        structs = [jax.ShapeDtypeStruct(tuple(flat[i].shape), _jax_dtype(flat[i].dtype, np)) for i in at]

        def call(*arrays):
            vals = list(flat)
            for i, a in zip(at, arrays):
                vals[i] = a
            a, k = pytree.tree_unflatten(vals, spec)
            return fn(*a, **k)

        return jax.jit(call).lower(*structs).as_text()

    return _register(op, make, "jax")


def _jax_dtype(dtype, np):
    import ml_dtypes

    table = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
             torch.bfloat16: ml_dtypes.bfloat16, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
             torch.int64: np.int64, torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
             torch.complex128: np.complex128}
    if dtype not in table:
        raise TypeError(f"torch_pjrt.library.register_jax: no JAX dtype for {dtype}")
    return table[dtype]
