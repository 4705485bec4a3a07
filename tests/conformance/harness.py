"""Run one OpInfo at one dtype on "tpu" and on the CPU, and compare.

This module runs inside a worker process (tests/conformance/worker.py): it
imports torch_pjrt, and an op that crashes or hangs takes the worker down
with it, which the parent (runner.py) records as a crash.

For each (OpInfo, dtype) node:

* samples come from ``op.sample_inputs("cpu", dtype)`` after seeding the
  global generator (so a node gets the same samples in any worker, in any
  order);
* every tensor of a sample (input, args, kwargs, recursively) is copied to
  "tpu", and a ``device="cpu"`` keyword (factory functions) becomes "tpu";
* the CPU result is computed twice with different seeds: a sample whose two
  CPU results differ is random (dropout inside an op, say) and is not
  compared; OpInfos whose output is random or uninitialized are not compared
  at all (status "skipped");
* the tpu result, moved to the CPU, must have the CPU result's structure,
  dtypes and shapes, and be close within the tolerance of ``tolerance()``
  with NaNs equal;
* for float32 OpInfos that support autograd, the gradients of every input
  that requires grad, for a fixed random cotangent, are compared the same way.

A result that differs from the CPU's still passes in two cases, counted apart
(see explain()): only the index among tied elements differs where PyTorch
leaves it unspecified (sort, topk, ...), or every element is at least as close
to a float64 CPU run as the CPU's own worst element is (within a factor of
two).

A sample ends as passed, mismatch, unsupported (our NotImplementedError),
error (any other exception on "tpu"), random or cpu_error (the CPU reference
itself raised: not our problem, not counted). The node's status is the worst
of its samples: mismatch > error > unsupported > pass.
"""
import copy
import math
import os
import re
import time
import traceback

import torch

UNSUPPORTED_TEXT = "not currently implemented for the tpu device"

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
# Measured only when asked for (--dtypes complex64,float64,...): not part of
# the report the issue defines, but where silent complex, double-precision
# and narrow-integer bugs show.
OPTIONAL_DTYPES = {"complex64": torch.complex64, "float64": torch.float64, "uint8": torch.uint8,
                   "int8": torch.int8, "int16": torch.int16}
ALL_DTYPES = {**DTYPES, **OPTIONAL_DTYPES}
DTYPE_NAMES = {v: k for k, v in ALL_DTYPES.items()}

# Node statuses counted in the totals, best first; "skipped" is reported apart.
STATUSES = ("pass", "unsupported", "mismatch", "error", "crash")

# OpInfos whose outputs are random: results cannot be compared with the CPU's.
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
    "normal", "normal.in_place", "normal.number_mean", "uniform",
    "rand_like", "randn_like", "randint_like", "randint", "randn", "randperm",
    "nn.functional.dropout", "nn.functional.dropout1d", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu", "nn.functional.multi_head_attention_forward",
    "pca_lowrank", "svd_lowrank",
}
# OpInfos whose outputs are uninitialized memory.
UNINITIALIZED_OPS = {
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
}

# assert_close's defaults (rtol, atol); integer and bool results must be equal.
DEFAULT_TOL = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}

MSG_LEN = 400


def op_key(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


_OP_DB = None


def op_db():
    """{key: OpInfo} over PyTorch's op_db, in op_db's order."""
    global _OP_DB
    if _OP_DB is None:
        from torch.testing._internal.common_methods_invocations import op_db as db

        _OP_DB = {op_key(op): op for op in db}
    return _OP_DB


def node_dtypes(op, wanted):
    """The dtypes of `wanted` that the OpInfo supports on CPU, in `wanted`'s order."""
    supported = op.supported_dtypes("cpu")
    return [d for d in wanted if ALL_DTYPES[d] in supported]


# --------------------------------------------------------------------------
# What PyTorch's own OpInfo says


def _decorate_infos(op):
    from torch.testing._internal.opinfo.core import DecorateInfo

    for d in list(op.decorators or ()) + list(op.skips or ()):
        if isinstance(d, DecorateInfo):
            yield d, d.decorators
        else:
            yield None, [d]


def _active(info, dtype):
    if info is None:
        return True
    if info.dtypes is not None and dtype not in info.dtypes:
        return False
    active = info.active_if
    return bool(active) if not callable(active) else True


def _overrides(op, dtype, grad):
    """(rtol, atol): the loosest toleranceOverride/precisionOverride the
    OpInfo declares for `dtype` in any of PyTorch's test suites that compare
    two implementations (CPU vs CUDA, eager vs Inductor or decompositions, vs
    NumPy...), MPS-only ones excepted; gradient-test overrides count only for
    gradients.  (0, 0) when it declares none."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    rtol = atol = 0.0
    for info, decs in _decorate_infos(op):
        if not _active(info, dtype):
            continue
        if info is not None and info.device_type not in (None, "cpu", "cuda", "xpu"):
            continue
        test = (info.test_name or "") if info is not None else ""
        is_grad_test = any(w in test for w in ("grad", "backward", "vjp", "jvp", "forward_ad"))
        if is_grad_test and not grad:
            continue
        for dec in decs:
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                t = dec.d[dtype]
                atol, rtol = max(atol, t.atol), max(rtol, t.rtol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype])
    return rtol, atol


# test_compare_cpu (PyTorch's CUDA-vs-CPU test) compares with atol=rtol=1e-3,
# raised by the OpInfo's overrides.
COMPARE_CPU_TOL = 1e-3


class Tol:
    """A tolerance policy: (rtol, atol) for each result dtype.

    strict (what a pass needs): assert_close's defaults for the result's
    dtype, raised to the OpInfo's own overrides for the node's dtype.
    loose (reported alongside, "within 1e-3"): PyTorch's test_compare_cpu,
    max(1e-3, overrides) for every result.  Integer and bool results must be
    equal under both (a difference is at least 1)."""

    def __init__(self, loose, o_rtol, o_atol):
        self.loose, self.o_rtol, self.o_atol = loose, o_rtol, o_atol

    def __call__(self, dtype):
        if self.loose:
            return max(COMPARE_CPU_TOL, self.o_rtol), max(COMPARE_CPU_TOL, self.o_atol)
        d_rtol, d_atol = DEFAULT_TOL.get(dtype, (0.0, 0.0))
        if dtype not in DEFAULT_TOL and (dtype.is_floating_point or dtype.is_complex):
            d_rtol, d_atol = (1.3e-6, 1e-5) if dtype != torch.float64 else (1e-7, 1e-7)
        return max(d_rtol, self.o_rtol), max(d_atol, self.o_atol)

    def describe(self):
        return "1e-3" if self.loose else f"default+({self.o_rtol}, {self.o_atol})"


def tolerance(op, dtype, grad=False):
    """(strict, loose) Tol policies for the node (see Tol)."""
    o_rtol, o_atol = _overrides(op, dtype, grad)
    return Tol(False, o_rtol, o_atol), Tol(True, o_rtol, o_atol)


def _skip_reason(dec):
    """The reason string of a unittest.skip(...) decorator, or None."""
    for cell in getattr(dec, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, str):
            return v
    return None


def compare_cpu_notes(op, dtype):
    """What PyTorch's test_compare_cpu (CUDA vs CPU) says about this op at
    `dtype`: skip reasons and expected failures.  Attached to our failures as
    a hint; they do not change the status."""
    import unittest

    notes = []
    for info, decs in _decorate_infos(op):
        if info is None or info.test_name != "test_compare_cpu" or not _active(info, dtype):
            continue
        for dec in decs:
            if dec is unittest.expectedFailure:
                notes.append("expected failure")
            else:
                r = _skip_reason(dec)
                if r:
                    notes.append(f"skipped: {r}")
    return sorted(set(notes))


def random_kind(op):
    """'random' / 'uninitialized' for OpInfos whose outputs can't be compared."""
    key = op_key(op)
    if key in UNINITIALIZED_OPS:
        return "uninitialized"
    if key in RANDOM_OPS:
        return "random"
    for info, decs in _decorate_infos(op):
        if info is None or info.test_name != "test_compare_cpu":
            continue
        for dec in decs:
            r = _skip_reason(dec) or ""
            if r.startswith("output is non-deterministic") and "when" not in r:
                return "random"
    return None


# --------------------------------------------------------------------------
# Moving samples


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, list):
        return [_map(fn, v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return x


def _leaves(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _leaves(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _leaves(v, out)
    return out


def _to_tpu_tensor(t):
    st = t.untyped_storage() if t.layout == torch.strided else None
    esize = t.element_size()
    if st is not None and (t.storage_offset() != 0 or st.nbytes() != t.numel() * esize) \
            and not t.is_conj() and not t.is_neg() and st.nbytes() % esize == 0:
        # A view that does not cover its storage (base[5:15], an expanded
        # tensor): copy the whole storage and take the same view of it, so
        # that ops that see the storage (as_strided with a storage_offset)
        # read what they read on CPU, and rules meet the same layouts.
        with torch.no_grad():
            base = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.nbytes() // esize,), (1,)).to("tpu")
        r = base.as_strided(t.shape, t.stride(), t.storage_offset())
        if t.requires_grad:
            r.requires_grad_(True)
        return r
    with torch.no_grad():
        r = t.detach().to("tpu")
    if t.requires_grad:
        r.requires_grad_(True)
    return r


def _is_cpu_device(v):
    return (isinstance(v, str) and v == "cpu") or (isinstance(v, torch.device) and v.type == "cpu")


# Positional arguments that PyTorch requires on the CPU whatever the device
# (the OpInfo makes them there on every device): OpInfo key -> arg indices.
CPU_ARGS = {
    "tensor_split": (0,),  # tensor_indices_or_sections: "expected ... to be on cpu" on CUDA too
}


def to_tpu(sample, factory=False, key=None):
    """((input, args, kwargs), on_tpu): the sample with every tensor copied to
    tpu (but the CPU_ARGS of OpInfo `key`) and a "cpu" device argument (the
    test device; keyword or positional) made "tpu"; a factory function called without a device gets device="tpu".
    on_tpu: whether results are expected on "tpu" (some tensor or the device
    argument went there)."""
    moved = []

    def move(t):
        moved.append(t)
        return _to_tpu_tensor(t)

    keep = CPU_ARGS.get(key, ())

    def arg(i, a):
        if i in keep:
            return a
        if _is_cpu_device(a):  # the test device passed positionally (Tensor.to(device, dtype))
            moved.append(a)
            return "tpu" if isinstance(a, str) else torch.device("tpu")
        return _map(move, a)

    inp = _map(move, sample.input)
    args = tuple(arg(i, a) for i, a in enumerate(sample.args))
    kwargs = {}
    for k, v in sample.kwargs.items():
        if k == "device" and _is_cpu_device(v):
            kwargs[k] = "tpu"
            moved.append(k)
        else:
            kwargs[k] = _map(move, v)
    if factory and "device" not in kwargs:
        kwargs["device"] = "tpu"
        moved.append("device")
    return (inp, args, kwargs), bool(moved)


def cpu_copy(sample):
    """A deep copy of (input, args, kwargs): storages, offsets and strides kept
    (ops may write into their inputs)."""
    parts = (sample.input, tuple(sample.args), dict(sample.kwargs))
    try:
        return copy.deepcopy(parts)
    except Exception:
        def clone(t):
            c = t.detach().clone()
            return c.requires_grad_(t.requires_grad)
        return _map(clone, parts)


def describe(sample):
    """A short text for a sample: types and shapes of its arguments."""
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"{DTYPE_NAMES.get(x.dtype, str(x.dtype).replace('torch.', ''))}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(v) for v in x[:6]) + (", ..." if len(x) > 6 else "")
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in x.items()) + "}"
        r = repr(x)
        return r if len(r) <= 40 else r[:37] + "..."
    parts = [d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    s = ", ".join(parts)
    return s if len(s) <= 200 else s[:197] + "..."


# --------------------------------------------------------------------------
# Comparing results


class Mismatch(Exception):
    pass


def _flatten(x, path, out):
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _flatten(v, f"{path}[{i}]", out)
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            _flatten(x[k], f"{path}[{k!r}]", out)
    else:
        out.append((path, x))
    return out


def _short_close_message(msg):
    """The useful lines of assert_close's message, joined."""
    keep = []
    for line in str(msg).splitlines():
        line = line.strip()
        if not line or line.startswith("The failure occurred") or line.startswith("Tensor-likes are not close"):
            continue
        keep.append(line)
    return "; ".join(keep)


def compare(actual, expected, tol, what="output", on_tpu=True):
    """Raise Mismatch if the tpu result `actual` differs from `expected`
    under the Tol policy `tol`; `on_tpu`: tensors must be on "tpu"."""
    a_flat = _flatten(actual, what, [])
    e_flat = _flatten(expected, what, [])
    if len(a_flat) != len(e_flat):
        raise Mismatch(f"{what}: {len(a_flat)} values on tpu vs {len(e_flat)} on CPU")
    for (path, a), (_, e) in zip(a_flat, e_flat):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{path}: got {type(a).__name__}, expected a tensor")
            if on_tpu and a.device.type != "tpu":
                raise Mismatch(f"{path}: result on device {a.device}, expected tpu")
            if a.dtype != e.dtype:
                raise Mismatch(f"{path}: dtype {a.dtype} vs CPU {e.dtype}")
            if a.shape != e.shape:
                raise Mismatch(f"{path}: shape {list(a.shape)} vs CPU {list(e.shape)}")
            if e.layout != torch.strided:
                e = e.to_dense()
            if a.layout != torch.strided:
                a = a.to_dense()
            ac = a.detach().cpu()
            rtol, atol = tol(e.dtype)
            try:
                torch.testing.assert_close(ac, e.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                           check_device=False, check_stride=False, check_layout=False)
            except AssertionError as err:
                raise Mismatch(f"{path}: {_short_close_message(err)}") from None
        elif isinstance(e, float) and isinstance(a, (float, int)):
            rtol, atol = tol(torch.float32)
            if not (math.isclose(a, e, rel_tol=max(rtol, 1e-7), abs_tol=atol)
                    or (math.isnan(a) and math.isnan(e)) or a == e):
                raise Mismatch(f"{path}: {a!r} vs CPU {e!r}")
        elif isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor) or a != e:
            raise Mismatch(f"{path}: {a!r} vs CPU {e!r}")


def _same(x, y):
    """Exact equality of two CPU results (NaNs equal): for the randomness probe."""
    xf, yf = _flatten(x, "", []), _flatten(y, "", [])
    if len(xf) != len(yf):
        return False
    for (_, a), (_, b) in zip(xf, yf):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if a.layout != torch.strided or b.layout != torch.strided:
                a, b = a.to_dense(), b.to_dense()
            if not torch.equal(torch.nan_to_num(a.detach(), 0.0) if a.is_floating_point() else a.detach(),
                               torch.nan_to_num(b.detach(), 0.0) if b.is_floating_point() else b.detach()):
                return False
        elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            continue
        else:
            try:
                if a != b:
                    return False
            except Exception:
                return False
    return True


def _first_line(e):
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return line


def classify_exception(e):
    """('unsupported' | 'error', message) for an exception raised on tpu."""
    text = str(e)
    if isinstance(e, NotImplementedError) and UNSUPPORTED_TEXT in text:
        # "The operator 'aten::foo' is not currently implemented for the tpu device (...)"
        start = text.find("'")
        end = text.find("'", start + 1)
        name = text[start + 1:end] if 0 <= start < end else _first_line(e)
        return "unsupported", f"{name}"
    if isinstance(e, NotImplementedError) and text.startswith("Could not run '"):
        # PyTorch's dispatcher: no kernel for a tpu dispatch key our fallback
        # does not cover (sparse, quantized layouts): unsupported as well.
        m = re.match(r"Could not run '([^']+)' with arguments from the '([^']+)' backend", text)
        if m:
            return "unsupported", f"{m.group(1)} (no kernel for the {m.group(2)} backend)"
    if isinstance(e, NotImplementedError) and _raised_in_torch_pjrt(e):
        # Our other refusals ("dtype complex32 is not supported on the tpu
        # device", a lowering that rejects an argument it cannot handle):
        # a clear NotImplementedError raised while torch_pjrt handled the op.
        return "unsupported", f"{_first_line(e)}"
    return "error", f"{type(e).__name__}: {_first_line(e)}"


def _raised_in_torch_pjrt(e):
    import os

    pkg = os.sep + "torch_pjrt" + os.sep
    tb = e.__traceback__
    while tb is not None:
        if pkg in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _clip(s, n=MSG_LEN):
    return s if len(s) <= n else s[: n - 3] + "..."


# --------------------------------------------------------------------------
# When the tpu result differs from the CPU's: two cases where it is still right
#
# 1. Ties.  sort (unless stable=True), argsort, topk, kthvalue, mode, median
#    and nanmedian do not specify which of several equal elements' index they
#    return, and the CPU's choice depends on its sorting algorithm.  Their
#    index outputs pass when the values match and the indices select those
#    values from the input (and, for sort, argsort and topk, each index
#    appears once per row).
# 2. Rounding.  Where CPU and tpu round at different points (a reduced-
#    precision kernel computing in float, a float32 reduction in another
#    order), the op is run once more on the CPU with its floating inputs in
#    float64.  The tpu result passes if every element is at least as close to
#    that float64 result as the CPU's worst element is (within a factor of
#    two, elementwise or normwise, see _closer_than_cpu): it is as accurate
#    as PyTorch's own kernel.  Such samples are
#    counted ("closer_to_f64") and reported apart.

# OpInfo key -> (names of the positional arguments after the input, defaults).
TIE_OPS = {
    "sort": (("dim", "descending"), {"dim": -1, "descending": False, "stable": False}),
    "argsort": (("dim", "descending"), {"dim": -1, "descending": False, "stable": False}),
    "topk": (("k", "dim", "largest", "sorted"), {"dim": -1}),
    "kthvalue": (("k", "dim", "keepdim"), {"dim": -1, "keepdim": False}),
    "mode": (("dim", "keepdim"), {"dim": -1, "keepdim": False}),
    "median": (("dim", "keepdim"), {"dim": None, "keepdim": False}),
    "nanmedian": (("dim", "keepdim"), {"dim": None, "keepdim": False}),
}


def _nan_equal(x, y):
    return torch.equal(x, y) if not x.is_floating_point() else bool(
        ((x == y) | (x.isnan() & y.isnan())).all())


def ties_explain(key, sample, actual, expected, tol):
    """None if the difference is only which tied element's index was
    returned; else a reason."""
    names, defaults = TIE_OPS[key]
    a = dict(defaults, **dict(zip(names, sample.args)), **sample.kwargs)
    if a.get("stable") or a.get("dim") is None:
        return "indices differ"
    x = sample.input
    a_flat, e_flat = _flatten(actual, "output", []), _flatten(expected, "output", [])
    if len(a_flat) != len(e_flat) or not all(isinstance(t, torch.Tensor) for _, t in a_flat + e_flat):
        return "structure differs"
    if not e_flat or e_flat[-1][1].dtype != torch.int64:  # the indices come last
        return "no index output"
    for (path, a_t), (_, e_t) in zip(a_flat[:-1], e_flat[:-1]):  # the values must match
        compare(a_t, e_t, tol, what=path)
    a_i, e_i = a_flat[-1][1].cpu(), e_flat[-1][1]
    if a_i.shape != e_i.shape or a_i.dtype != e_i.dtype:
        return "index shape or dtype differs"
    if x.dim() == 0:
        return None if torch.equal(a_i, e_i) else "indices differ"
    dim = a["dim"] % x.dim()
    if key in ("kthvalue", "mode", "median", "nanmedian") and not a["keepdim"]:
        a_i, e_i = a_i.unsqueeze(dim), e_i.unsqueeze(dim)
    if a_i.numel() and (a_i.min() < 0 or a_i.max() >= x.shape[dim]):
        return "an index is out of range"
    xd = x.detach()
    if not _nan_equal(xd.gather(dim, a_i), xd.gather(dim, e_i)):
        return "indices select other values than the CPU's"
    if key in ("sort", "argsort", "topk"):
        s_i = a_i.sort(dim).values
        if s_i.shape[dim] > 1 and bool((s_i.diff(dim=dim) == 0).any()):
            return "an index repeats within a row"
    return None


F64_FROM = (torch.float16, torch.bfloat16, torch.float32)


def _as_f64(parts, requires_grad=False):
    """parts (input, args, kwargs) with floating tensors (and dtype keyword
    arguments) of F64_FROM made float64, complex64 ones complex128; leaves
    keep requires_grad."""
    def up(t):
        if t.dtype not in F64_FROM and t.dtype != torch.complex64:
            return t.detach().clone()
        r = t.detach().to(torch.complex128 if t.dtype == torch.complex64 else torch.float64)
        return r.requires_grad_(True) if requires_grad and t.requires_grad else r
    inp, args, kwargs = _map(up, parts)
    kwargs = {k: (torch.float64 if k == "dtype" and v in F64_FROM else
                  torch.complex128 if k == "dtype" and v == torch.complex64 else v) for k, v in kwargs.items()}
    return inp, args, kwargs


def _closer_than_cpu(a, e, r, tol):
    """Whether the tpu tensor `a` is as accurate as the CPU tensor `e`, both
    measured against the float64 reference `r`.  Elements where a equals e or
    r rounded to the dtype (NaNs and infinities included) are not counted;
    on the others a must be
    * elementwise: off by no more than twice e's worst (finite) element, in
      units of the node's tolerance at each element (atol + rtol * |r|),
      plus one unit; or
    * normwise (float32 and wider): off by no more than twice e's worst
      absolute error, plus atol: the measure for sums, whose rounding errors
      scale with their terms, not with the result.
    Summing in another order gives errors of the same size but elsewhere; a
    wrong formula is off by orders of magnitude."""
    if not isinstance(r, torch.Tensor) or r.shape != e.shape:
        return False
    if not (e.is_floating_point() or e.is_complex()):
        return torch.equal(a.cpu(), e)
    wide = torch.complex128 if e.is_complex() else torch.float64
    a64, e64, r64 = a.detach().cpu().to(wide), e.detach().to(wide), r.detach().to(wide)
    rtol, atol = tol(e.dtype)
    exact = r.detach().to(e.dtype).to(wide)  # r correctly rounded (inf where it overflows the dtype)
    same = (a64 == e64) | (a64.isnan() & e64.isnan()) | (a64 == exact) | (a64.isnan() & exact.isnan())
    if bool(same.all()):
        return True
    d_a, mag = (a64 - r64).abs()[~same], r64.abs()[~same]
    d_e, mag_e = (e64 - r64).abs(), r64.abs()  # the CPU's errors anywhere in the tensor
    if not bool(d_a.isfinite().all()):
        return False

    def worst(x):
        x = x[x.isfinite()]
        return float(x.max()) if x.numel() else 0.0

    if float((d_a / (atol + rtol * mag)).max()) <= 2.0 * worst(d_e / (atol + rtol * mag_e)) + 1.0:
        return True
    if e.dtype in (torch.float16, torch.bfloat16):  # their rounding errors could hide a wrong small element
        return False
    return float(d_a.max()) <= 2.0 * worst(d_e) + atol


def _pairs(actual, expected):
    a_flat, e_flat = _flatten(actual, "output", []), _flatten(expected, "output", [])
    if len(a_flat) != len(e_flat):
        return None
    return [(p, a, e) for (p, a), (_, e) in zip(a_flat, e_flat)]


def f64_explain(pairs, refs, tol):
    """None if every (tpu, CPU) pair is at least as close to its float64
    reference as the CPU's; else a reason."""
    if refs is None or len(pairs) != len(refs):
        return "no float64 reference with the same structure"
    for (path, a, e), r in zip(pairs, refs):
        if not isinstance(e, torch.Tensor):
            compare(a, e, tol, what=path, on_tpu=False)  # raises Mismatch
        elif not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
            return f"{path}: differs in type, shape or dtype"
        elif not _closer_than_cpu(a, e, r, tol):
            return f"{path}: farther from the float64 result than the CPU's"
    return None


def forward_f64_ref(op, sample):
    """The op's outputs (flattened) on the CPU with float64 inputs, or None."""
    try:
        out = sample.output_process_fn_grad(_call(op, _as_f64(cpu_copy(sample)), SEED))
    except Exception:
        return None
    return [t for _, t in _flatten(out, "output", [])]


def grad_f64_ref(op, sample, cots):
    """The gradients of grad_pairs' inputs on the CPU in float64, or None."""
    try:
        parts = _as_f64(cpu_copy(sample), requires_grad=True)
        outs = _diff_outputs(sample.output_process_fn_grad(_call(op, parts, SEED)))
        ins = _grad_inputs(parts)
        grads = torch.autograd.grad(outs, ins, [c.to(o.dtype) for c, o in zip(cots, outs)], allow_unused=True)
    except Exception:
        return None
    return [torch.zeros_like(i) if g is None else g for g, i in zip(grads, ins)]


def explain(op, sample, actual, expected, tol):
    """'ties' or 'closer_to_f64' when a forward result that differs from the
    CPU's is still right (see above); else None."""
    key = op_key(op)
    try:
        if key in TIE_OPS and ties_explain(key, sample, actual, expected, tol) is None:
            return "ties"
        pairs = _pairs(actual, expected)
        if pairs is not None and f64_explain(pairs, forward_f64_ref(op, sample), tol) is None:
            return "closer_to_f64"
    except Mismatch:
        pass
    return None


# --------------------------------------------------------------------------
# One node


def _cpu_failed(tally, e):
    """The CPU reference raised.  Usually PyTorch's own limit (not counted),
    but some OpInfo wrappers touch the accelerator too (freeze_rng_state asks
    torch.tpu for its RNG state): then it is ours, an error."""
    text = f"{type(e).__name__}: {_first_line(e)}"
    if "torch_pjrt" in str(e) or "tpu" in str(e):
        tally.add("error", _clip(f"{text} (raised by the OpInfo's wrapper, on CPU inputs too)"))
    else:
        tally.add("cpu_error", _clip(text))


SEED = 0
PROBE_SEED = 12345


# CONFORMANCE_COMPILED=1 (`--compiled`): the tpu side runs each sample
# through torch.compile(backend="tpu") instead of eagerly, where PyTorch's
# decompositions and meta shapes, not eager mode's, reach the lowering rules.
COMPILED = os.environ.get("CONFORMANCE_COMPILED") == "1"


def _call(op, parts, seed, compiled=False):
    torch.manual_seed(seed)
    inp, args, kwargs = parts
    if compiled:
        import torch._dynamo as dynamo

        dynamo.reset()
        return torch.compile(lambda i, a, k: op(i, *a, **k), backend="tpu")(inp, args, kwargs)
    if seed != PROBE_SEED:
        return op(inp, *args, **kwargs)
    # The randomness probe: OpInfo wrappers that reseed (wrapper_set_seed:
    # manual_seed(42) around dropout inside scaled_dot_product_attention)
    # must draw other numbers too, or a random sample looks deterministic.
    orig = torch.manual_seed
    torch.manual_seed = lambda s: orig(int(s) + PROBE_SEED)
    try:
        return op(inp, *args, **kwargs)
    finally:
        torch.manual_seed = orig


class _Tally:
    ORDER = ("mismatch", "error", "unsupported")

    def __init__(self):
        self.counts = {"samples": 0, "passed": 0, "mismatch": 0, "mismatch_close": 0, "error": 0,
                       "unsupported": 0, "random": 0, "cpu_error": 0, "nondiff": 0,
                       "ties": 0, "closer_to_f64": 0}
        self.first = {}

    def add(self, outcome, message=None):
        self.counts[outcome] += 1
        if outcome == "mismatch_close":  # a mismatch within test_compare_cpu's tolerance
            self.counts["mismatch"] += 1
            if message is not None:
                self.first.setdefault("mismatch", message)
        if message is not None and outcome not in self.first:
            self.first[outcome] = message

    def explained(self, kind, message):
        """A sample that differs from the CPU but passes: kind is 'ties' or
        'closer_to_f64' (see explain())."""
        self.counts[kind] += 1
        self.counts["passed"] += 1
        self.first.setdefault(kind, message)

    def _status(self, c):
        for st in self.ORDER:
            if c[st]:
                return st
        if c["passed"]:
            return "pass"
        return None

    def result(self):
        c = self.counts
        st = self._status(c)
        if st is not None:
            out = {"status": st, "message": self.first.get(st, ""), "samples": dict(c)}
            if st != "pass":
                out["messages"] = {k: v for k, v in self.first.items() if k != "cpu_error"}
            explained = {k: self.first[k] for k in ("ties", "closer_to_f64") if k in self.first}
            if explained:
                out["explained"] = explained
            # The status under test_compare_cpu's tolerance (1e-3).
            lc = dict(c, passed=c["passed"] + c["mismatch_close"], mismatch=c["mismatch"] - c["mismatch_close"])
            out["status_1e-3"] = self._status(lc)
            if st == "mismatch" and out["status_1e-3"] == "mismatch" and "mismatch_far" in self.first:
                out["message"] = self.first["mismatch_far"]
            return out
        if c["random"]:
            return {"status": "skipped", "skip_reason": "random",
                    "message": "every sample's CPU output differs between two seeds", "samples": c}
        if c["nondiff"] and not c["cpu_error"]:
            return {"status": "skipped", "skip_reason": "not-differentiable",
                    "message": "no sample has an output and an input that require grad", "samples": c}
        if c["cpu_error"]:
            return {"status": "skipped", "skip_reason": "cpu-error",
                    "message": "the CPU reference raised on every sample: " + self.first.get("cpu_error", ""),
                    "samples": c}
        return {"status": "skipped", "skip_reason": "no-samples", "message": "no samples", "samples": c}

    def mismatch(self, strict_err, check_loose, where):
        """Record a mismatch; check_loose() raises if the results differ under
        test_compare_cpu's tolerance too."""
        try:
            check_loose()
            close = True
        except Exception:
            close = False
        if close:
            self.add("mismatch_close", _clip(f"{strict_err} (within 1e-3) [{where}]"))
        else:
            msg = _clip(f"{strict_err} [{where}]")
            self.add("mismatch", msg)
            self.first.setdefault("mismatch_far", msg)


def _sample_list(op, dtype, requires_grad):
    torch.manual_seed(SEED)
    return list(op.sample_inputs("cpu", dtype, requires_grad=requires_grad))


def run_forward(op, dtype, max_samples=None):
    strict, loose = tolerance(op, dtype)
    tally = _Tally()
    samples = _sample_list(op, dtype, False)
    if max_samples:
        samples = samples[:max_samples]
    for i, s in enumerate(samples):
        tally.counts["samples"] += 1
        where = f"sample {i} ({describe(s)})"
        probe = cpu_copy(s)
        try:
            tpu_parts, on_tpu = to_tpu(s, op.is_factory_function, op_key(op))
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"{where}: moving to tpu: {msg}"))
            continue
        ref_parts = cpu_copy(s)
        try:
            expected = _call(op, ref_parts, SEED)
        except Exception as e:
            _cpu_failed(tally, e)
            continue
        try:
            again = _call(op, probe, PROBE_SEED)
            if not _same(expected, again):
                tally.add("random")
                continue
        except Exception:
            pass
        try:
            actual = _call(op, tpu_parts, SEED, COMPILED)
            actual = s.output_process_fn_grad(actual)
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"{msg} [{where}]"))
            continue
        expected = s.output_process_fn_grad(expected)
        try:
            compare(actual, expected, strict, on_tpu=on_tpu)
        except Mismatch as m:
            kind = explain(op, s, actual, expected, strict)
            if kind:
                tally.explained(kind, _clip(f"{m} [{where}]"))
            else:
                tally.mismatch(m, lambda: compare(actual, expected, loose, on_tpu=on_tpu), where)
            continue
        except Exception as e:  # comparing itself failed (reading the result back, say)
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"comparing: {msg} [{where}]"))
            continue
        tally.add("passed")
    out = tally.result()
    out["tol_override"] = [strict.o_rtol, strict.o_atol]
    return out


def _diff_outputs(out):
    return [t for _, t in _flatten(out, "", []) if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _grad_inputs(parts):
    return [t for t in _leaves(list(parts), []) if t.requires_grad and t.is_leaf]


def run_grad(op, max_samples=None):
    """Compare gradients at float32 for a fixed random cotangent."""
    dtype = torch.float32
    strict, loose = tolerance(op, dtype, grad=True)
    tally = _Tally()
    samples = _sample_list(op, dtype, True)
    if max_samples:
        samples = samples[:max_samples]
    for i, s in enumerate(samples):
        tally.counts["samples"] += 1
        where = f"sample {i} ({describe(s)})"
        try:
            tpu_parts, on_tpu = to_tpu(s, op.is_factory_function, op_key(op))
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"{where}: moving to tpu: {msg}"))
            continue
        ref_parts = cpu_copy(s)
        try:
            expected = s.output_process_fn_grad(_call(op, ref_parts, SEED))
            e_outs = _diff_outputs(expected)
            e_ins = _grad_inputs(ref_parts)
            if not e_outs or not e_ins:
                tally.add("nondiff")  # nothing to differentiate: not compared
                continue
            gen = torch.Generator().manual_seed(1000 + i)
            cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in e_outs]
            e_grads = torch.autograd.grad(e_outs, e_ins, cots, allow_unused=True)
        except Exception as e:
            _cpu_failed(tally, e)
            continue
        try:
            with torch.no_grad():
                again = _call(op, cpu_copy(s), PROBE_SEED)
            if not _same(expected, s.output_process_fn_grad(again)):
                tally.add("random")
                continue
        except Exception:
            pass
        try:
            actual = s.output_process_fn_grad(_call(op, tpu_parts, SEED, COMPILED))
            a_outs = _diff_outputs(actual)
            a_ins = _grad_inputs(tpu_parts)
            if len(a_outs) != len(e_outs) or len(a_ins) != len(e_ins):
                tally.add("mismatch", _clip(
                    f"grad: {len(a_outs)} differentiable outputs / {len(a_ins)} inputs on tpu vs "
                    f"{len(e_outs)} / {len(e_ins)} on CPU [{where}]"))
                continue
            a_grads = torch.autograd.grad(a_outs, a_ins, [c.to("tpu") for c in cots], allow_unused=True)
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"{msg} [{where}]"))
            continue
        pairs = []  # (what, tpu grad, CPU grad); None where both are None
        for k, (ag, eg, ei) in enumerate(zip(a_grads, e_grads, e_ins)):
            if ag is None and eg is None:
                pairs.append(None)
                continue
            pairs.append((f"grad of input {k}",
                          torch.zeros(ei.shape, dtype=ei.dtype, device="tpu") if ag is None else ag,
                          torch.zeros_like(ei) if eg is None else eg))

        def check(tol, pairs=pairs):
            for p in pairs:
                if p is not None:
                    compare(p[1], p[2], tol, what=p[0])

        try:
            check(strict)
        except Mismatch as m:
            refs = grad_f64_ref(op, s, cots)
            try:
                ok = refs is not None and len(refs) == len(pairs) and f64_explain(
                    [p for p in pairs if p], [r for p, r in zip(pairs, refs) if p], strict) is None
            except Mismatch:
                ok = False
            if ok:
                tally.explained("closer_to_f64", _clip(f"{m} [{where}]"))
            else:
                tally.mismatch(m, lambda: check(loose), where)
            continue
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"comparing: {msg} [{where}]"))
            continue
        tally.add("passed")
    out = tally.result()
    out["tol_override"] = [strict.o_rtol, strict.o_atol]
    return out


def run_skipped(op, dtype, kind, max_samples=None):
    """Random/uninitialized outputs: run on tpu and check only structure,
    dtypes and shapes; reported as skipped whatever happens."""
    tally = _Tally()
    samples = _sample_list(op, dtype, False)
    if max_samples:
        samples = samples[:max_samples]
    for i, s in enumerate(samples):
        tally.counts["samples"] += 1
        where = f"sample {i} ({describe(s)})"
        try:
            expected = _call(op, cpu_copy(s), SEED)
        except Exception as e:
            _cpu_failed(tally, e)
            continue
        try:
            actual = _call(op, to_tpu(s, op.is_factory_function, op_key(op))[0], SEED)
        except Exception as e:
            st, msg = classify_exception(e)
            tally.add(st, _clip(f"{msg} [{where}]"))
            continue
        a_flat, e_flat = _flatten(actual, "output", []), _flatten(expected, "output", [])
        bad = None
        if len(a_flat) != len(e_flat):
            bad = f"{len(a_flat)} values vs {len(e_flat)}"
        else:
            for (path, a), (_, e) in zip(a_flat, e_flat):
                if isinstance(e, torch.Tensor) and (not isinstance(a, torch.Tensor) or a.shape != e.shape
                                                    or a.dtype != e.dtype or a.device.type != "tpu"):
                    bad = f"{path}: {getattr(a, 'dtype', type(a))}{list(getattr(a, 'shape', []))} on " \
                          f"{getattr(a, 'device', '?')} vs CPU {e.dtype}{list(e.shape)}"
                    break
        if bad:
            tally.add("mismatch", _clip(f"{bad} [{where}]"))
        else:
            tally.add("passed")
    r = tally.result()
    ran = r["status"]
    c = r["samples"]
    return {"status": "skipped", "skip_reason": kind,
            "message": f"{kind} output, not compared; on tpu: {ran}"
                       + (f" ({r['message']})" if r.get("message") else "")
                       + f", {c['passed']}/{c['samples']} samples ran with the CPU's shapes and dtypes",
            "tpu_status": ran, "samples": c}


def run_node(op, dtype_name, grad=True, max_samples=None):
    """The result record of one (OpInfo, dtype) node: never raises."""
    dtype = ALL_DTYPES[dtype_name]
    t0 = time.time()
    try:
        kind = random_kind(op)
        if kind:
            rec = run_skipped(op, dtype, kind, max_samples)
        else:
            rec = run_forward(op, dtype, max_samples)
            notes = compare_cpu_notes(op, dtype)
            if notes and rec["status"] not in ("pass", "skipped"):
                rec["pytorch_notes"] = notes
            if grad and dtype is torch.float32 and op.supports_autograd:
                g = run_grad(op, max_samples)
                g["seconds"] = round(time.time() - t0, 2)
                rec["grad"] = g
    except Exception as e:  # building samples or classifying failed: the harness's or PyTorch's problem
        rec = {"status": "error", "message": _clip(f"harness: {type(e).__name__}: {_first_line(e)}"),
               "traceback": traceback.format_exc()[-2000:]}
    rec["seconds"] = round(time.time() - t0, 2)
    return rec
