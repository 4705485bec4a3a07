"""The boxed PrivateUse1 fallback: every computing ATen op on "tpu" lands here.

For each op we (1) let PyTorch's meta function check the arguments and
compute output shapes, dtypes and strides -- so shape and dtype errors are
PyTorch's own; (2) allocate outputs on "tpu" (functional ops), or use
`self` (in-place) / `out=` tensors; (3) hand the op name, the arguments and
the outputs to the C core, which lowers the op to StableHLO with its one
lowering table, caches the compiled program and runs it.

An op without a lowering is decomposed with PyTorch's decompositions when
one exists; otherwise it raises NotImplementedError, or runs on the CPU
when CPU fallback is on.
"""
import ctypes
import functools
import os
import threading

import torch
from torch.utils._pytree import tree_map

from . import _C, _attention, _composite
from ._dtypes import CODE

_fallback_lib = None
_impl_lib = None
_state = threading.local()

# --------------------------------------------------------------------------
# CPU fallback switch and counters

_cpu_fallback = os.environ.get("TORCH_PJRT_CPU_FALLBACK", "0") not in ("", "0", "false", "False")
_fallback_counts = {}
_fallback_lock = threading.Lock()


def set_cpu_fallback(enabled: bool):
    """Run ops that have no tpu lowering on the CPU (slow, but complete)."""
    global _cpu_fallback
    _cpu_fallback = bool(enabled)


def cpu_fallback_enabled() -> bool:
    return _cpu_fallback


def cpu_fallback_counts():
    """{op name: times it ran on the CPU} since start (or the last reset)."""
    with _fallback_lock:
        return dict(_fallback_counts)


def reset_cpu_fallback_counts():
    with _fallback_lock:
        _fallback_counts.clear()


# Ops whose output shape depends on the data: computed on the host, always.
# (A PJRT program needs static shapes.)  They are counted like fallbacks.
# Also algorithms that CUDA, too, runs on the host.
_HOST_OPS = {
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::_unique",
    "aten::repeat_interleave.Tensor",
    "aten::bincount",
    # The general (non-symmetric) eigendecomposition has no XLA form; CUDA
    # computes it on the host too (MAGMA's geev).
    "aten::linalg_eig",
    "aten::_linalg_eigvals",
    # The gradients of gamma and Dirichlet samples (rsample): series and
    # asymptotic expansions per element, as the CPU computes them.
    "aten::_standard_gamma_grad",
    "aten::_dirichlet_grad",
}

# --------------------------------------------------------------------------
# Encoding arguments for the C core


def _ref(t):
    off = t.storage_offset()
    # data_ptr() is the storage's handle plus the offset (and NULL for empty
    # tensors, where we ask the storage itself).
    ptr = t.data_ptr() - off * t.element_size() if t.numel() else t.untyped_storage().data_ptr()
    return ("T", ptr, CODE[t.dtype], t.shape, t.stride(), off)


def _warn_recompile(op, arg, count, is_tensor):
    """An eager op compiled `count` programs that differ in argument `arg`
    of its schema only (the engine's note, csrc/core/eager.c "recompiles"):
    name both.  Integer positions, offsets and shifts are runtime operands;
    what is left in a program shapes its result: sizes, and integers such as
    a pad width or a diagonal's offset."""
    name = f"#{arg}"
    try:
        ns, rest = op.split("::")
        base, _, overload = rest.partition(".")
        name = getattr(getattr(torch.ops, ns), base)._schemas[overload].arguments[arg].name
    except (AttributeError, KeyError, IndexError, ValueError):
        pass
    if is_tensor:
        what = "its shape, dtype or layout"
        advice = "pad variable-length inputs to a few sizes (torch_pjrt.bucket())"
    else:
        what = "its value"
        advice = "this value shapes the program, so each new one compiles another: pass fewer distinct values"
    _warn_at_user_line(f"torch-pjrt: {op} compiled {count} eager programs that differ only in argument "
                       f"'{name}' ({what}); {advice}.")


def _warn_at_user_line(msg):
    """warnings.warn pointed at the first frame outside torch and torch-pjrt
    (where TORCH_WARN's would point for a CPU op)."""
    import sys
    import warnings

    level, f = 1, sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_LIBRARY_DIRS):
        level, f = level + 1, f.f_back
    warnings.warn(msg, UserWarning, stacklevel=level + 1)


_LIBRARY_DIRS = (os.path.dirname(__file__), os.path.dirname(torch.__file__))


def _is_tpu(t):
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def _scalar_code(v):
    if isinstance(v, bool):
        return 11
    if isinstance(v, int):
        return 4
    if isinstance(v, complex):
        return 10
    return 7


# Ops that update arguments in place without saying so in their schema.
_MUTATES = {"aten::native_batch_norm": (3, 4)}


def _stats_dtype(vals, x, params):
    """dtype of a normalisation's saved statistics on CPU: the input's,
    or float32 when a reduced-precision input has float32 parameters."""
    dt = vals[x].dtype
    if dt in (torch.float16, torch.bfloat16) and any(
            isinstance(vals[i], torch.Tensor) and vals[i].dtype == torch.float32 for i in params):
        return torch.float32
    return dt


def _norm_stats(x, params, training=None):
    """A spec fix for a normalisation op: outputs 1 and 2 (the saved
    statistics) get CPU's dtype, and CPU's empty shape when not training
    (the meta functions give CUDA's float32, [C])."""
    def fix(vals, specs):
        dt = _stats_dtype(vals, x, params)
        empty = training is not None and (training is False or not vals[training])
        out = list(specs)
        for i in (1, 2):
            if i < len(out) and out[i] is not None:
                shape, stride, _ = out[i]
                out[i] = ((0,), (1,), dt) if empty else (shape, stride, dt)
        return tuple(out)
    return fix


def _weight_norm_fix(vals, specs):
    """_weight_norm_interface's norm as the CPU kernel makes it: g's sizes
    and strides (the meta function reduces a 1-d v to one element), float32
    for float16 as for bfloat16 (the meta function keeps float16)."""
    g = vals[1]
    if specs[1] is None or not isinstance(g, torch.Tensor):
        return specs
    dt = torch.float32 if g.dtype in (torch.float16, torch.bfloat16) else specs[1][2]
    return (specs[0], (tuple(g.shape), tuple(g.stride()), dt))


def _channels_last(t):
    """The channels-last memory format t is laid out in, or None."""
    if not isinstance(t, torch.Tensor) or t.dim() not in (4, 5) or t.is_contiguous():
        return None
    fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    return fmt if t.is_contiguous(memory_format=fmt) else None


def _conv_layout_fix(inp, weight, outs):
    """Convolutions whose input or weight is channels-last give channels-last
    results on the CPU and CUDA (mkldnn, cuDNN); the meta function's are
    contiguous.  `outs`: the indices of the outputs shaped like the input."""
    def fix(vals, specs):
        fmt = _channels_last(vals[inp]) or _channels_last(vals[weight])
        if fmt is None:
            return specs
        specs = list(specs)
        for i in outs:
            if i < len(specs) and specs[i] is not None and len(specs[i][0]) == vals[inp].dim():
                stride = torch.empty(specs[i][0], device="meta").to(memory_format=fmt).stride()
                specs[i] = (specs[i][0], stride, specs[i][2])
        return tuple(specs)

    return fix


# Ops whose meta function's outputs differ from what PyTorch's CPU kernel
# returns: name -> fix(argument values, output specs) -> output specs.
_SPEC_FIX = {
    "aten::convolution": _conv_layout_fix(0, 1, (0,)),
    "aten::convolution_backward": _conv_layout_fix(1, 2, (0,)),
    "aten::_weight_norm_interface": _weight_norm_fix,
    "aten::native_layer_norm": _norm_stats(0, (2, 3)),
    "aten::native_group_norm": _norm_stats(0, (1, 2)),
    "aten::native_batch_norm": _norm_stats(0, (1, 2, 3, 4), training=5),
    "aten::_native_batch_norm_legit": _norm_stats(0, (1, 2, 3, 4), training=5),
    "aten::_native_batch_norm_legit.no_stats": _norm_stats(0, (1, 2)),
    "aten::_native_batch_norm_legit_no_training": _norm_stats(0, (1, 2, 3, 4), training=False),
    "aten::_native_batch_norm_legit_functional": _norm_stats(0, (1, 2, 3, 4), training=5),
    "aten::_batch_norm_with_update": _norm_stats(0, (1, 2, 3, 4)),
}

# Ops whose output shape (or whose errors) depend on the value of a Python number.
_SHAPE_FROM_VALUES = {"arange", "linspace", "logspace", "range", "pow", "full"}

_WRAPPED_DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex128)

_NUMBER_TYPES = ("Tensor", "Optional[Tensor]", "number", "Optional[number]", "Scalar", "Optional[Scalar]")


def _encode(v, device, number_is_scalar=False):
    """One argument value -> what _C.run takes.  Python numbers passed where
    the schema takes a Tensor or Scalar are runtime scalars."""
    if number_is_scalar and isinstance(v, (bool, int, float, complex)):
        return ("S", _scalar_code(v), v, True)
    if isinstance(v, torch.Tensor):
        if v.device.type == "tpu":
            if v.device.index != device:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{device} and {v.device}!"
                )
            return _ref(v)
        if v.dim() == 0 and v.device.type == "cpu":
            # A Python number wrapped by the arg parser, or a CPU scalar tensor
            # (which PyTorch allows next to device tensors).
            wrapped = v.dtype in (torch.float64, torch.int64, torch.bool, torch.complex128)
            return ("S", CODE[v.dtype], v.item(), wrapped)
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"tpu:{device} and {v.device}!"
        )
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, torch.dtype):
        return CODE.get(v)
    if isinstance(v, (list, tuple)):
        if any(isinstance(x, torch.Tensor) for x in v) or (v and all(x is None for x in v)):
            return ("L", [None if x is None else _encode(x, device) for x in v])
        if all(isinstance(x, (int, bool)) for x in v):
            return [int(x) for x in v]
        return None  # float lists etc.: no rule reads them yet
    # memory_format, layout, device, generator: rules do not need them
    return None


def _device_of(args, kwargs):
    dev = None
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return v.device.index
        if isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor) and x.device.type == "tpu":
                    return x.device.index
    return dev


def _to_meta(v):
    if isinstance(v, torch.Tensor) and v.device.type == "tpu":
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _to_meta_all(v):
    if isinstance(v, torch.Tensor) and v.device.type in ("tpu", "cpu"):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


# --------------------------------------------------------------------------
# Meta functions for ops PyTorch has none for (output shapes, dtypes, strides
# as the CPU kernel gives them).


def _meta_geqrf(a):
    if a.dim() < 2:
        raise RuntimeError("torch.geqrf: The input tensor A must have at least 2 dimensions.")
    m, n = a.shape[-2:]
    # LAPACK's column-major layout, as on the CPU
    qr = torch.empty(a.shape, dtype=a.dtype, device="meta").mT.contiguous().mT
    tau = torch.empty(a.shape[:-2] + (min(m, n),), dtype=a.dtype, device="meta")
    return qr, tau


def _meta_lstsq(a, b, rcond=None, driver=None):
    # The checks and shapes of PyTorch's CPU linalg_lstsq.
    if a.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if a.dtype != b.dtype:
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, "
                           f"but got input's dtype {a.dtype} and other's dtype {b.dtype}")
    dim_diff = a.dim() - b.dim()
    if not 0 <= dim_diff <= 1:
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    vector = dim_diff == 1
    bm = b.unsqueeze(-1) if vector else b
    m, n = a.shape[-2:]
    if bm.shape[-2] != m:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    driver = "gelsy" if driver is None else driver
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    batch = torch.broadcast_shapes(a.shape[:-2], bm.shape[:-2])
    k = bm.shape[-1]
    sol = batch + ((n,) if vector else (n, k))
    res = (batch + (() if vector else (k,))) if (m > n and driver != "gelsy") else (0,)
    rank = batch if driver != "gels" else (0,)
    sv = batch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,)
    real = a.dtype.to_real() if a.is_complex() else a.dtype
    e = functools.partial(torch.empty, device="meta")
    return e(sol, dtype=a.dtype), e(res, dtype=real), e(rank, dtype=torch.int64), e(sv, dtype=real)


def _lstsq_post(vals, outs):
    # gelsd/gelss report residuals only when every matrix has full rank.
    a, drv = vals[0], vals[3] or "gelsy"
    m, n = a.shape[-2:]
    if drv in ("gelsd", "gelss") and m > n and outs[1].numel() and bool((outs[2] < n).any()):
        outs[1].resize_(0)


def _nonfinite(t):
    return t.numel() > 0 and not bool(torch.isfinite(t).all())


def _svd_post(vals, outs):
    # LAPACK fails on a non-finite input and PyTorch raises (our Jacobi
    # iteration gives NaNs, which is how the failure is seen here).
    if _nonfinite(outs[1]):
        raise torch.linalg.LinAlgError(
            "linalg.svd: The algorithm failed to converge because the input matrix contained non-finite values.")


def _eigh_post(vals, outs):
    if _nonfinite(outs[0]):
        raise torch.linalg.LinAlgError(
            "linalg.eigh: The algorithm failed to converge because the input matrix is ill-conditioned or has "
            "too many repeated eigenvalues (it contains non-finite values).")


_LEGACY_TYPE = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def _legacy_type(dt):
    return f"torch.{_LEGACY_TYPE.get(dt, str(dt).replace('torch.', ''))}Tensor"


def _meta_embedding_bag(forward_only):
    """_embedding_bag / _embedding_bag_forward_only: the CPU kernel's checks
    (in its order, with its messages) and output shapes.  PyTorch's meta
    function gives CUDA's shapes off the CPU (and lacks some checks): on the
    CPU offset2bag is empty on the "fast path" (mode sum, float32/float16/
    bfloat16 weight with stride(1) == 1, no padding_idx, unit-stride
    per_sample_weights), bag_size has one entry per bag (per offset for
    forward_only in mode sum), max_indices is (bags, D) for max and shaped
    like bag_size otherwise; the index outputs have the promoted dtype of
    indices and offsets.  Values that need the data (offsets[0] == 0,
    indices in range) are not checked on tpu."""
    def meta(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
             per_sample_weights=None, include_last_offset=False, padding_idx=-1):
        if indices.dim() not in (1, 2):
            raise RuntimeError(f"input has to be a 1D or 2D Tensor, but got Tensor of dimension {indices.dim()}")
        if indices.dim() == 1 and offsets.dim() != 1:
            raise RuntimeError(f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.dim()}")
        if weight.dim() != 2:
            raise RuntimeError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
        it = torch.promote_types(indices.dtype, offsets.dtype)
        if it not in (torch.int64, torch.int32):
            raise RuntimeError(
                "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
                f"but got {_legacy_type(it)} instead (while checking arguments for embedding_bag)")
        if weight.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise RuntimeError(
                "Expected tensor for argument #1 'weight' to have one of the following scalar types: Half, BFloat16, "
                f"Float, Double; but got {_legacy_type(weight.dtype)} instead (while checking arguments for "
                "embedding_bag)")
        psw = per_sample_weights
        if psw is not None:
            if mode != 0:
                raise RuntimeError("embedding_bag: per_sample_weights only supported with mode='sum'")
            if psw.dtype != weight.dtype:
                raise RuntimeError(
                    "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                    f"'per_sample_weights'; but type {_legacy_type(weight.dtype)} does not equal "
                    f"{_legacy_type(psw.dtype)} (while checking arguments for embedding_bag)")
            for cond, ok in (("dim() == 1", psw.dim() == 1), ("numel() == indices.numel()",
                                                             psw.numel() == indices.numel())):
                if not ok:
                    raise RuntimeError(
                        f"Expected per_sample_weights.value().{cond} to be true, but got false.  (Could this error "
                        "message be improved?  If so, please report an enhancement request to PyTorch.)")
        if include_last_offset and offsets.size(0) < 1:
            raise RuntimeError("include_last_offset: number of offset should be at least 1")
        if mode not in (0, 1, 2):
            raise RuntimeError("`mode` must be sum, mean, or max.")
        if indices.dim() != 1:
            # F.embedding_bag flattens 2-D input itself; only a direct call gets here.
            raise NotImplementedError(
                "aten::_embedding_bag with 2-D indices is not supported on the tpu device (torch-pjrt); "
                "F.embedding_bag and nn.EmbeddingBag flatten them")
        num_bags = offsets.size(0) - (1 if include_last_offset else 0)
        D = weight.size(1)
        fast = (weight.dtype in (torch.float32, torch.float16, torch.bfloat16) and weight.stride(1) == 1
                and padding_idx < 0 and (psw is None or psw.stride(0) == 1))
        e = functools.partial(torch.empty, device="meta")
        output = e((num_bags, D), dtype=weight.dtype)
        offset2bag = e((0 if mode == 0 and fast else indices.size(0),), dtype=it)
        bag_size = e((offsets.size(0) if forward_only and mode == 0 else num_bags,), dtype=it)
        max_indices = e((num_bags, D) if mode == 2 else bag_size.shape, dtype=it)
        return output, offset2bag, bag_size, max_indices
    return meta


def _meta_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm's output, with the checks of PyTorch's CPU kernel
    (its messages) but not its 16-byte stride alignment, a constraint of the
    CPU and CUDA kernels that tpu buffers do not have, nor the bfloat16-only
    rule of PyTorch's meta function, which describes CUDA's kernel: on tpu it
    takes float32, bfloat16 and float16 alike, eager and compiled, as Hugging
    Face's mixture-of-experts layers expect of a "tpu" device.  Serves eager
    mode (meta tensors) and tracing (fake tensors)."""
    floats = (torch.float32, torch.bfloat16, torch.float16)
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        torch._check(m.dtype in floats,
                     lambda: f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {m.dtype}")
        torch._check(m.dim() in (2, 3), lambda: f"{name} has to be 2 or 3d")
    torch._check(mat_a.dtype == mat_b.dtype, lambda: f"expected mat_a and mat_b to have the same dtype, but got: "
                                                     f"{mat_a.dtype} != {mat_b.dtype}")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    # (the CPU kernel checks two 2-d matrices only in its mm, with mm's message)
    torch._check(mat_a.shape[-1] == mat_b.shape[-2], lambda: "contraction dimension of mat_a and mat_b must match")
    torch._check((offs is not None) == (a2 or b2), lambda: "Have to provide offsets if there is a 2d matrix, "
                                                          "or no offset if both matrices are 3d")
    if offs is not None:
        torch._check(offs.dim() == 1, lambda: "offs has to be 1D")
        torch._check(offs.dtype == torch.int32, lambda: "Offsets have to be int32")
    torch._check(bias is None, lambda: "Bias not supported yet")
    torch._check(out_dtype in (None, mat_a.dtype), lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if a2 and b2:
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif a2 or b2:
        groups = mat_b.shape[0] if a2 else mat_a.shape[0]
        torch._check(offs.shape[0] == groups, lambda: "matrix batch sizes have to match")
        shape = (mat_a.shape[0], mat_b.shape[-1]) if a2 else (mat_a.shape[1], mat_b.shape[1])
    else:
        torch._check(mat_a.shape[0] == mat_b.shape[0], lambda: "batched dimension has to match")
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    return mat_a.new_empty(shape)


def _like_self(self, *args, **kwargs):
    return torch.empty_like(self, memory_format=torch.contiguous_format)


def _no_outputs(*args, **kwargs):
    return ()  # "-> ()": the op writes its mutated arguments


# Meta functions of ops that have none in PyTorch, or whose PyTorch meta
# function gives another device's shapes (embedding bags), called with meta
# tensors.
_PY_META = {
    "aten::geqrf": _meta_geqrf, "aten::linalg_lstsq": _meta_lstsq,
    "aten::_cummax_helper": _no_outputs, "aten::_cummin_helper": _no_outputs,
    "aten::_logcumsumexp": _like_self,
    "aten::_grouped_mm": _meta_grouped_mm,
    "aten::_embedding_bag": _meta_embedding_bag(False),
    "aten::_embedding_bag_forward_only": _meta_embedding_bag(True),
    "aten::multi_margin_loss_backward": lambda grad_output, self, *a, **k: _like_self(self),
    "aten::multilabel_margin_loss_backward": lambda grad_output, self, *a, **k: _like_self(self),
    "aten::fractional_max_pool3d_backward": lambda grad_output, self, *a, **k: _like_self(self),
    # The CPU kernel still takes a uint8 condition (deprecated); PyTorch's ref refuses it.
    "aten::where.self": lambda c, x, y: torch.where(c.bool() if c.dtype == torch.uint8 else c, x, y),
}
# Run after the lowering, with (argument values, outputs): output fix-ups
# that depend on computed values (keyed by the functional op's name).
_POST = {"aten::linalg_lstsq": _lstsq_post, "aten::_linalg_svd": _svd_post, "aten::_linalg_eigh": _eigh_post}

# linalg ops whose CPU kernels factor A^T instead of A when A is contiguous
# (and real), which their LU / pivots outputs show: their rule runs on A^T
# (det(A^T) = det(A)).
_LU_OF_TRANSPOSE = {"aten::_linalg_det", "aten::_linalg_slogdet"}


def _factors_transpose(a):
    """Whether those kernels factor a^T (eager calls and compiled graphs alike)."""
    return a.is_contiguous() and not a.is_complex()

# linalg ops with a check_errors argument -> the API name in PyTorch's errors.
_CHECK_ERRORS = {
    "aten::linalg_cholesky_ex": "linalg.cholesky_ex",
    "aten::linalg_inv_ex": "linalg.inv_ex",
    "aten::_linalg_solve_ex": "torch.linalg.solve_ex",
    "aten::linalg_lu_factor_ex": "torch.linalg.lu_factor_ex",
}


def _check_host_index(x, t, pos, ordinal):
    """An index tensor whose values the host has (a CPU tensor, or a tpu one
    just uploaded as a whole: a Python list) is bounds-checked here, before
    launch, with the CPU kernel's IndexError; indices computed on the device
    keep the program's deferred check (docs/architecture.md, "Index checks")."""
    if t.dtype not in (torch.int64, torch.int32) or t.numel() == 0 or pos >= x.dim():
        return
    if t.device.type == "cpu":
        h = t
    else:
        b = _C.host_values(_ref(t))
        if b is None:
            return
        h = torch.frombuffer(bytearray(b), dtype=t.dtype).view(t.shape)
    size = x.shape[pos]
    if size == 0:
        raise IndexError("index is out of bounds for dimension with size 0")
    bad = ((h >= size) | (h < -size)).flatten()
    if bad.any():
        v = h.flatten()[bad.nonzero()[0, 0]].item()  # the first, in the order the CPU kernel meets them
        # the CPU names the index tensor's place among the indices, not self's dim
        raise IndexError(f"index {v} is out of bounds for dimension {ordinal} with size {size}")


def _warn_uint8_index():
    """The CPU's deprecation warning for a uint8 mask (IndexingUtils.cpp,
    once per indexing op)."""
    _warn_at_user_line("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.")


def _check_mask_put(args, kwargs):
    """x[mask] = v: the CPU checks v against the indexing result, whose
    extent at the mask is the mask's count, before it compares dtypes.  Where
    v could only fit one count, that count is read (one sync) and the CPU's
    error raised here instead of at the next synchronisation."""
    x = args[0] if args else kwargs.get("self")
    lst = args[1] if len(args) > 1 else kwargs.get("indices")
    v = args[2] if len(args) > 2 else kwargs.get("values")
    if not isinstance(x, torch.Tensor) or not isinstance(v, torch.Tensor) or not lst:
        return
    ts = [(p, t) for p, t in enumerate(lst) if t is not None]
    if len(ts) != 1 or ts[0][1].dtype not in (torch.bool, torch.uint8) or ts[0][1].dim() == 0:
        return
    pos, m = ts[0]
    tail = list(x.shape[pos + m.dim():])
    k = v.dim() - len(tail) - 1  # v's dim that meets the count
    if k < 0 or v.shape[k] == 1 or any(p is not None for p in lst[:pos]):
        return
    res = list(x.shape[:pos]) + [int(m.count_nonzero())] + tail
    vs = list(v.shape)
    if len(vs) > len(res) or any(a not in (1, b) for a, b in zip(vs[::-1], res[::-1])):
        raise RuntimeError(f"shape mismatch: value tensor of shape {_sizes(v)} cannot be broadcast to indexing "
                           f"result of shape [{', '.join(map(str, res))}]")


# Ops whose source must have self's dtype (argument name, the CPU's message),
# functional, in-place and out= forms alike.
_SAME_DTYPE = {
    "index_add": ("source", "index_add_(): self ({self}) and source ({source}) must have the same scalar type"),
    "index_copy": ("source", "index_copy_(): self and source expected to have the same dtype, but got (self) "
                             "{self} and (source) {source}"),
    "put": ("source", "put_(): self and source expected to have the same dtype, but got self.dtype = {self} and "
                      "source.dtype = {source}"),
    "index_put": ("values", "Index put requires the source and destination dtypes match, got {self} for the "
                            "destination and {source} for the source."),
}
_SAME_DTYPE["_index_put_impl"] = _SAME_DTYPE["index_put"]

# Ops run through decompositions that PyTorch's CPU kernels refuse for complex
# inputs (the lowered ones: k_no_complex in csrc/core/lower.c).
_NO_COMPLEX = {
    "xlogy": (NotImplementedError, "\"xlogy_cpu\" not implemented for '{}'"),
    "nansum": (RuntimeError, "nansum on CPU does not support complex inputs"),
}
_NO_COMPLEX["special_xlogy"] = _NO_COMPLEX["xlogy"]

# Reductions without an identity: an empty reduced dim raises on the CPU.
_NEEDS_NONEMPTY = {"max", "min", "amax", "amin", "argmax", "argmin", "aminmax", "kthvalue", "median", "nanmedian",
                   "mode"}


def _sizes(t):
    return f"[{', '.join(str(int(s)) for s in t.shape)}]"


def _check_mask(self, mask, pos):
    """A mask indexing self from dim pos must have self's sizes there (the
    CPU's IndexError; nonzero would otherwise pick elements silently)."""
    if not isinstance(self, torch.Tensor):
        return
    for j in range(mask.dim()):
        if pos + j < self.dim() and mask.shape[j] != self.shape[pos + j]:
            raise IndexError(f"The shape of the mask {_sizes(mask)} at index {j} does not match the shape of "
                             f"the indexed tensor {_sizes(self)} at index {pos + j}")


def _raise_broadcast(args, kwargs):
    """The CPU's message (TensorIterator's) for tensors of a pointwise op
    that do not broadcast: the last mismatching dim of the shape broadcast
    so far (a) and the next tensor's (b)."""
    shape = None
    for t in [*args, *kwargs.values()]:
        if not isinstance(t, torch.Tensor):
            continue
        if shape is None:
            shape = list(t.shape)
            continue
        b, n = list(t.shape), max(len(shape), t.dim())
        a, b = [1] * (n - len(shape)) + shape, [1] * (n - len(b)) + b
        for i in reversed(range(n)):
            if a[i] != b[i] and a[i] != 1 and b[i] != 1:
                raise RuntimeError(f"The size of tensor a ({a[i]}) must match the size of tensor b ({b[i]}) at "
                                   f"non-singleton dimension {i}") from None
        shape = [max(x, y) if min(x, y) != 0 else 0 for x, y in zip(a, b)]


def _check_mm(v):
    a, b = v.get("mat1", v.get("self")), v.get("mat2")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2 \
            and a.shape[1] != b.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                           f"{b.shape[0]}x{b.shape[1]})")


def _check_conv(v):
    """at::_convolution's argument checks (check_shape_forward), which the
    CPU runs before any backend and PyTorch's meta function words otherwise."""
    x, w, bias = v["input"], v["weight"], v.get("bias")
    groups, transposed = v.get("groups", 1), v.get("transposed", False)
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return
    n = x.dim() - 2
    stride, padding, dilation = (list(v.get(k) or []) for k in ("stride", "padding", "dilation"))
    for vals, bad, msg in ((padding, lambda p: p < 0, "negative padding is not supported"),
                           (list(v.get("output_padding") or []), lambda p: p < 0,
                            "negative output_padding is not supported"),
                           (stride, lambda p: p <= 0, "non-positive stride is not supported"),
                           (dilation, lambda p: p < 0, "dilation should be greater than zero"),
                           (dilation, lambda p: p == 0, f"dilation should be greater than zero, but got {dilation}")):
        if any(bad(p) for p in vals):
            raise RuntimeError(msg)
    ws = _sizes(w)
    if w.dim() != x.dim():
        raise RuntimeError(f"Expected {w.dim()}-dimensional input for {w.dim()}-dimensional weight {ws}, but got "
                           f"{x.dim()}-dimensional input of size {_sizes(x)} instead")
    if w.shape[0] < groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got "
                           f"weight of size {ws} instead")
    if w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                           f"got weight of size [{ws}] instead")
    has_bias = isinstance(bias, torch.Tensor)
    if transposed:
        if x.shape[1] != w.shape[0]:
            raise RuntimeError(f"Given transposed=1, weight of size {ws}, expected input{_sizes(x)} to have "
                               f"{w.shape[0]} channels, but got {x.shape[1]} channels instead")
        if has_bias and (bias.dim() != 1 or bias.shape[0] != w.shape[1] * groups):
            raise RuntimeError(f"Given transposed=1, weight of size {ws}, expected bias to be 1-dimensional with "
                               f"{w.shape[1] * groups} elements, but got bias of size {_sizes(bias)} instead")
        return
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {ws}, expected input{_sizes(x)} to have "
                           f"{w.shape[1] * groups} channels, but got {x.shape[1]} channels instead")
    if has_bias and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise RuntimeError(f"Given weight of size {ws}, expected bias to be 1-dimensional with {w.shape[0]} "
                           f"elements, but got bias of size {_sizes(bias)} instead")
    if len(padding) == n and len(dilation) == n:
        padded = [x.shape[2 + i] + 2 * padding[i] for i in range(n)]
        kernel = [dilation[i] * (w.shape[2 + i] - 1) + 1 for i in range(n)]
        if any(p < k for p, k in zip(padded, kernel)):
            raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). "
                               f"Kernel size: ({' x '.join(map(str, kernel))}). Kernel size can't be greater than "
                               "actual input size")


_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def _check_index(v):
    """aten::index / index_put: the CPU's IndexErrors (checkIndexTensorTypes
    and make_info's expand_outplace) where the meta functions raise a
    RuntimeError of their own wording.  Masks are long indices by now
    (_fix_indices) except in index_put, whose rule takes one mask itself."""
    if "indices" in v and not v["indices"] and "values" not in v:  # index_put takes none: all of self
        raise IndexError("at least one index must be provided")
    idx = [t for t in (v.get("indices") or ()) if t is not None]
    if any(t.dtype not in _INDEX_DTYPES for t in idx):
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if any(t.dtype in (torch.bool, torch.uint8) for t in idx):
        return  # a mask's extent is its count: data-dependent (the lowering checks)
    try:
        torch.broadcast_shapes(*(t.shape for t in idx))
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(_sizes(t) for t in idx)) from None


def _check_index_select(v):
    i, x, dim = v.get("index"), v.get("self"), v.get("dim")
    if isinstance(i, torch.Tensor) and i.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if (isinstance(x, torch.Tensor) and isinstance(i, torch.Tensor) and isinstance(dim, int) and x.dim()
            and -x.dim() <= dim < x.dim() and x.shape[dim] == 0 and i.numel()):
        raise RuntimeError("index_select(): self indexing axis dim should be positive")


def _check_index_copy(v):
    """index_copy's CPU checks, in the CPU's order and words (its meta
    function words them otherwise, and refuses a 0-dim index or source that
    the CPU takes)."""
    x, dim, index, src = v.get("self"), v.get("dim"), v.get("index"), v.get("source")
    if not all(isinstance(t, torch.Tensor) for t in (x, index, src)) or not isinstance(dim, int):
        return
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        return  # the dim check's own IndexError follows
    dim %= max(x.dim(), 1)
    if index.dim() >= 2:
        raise IndexError(f"index_copy_(): Index should have dimension 1 or 0 (got {index.dim()})")
    n = index.numel()
    if src.dim() == 0 and n != 1:
        raise IndexError(f"index_copy_(): When source is scalar, index should have one element (got {n})")
    if src.dim() != x.dim() and src.dim() != 0 and x.dim() != 0:
        raise IndexError("index_copy_(): When source and destination are not scalars, their dimensionality must "
                         f"match. Source dimensionality ({src.dim()}), destination dimensionality ({x.dim()})")
    if index.dtype != torch.int64:
        raise RuntimeError(f"index_copy_(): Expected a long tensor for index, but got {_LEGACY_TYPE.get(index.dtype)}")
    if x.dtype != src.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{_LEGACY_TYPE.get(x.dtype)} and (source) {_LEGACY_TYPE.get(src.dtype)}")
    xs = [d for i, d in enumerate(x.shape) if i != dim]
    ss = [d for i, d in enumerate(src.shape) if i != dim]
    if xs != ss:
        raise RuntimeError("index_copy_(): Source/destination tensor must have same slice shapes. Destination slice "
                           f"shape: {' '.join(map(str, xs))} at dimension {dim} and source slice shape: "
                           f"{' '.join(map(str, ss))} at dimension 0.")
    if src.dim() and n != src.shape[dim]:
        raise IndexError(f"index_copy_(): Number of indices ({n}) should be equal to source.size(dim) "
                         f"({src.shape[dim]})")


def _check_index_fill(v):
    x, value = v.get("self"), v.get("value")
    if isinstance(x, torch.Tensor) and isinstance(value, complex) and not x.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")


_CPP_TYPE = {torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short int", torch.int32: "int",
             torch.int64: "long int", torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
             torch.bfloat16: "c10::BFloat16"}


def _check_masked_fill(v):
    m = v.get("mask")
    if isinstance(m, torch.Tensor) and m.dtype != torch.bool:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{_CPP_TYPE.get(m.dtype, m.dtype)}")


def _check_nll(v):
    t = v.get("target")
    if isinstance(t, torch.Tensor) and t.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {_LEGACY_TYPE.get(t.dtype, t.dtype)}")


def _check_layer_norm(v):
    x, ns = v.get("input"), list(v.get("normalized_shape") or [])
    if isinstance(x, torch.Tensor) and ns and (x.dim() < len(ns) or list(x.shape[x.dim() - len(ns):]) != ns):
        raise RuntimeError(f"Given normalized_shape={ns}, expected input with shape [*, {', '.join(map(str, ns))}], "
                           f"but got input of size{_sizes(x)}")


# Argument checks of the CPU kernels, with their messages, where PyTorch's
# meta functions word them otherwise or miss them (keyed by the op's base
# name; called with the arguments by name, once per argument signature).
_CPU_CHECKS = {
    "mm": _check_mm, "addmm": _check_mm, "_addmm_activation": _check_mm,
    "convolution": _check_conv, "_convolution": _check_conv, "convolution_overrideable": _check_conv,
    "index_select": _check_index_select, "index_copy": _check_index_copy, "index_fill": _check_index_fill,
    "masked_fill": _check_masked_fill,
    "index": _check_index, "index_put": _check_index, "_index_put_impl": _check_index,
    "nll_loss_forward": _check_nll, "nll_loss2d_forward": _check_nll,
    "native_layer_norm": _check_layer_norm,
}


def _check_nonempty(base, vals, names):
    x = vals[0]
    if any(isinstance(v, torch.Tensor) for v in vals[1:]) and "dim" not in names:
        return  # max.other, min.other: elementwise
    dim = vals[names.index("dim")] if "dim" in names else None
    if dim is None or (isinstance(dim, (list, tuple)) and not dim and base in ("amax", "amin")):
        if base in ("median", "nanmedian", "mode", "kthvalue"):  # median() of nothing is nan
            return
        exc = IndexError if base.startswith("arg") else RuntimeError
        raise exc(f"{base}(): Expected reduction dim to be specified for input.numel() == 0."
                  + ("" if exc is IndexError else " Specify the reduction dim with the 'dim' argument."))
    for d in (dim if isinstance(dim, (list, tuple)) else [dim]):
        size = x.shape[d] if x.dim() else 1
        if size == 0:
            raise IndexError(f"{base}(): Expected reduction dim {d} to have non-zero size.")


# --------------------------------------------------------------------------
# Per-op handlers


def _qualname(op):
    s = op._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


class _Handler:
    """How one OpOverload runs on tpu; built on first use."""

    def __init__(self, op):
        self.op = op
        self.name = _qualname(op)
        schema = op._schema
        self.schema = schema
        self.args_schema = list(schema.arguments)
        # the position of a Generator? argument (random ops), or None
        self.generator_idx = next((i for i, a in enumerate(self.args_schema) if "Generator" in str(a.type)), None)
        self.is_out = any(a.is_out for a in self.args_schema) or schema.overload_name.startswith("out")
        base = schema.name.split("::")[1]
        self.is_inplace = base.endswith("_") and not self.is_out and bool(schema.returns) and (
            schema.returns[0].alias_info is not None and schema.returns[0].alias_info.is_write
        )
        self.lowering = None
        self.functional_args = self.args_schema
        if self.is_out:
            # A rule for the out= overload itself (factories like arange.start_out),
            # else the rule of the functional overload it computes.
            if _C.has_lowering(self.name):
                self.lowering = self.name
                self.functional_args = [a for a in self.args_schema if not a.is_out]
            else:
                self.lowering, self.functional_args = self._functional_for_out()
        elif self.is_inplace:
            if _C.has_lowering(self.name):
                self.lowering = self.name
            else:
                fop = self.inplace_functional()
                if fop is not None and _C.has_lowering(_qualname(fop)):
                    self.lowering = _qualname(fop)
        elif _C.has_lowering(self.name):
            self.lowering = self.name
        self.all_args = self.args_schema
        self.defaults = [a.default_value if a.has_default_value() else None for a in self.args_schema]
        names = [a.name for a in self.functional_args]
        self.functional_idx = [i for i, a in enumerate(self.args_schema) if a.name in names and not a.is_out]
        self.out_idx = [i for i, a in enumerate(self.args_schema) if a.is_out]
        self.all_functional = self.functional_idx == list(range(len(self.args_schema)))
        self.number_is_scalar = [str(a.type) in _NUMBER_TYPES for a in self.args_schema]
        self.numbers_by_value = self.name.split("::")[1].split(".")[0] in _SHAPE_FROM_VALUES
        self.meta_cache = {}
        # Arguments a functional op updates in place (batch norm's running
        # stats): passed to the rule as extra outputs after the real ones.
        self.mutated_idx = [] if (self.is_out or self.is_inplace) else [
            i for i, a in enumerate(self.args_schema)
            if a.alias_info is not None and a.alias_info.is_write] or list(_MUTATES.get(self.name, ()))
        # Tensor?[] index lists may hold CPU tensors (PyTorch moves them).
        self.index_lists = [i for i, a in enumerate(self.args_schema) if str(a.type) == "List[Optional[Tensor]]"]
        # linalg conventions beyond the values (_LU_OF_TRANSPOSE, _CHECK_ERRORS, _POST)
        ce = next((i for i, a in enumerate(self.args_schema) if a.name == "check_errors"), None)
        api = _CHECK_ERRORS.get(self.lowering)
        self.check_errors = (api, ce) if api is not None and ce is not None else None
        self.swap = self.lowering in _LU_OF_TRANSPOSE
        self.post = _POST.get(self.lowering)
        self.linalg = bool(self.check_errors or self.swap or self.post)
        # Ops PyTorch lets see conjugate and negative views unresolved (its
        # Conjugate/Negative fallthroughs: mm, addmm, bmm, baddbmm, dot, vdot,
        # linalg_solve_triangular, conj_physical, in their every form), because
        # its CPU/CUDA kernels fold the bits into BLAS calls.  The rules read
        # stored values, so the handler resolves the bits first.  Not for ops
        # that read no values (empty_like, full_like: resolve_conj itself
        # calls empty_like) or apply the bits themselves (_copy_from).
        self.base = base = self.name.split("::")[1].split(".")[0]  # "mul" of aten::mul.Tensor
        self.resolves_bits = (self.lowering is not None and self.name not in _NOT_DIRECT and not _is_view(op)
                              and not base.startswith(("_copy_from", "empty")) and not base.endswith("_like")
                              and any(_fallthrough(self.name, k) for k in ("Conjugate", "Negative")))
        self.written = {a.name for a in self.args_schema if a.alias_info is not None and a.alias_info.is_write}
        # The C fast path (_C.fast_call) serves plain calls whose output specs
        # are in meta_cache; it returns NotImplemented for anything else.
        self.plan = None
        if (self.lowering is not None and not self.is_out and not self.index_lists and not self.mutated_idx
                and self.all_functional and not self.linalg and len(self.args_schema) <= 24):
            self.plan = (self.lowering, tuple(self.defaults), bytes(self.number_is_scalar),
                         self.numbers_by_value, self.meta_cache, CODE, torch.empty_strided, _DEVICES,
                         self.is_inplace, torch._C.TensorBase, torch.dtype, self.name)

    def _after(self, vals, outs):
        """linalg *_ex ops with check_errors=True raise like PyTorch's CPU
        kernels do when their `info` output (the last one) reports a failure
        (this reads info back to the host); then _POST fix-ups."""
        if self.check_errors is not None:
            api, i = self.check_errors
            if vals[i]:
                torch._linalg_check_errors(outs[-1], api, is_matrix=vals[0].dim() == 2)
        if self.post is not None:
            self.post(vals, outs)

    def _functional_for_out(self):
        """The functional overload an out= overload computes, if it has a lowering."""
        ns, rest = self.name.split("::")
        fname = rest.split(".")[0]
        in_args = [a for a in self.args_schema if not a.is_out]
        in_names = [a.name for a in in_args]
        packet = getattr(getattr(torch.ops, ns), fname, None)
        if packet is None:
            return None, in_args
        for ovl in packet.overloads():
            cand = getattr(packet, ovl)
            cs = cand._schema
            if any(a.is_out for a in cs.arguments):
                continue
            if [a.name for a in cs.arguments] == in_names:
                q = _qualname(cand)
                if _C.has_lowering(q):
                    return q, in_args
        return None, in_args

    def functional_op(self):
        """The functional OpOverload an out= overload computes (None if none)."""
        if not hasattr(self, "_functional_op"):
            self._functional_op = None
            ns, rest = self.name.split("::")
            packet = getattr(getattr(torch.ops, ns), rest.split(".")[0], None)
            in_names = [a.name for a in self.args_schema if not a.is_out]
            for ovl in (packet.overloads() if packet is not None else []):
                cand = getattr(packet, ovl)
                cs = cand._schema.arguments
                if not any(a.is_out for a in cs) and [a.name for a in cs] == in_names:
                    self._functional_op = cand
                    break
        return self._functional_op

    def functional_call(self, args, kwargs, fop):
        """(args, kwargs) of an out= call, without the outs, for `fop`."""
        vals = self._values(args, kwargs, self.all_args)
        fvals = [vals[i] for i, a in enumerate(self.args_schema) if not a.is_out]
        fargs, fkwargs = [], {}
        for a, v in zip(fop._schema.arguments, fvals):
            if a.kwarg_only:
                fkwargs[a.name] = v
            else:
                fargs.append(v)
        return tuple(fargs), fkwargs

    def _values(self, args, kwargs, schema_args):
        if not kwargs and schema_args is self.args_schema:
            # Positional arguments never fill keyword-only slots.
            return list(args) + self.defaults[len(args):]
        vals = []
        for i, a in enumerate(schema_args):
            if i < len(args) and not a.kwarg_only:
                vals.append(args[i])
            elif a.name in kwargs:
                vals.append(kwargs[a.name])
            elif a.has_default_value():
                vals.append(a.default_value)
            else:
                vals.append(None)
        return vals

    def _encode_and_key(self, vals):
        """Encode argument values for the C core, and build the meta-cache key:
        everything PyTorch's meta function looks at (shapes, strides, dtypes;
        Python numbers by type, except for ops whose output shape depends on
        a number's value).  This is the eager hot path: keep it lean."""
        device = None
        enc = []
        key = []
        by_value = self.numbers_by_value
        for v, num in zip(vals, self.number_is_scalar):
            if isinstance(v, torch.Tensor):
                shape, stride, dt = v.shape, v.stride(), v.dtype
                if v.is_cpu:
                    if v.dim() != 0:
                        raise RuntimeError(
                            f"Expected all tensors to be on the same device, but found at least two devices, "
                            f"tpu:{device or 0} and cpu!")
                    # A Python number wrapped by the arg parser, or a CPU
                    # scalar tensor (which PyTorch allows next to device tensors).
                    enc.append(("S", CODE[dt], v.item(), dt in _WRAPPED_DTYPES))
                    key.append((shape, dt, 0))
                    continue
                idx = v.device.index
                if device is None:
                    device = idx
                elif idx != device:
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"tpu:{device} and {v.device}!")
                off = v.storage_offset()
                ptr = v.data_ptr() - off * v.element_size() if v.numel() else v.untyped_storage().data_ptr()
                enc.append(("T", ptr, CODE[dt], shape, stride, off))
                key.append((shape, stride, dt))
            elif num and type(v) in (int, float, bool, complex):
                enc.append(("S", _scalar_code(v), v, True))
                key.append(v if by_value else type(v))
            elif isinstance(v, (list, tuple)):
                if device is None:
                    for x in v:
                        if isinstance(x, torch.Tensor) and not x.is_cpu:
                            device = x.device.index
                            break
                enc.append(_encode(v, device if device is not None else 0))
                key.append(tuple((x.shape, x.stride(), x.dtype, x.is_cpu) if isinstance(x, torch.Tensor) else x
                                 for x in v))
            else:
                enc.append(_encode(v, 0))
                key.append(v)
        return (device if device is not None else 0), enc, tuple(key)

    def _meta(self, args, kwargs):
        self._check_args(args, kwargs)
        py_meta = _PY_META.get(self.name) or (_PY_META.get(self.lowering) if self.is_out else None)
        try:
            if py_meta is not None:
                if self.is_out:  # the functional arguments only
                    vals = self._values(args, kwargs, self.all_args)
                    args, kwargs = [vals[i] for i in self.functional_idx], {}
                meta_out = _without_cuda_alerts(py_meta, tree_map(_to_meta, args), tree_map(_to_meta, kwargs))
            else:
                meta_out = _without_cuda_alerts(self.op, tree_map(_to_meta, args), tree_map(_to_meta, kwargs))
        except RuntimeError as e:
            msg = str(e)
            if "Expected a value of type 'Tensor'" in msg:
                # A Python number where the schema says Tensor (the dispatcher
                # passes it unwrapped to boxed kernels): wrap it.
                args, kwargs = self._wrap_numbers(args, kwargs)
                return self._meta(args, kwargs)
            if "Attempting to broadcast a dimension" in msg and torch.Tag.pointwise in self.op.tags:
                _raise_broadcast(args, kwargs)
            # Some meta functions refuse a CPU scalar tensor next to meta
            # tensors ("... on cpu", masked_fill's "Expected `value` to be on
            # same device as `a`"); retry with those on meta as well.
            if "cpu" not in msg and "same device" not in msg:
                raise
            meta_out = self.op(*tree_map(_to_meta_all, args), **tree_map(_to_meta_all, kwargs))
        multi = isinstance(meta_out, (tuple, list))
        metas = meta_out if multi else (meta_out,)
        specs = tuple(None if m is None else (m.shape, m.stride(), m.dtype) for m in metas)
        return (multi, specs)

    def _check_args(self, args, kwargs):
        """Rules PyTorch's CPU kernels enforce and its meta functions do not
        (checked once per argument signature, with the CPU's messages): an
        in-place op's result must cast to self's dtype (int64.mul_(2.5)), the
        index ops take a source of self's dtype, and reductions without an
        identity refuse an empty reduced dim."""
        base = self.base
        vals = self._values(args, kwargs, self.all_args)
        names = [a.name for a in self.args_schema]
        dst = vals[0] if vals else None
        if base in _NEEDS_NONEMPTY and isinstance(dst, torch.Tensor) and dst.numel() == 0:
            _check_nonempty(base, vals, names)
        if base in ("argmax", "argmin") and getattr(dst, "dtype", None) == torch.bool:
            raise RuntimeError(f"{base}(): does not support bool input")
        if base == "multinomial" and vals[1] <= 0:
            raise RuntimeError("cannot sample n_sample <= 0 samples")
        check = _CPU_CHECKS.get(base.rstrip("_"))
        if check is not None:
            check(dict(zip(names, vals)))
        same = _SAME_DTYPE.get(base.rstrip("_"))
        if same is not None and same[0] in names:
            src = vals[names.index(same[0])]
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.dtype != dst.dtype:
                raise RuntimeError(same[1].format(self=_LEGACY_TYPE.get(dst.dtype, dst.dtype),
                                                  source=_LEGACY_TYPE.get(src.dtype, src.dtype)))
        if not self.is_inplace or not isinstance(dst, torch.Tensor):
            return
        fop = self.inplace_functional()
        if fop is None:
            return
        try:
            fout = fop(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
        except Exception:
            return  # the in-place meta function accepted it: nothing to compare
        if isinstance(fout, torch.Tensor) and not torch.can_cast(fout.dtype, dst.dtype):
            raise RuntimeError(f"result type {_LEGACY_TYPE.get(fout.dtype, fout.dtype)} can't be cast to the "
                               f"desired output type {_LEGACY_TYPE.get(dst.dtype, dst.dtype)}")

    def inplace_functional(self):
        """The functional OpOverload of an in-place one (mul_.Tensor ->
        mul.Tensor).  None for views: transpose_ and friends change metadata,
        not data, and never borrow a view op's rule."""
        if not hasattr(self, "_inplace_functional"):
            ns, rest = self.name.split("::")
            fname, _, ovl = rest.partition(".")
            packet = getattr(getattr(torch.ops, ns), fname[:-1], None)
            fop = getattr(packet, ovl or "default", None) if packet is not None else None
            self._inplace_functional = fop if fop is not None and not _is_view(fop) else None
        return self._inplace_functional

    def _fix_indices(self, args, kwargs, masks_to_indices):
        """Index lists: CPU index tensors go to the device (as on CUDA), and
        bool/uint8 masks become long indices (nonzero runs on the host)."""
        args = list(args)
        for i in self.index_lists:
            a = self.args_schema[i]
            in_args = i < len(args) and not a.kwarg_only
            lst = args[i] if in_args else kwargs.get(a.name)
            if not lst:
                continue
            dev = next((t.device for t in list(args) + list(kwargs.values())
                        if isinstance(t, torch.Tensor) and t.device.type == "tpu"), None)
            new, pos = [], 0  # pos: the dim of self the entry indexes
            for t in lst:
                if isinstance(t, torch.Tensor):
                    if t.dtype == torch.uint8:
                        _warn_uint8_index()
                    if args and isinstance(args[0], torch.Tensor):
                        _check_host_index(args[0], t, pos, sum(isinstance(u, torch.Tensor) for u in new))
                    if t.device.type != "tpu" and dev is not None:
                        t = t.to(dev)
                    if masks_to_indices and t.dtype in (torch.bool, torch.uint8):
                        _check_mask(args[0], t, pos)
                        nz = torch.nonzero(t)
                        new.extend(nz.select(1, j) for j in range(t.dim()))
                        pos += t.dim()
                        continue
                new.append(t)
                pos += 1
            if in_args:
                args[i] = new
            else:
                kwargs = dict(kwargs, **{a.name: new})
        return tuple(args), kwargs

    def _wrap_numbers(self, args, kwargs):
        def wrap(v):
            if isinstance(v, bool):
                return torch.tensor(v)
            if isinstance(v, int):
                return torch.tensor(v, dtype=torch.int64)
            if isinstance(v, float):
                return torch.tensor(v, dtype=torch.get_default_dtype())
            return v

        args = list(args)
        for i, a in enumerate(self.args_schema):
            if str(a.type) != "Tensor":
                continue
            if i < len(args) and not a.kwarg_only:
                args[i] = wrap(args[i])
            elif a.name in kwargs:
                kwargs = dict(kwargs, **{a.name: wrap(kwargs[a.name])})
        return tuple(args), kwargs

    def _resolve_bits(self, args, kwargs):
        def resolve(a, v):
            if isinstance(v, (list, tuple)):
                return type(v)(resolve(a, x) for x in v)
            if not isinstance(v, torch.Tensor) or not (v.is_conj() or v.is_neg()):
                return v
            if a.name in self.written:
                raise NotImplementedError(
                    f"{self.name}: writing into a conjugate or negative view is not supported on the tpu "
                    f"device yet (torch-pjrt); call .resolve_conj() / .resolve_neg() on '{a.name}' first")
            return v.resolve_conj().resolve_neg()

        schema = self.args_schema
        args = tuple(resolve(schema[i], v) if i < len(schema) else v for i, v in enumerate(args))
        by_name = {a.name: a for a in schema}
        kwargs = {k: resolve(by_name[k], v) if k in by_name else v for k, v in kwargs.items()}
        return args, kwargs

    def has_bits(self, args, kwargs):
        """Whether a tensor argument is a conjugate or negative view this op
        would see unresolved."""
        if not self.resolves_bits:
            return False
        for v in list(args) + list(kwargs.values()):
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(t, torch.Tensor) and (t.is_conj() or t.is_neg()):
                    return True
        return False

    def _generator(self, vals):
        if self.generator_idx is None or self.generator_idx >= len(vals):
            return None
        g = vals[self.generator_idx]
        if g is None:
            return None
        if g.device.type != "tpu":
            raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{g.device.type}'")
        # A tpu generator given to a CPU op (its dispatch keys sent it here).
        ts = [v for v in vals if isinstance(v, torch.Tensor)]
        if ts and not any(v.device.type == "tpu" for v in ts):
            raise RuntimeError("Expected a 'cpu' device type for generator but found 'tpu'")
        return g

    def _run(self, enc, refs, gen):
        """Run the lowering.  With a generator argument, random ops draw from
        its own (seed, counter) state, which then advances (a user-created
        generator is independent of the device's default one, as on CPU and
        CUDA)."""
        if gen is None:
            _C.run(self.lowering, enc, None, refs)
        else:
            gen.set_offset(_C.run(self.lowering, enc, None, refs, (gen.initial_seed(), gen.get_offset())))

    def __call__(self, args, kwargs):
        _sync_default_dtype()
        if self.resolves_bits:
            args, kwargs = self._resolve_bits(args, kwargs)
        if self.index_lists:
            # index_put rules handle a bool mask themselves (static shapes).
            args, kwargs = self._fix_indices(args, kwargs, "index_put" not in self.name)
            if "index_put" in self.name:
                _check_mask_put(args, kwargs)
        vals = self._values(args, kwargs, self.all_args)
        gen = self._generator(vals)
        device, enc_all, key = self._encode_and_key(vals)
        spec = self.meta_cache.get(key)
        if spec is None:
            spec = self._meta(args, kwargs)
            fix = _SPEC_FIX.get(self.name)
            if fix is not None:
                spec = (spec[0], fix(vals, spec[1]))
            if len(self.meta_cache) > 4096:
                self.meta_cache.clear()
            self.meta_cache[key] = spec
        multi, specs = spec
        if self.swap and _factors_transpose(vals[0]):
            # PyTorch's CPU kernel factors A^T here (no copy for a row-major A),
            # and its LU / pivots outputs (and their backward) say so.
            vals = [vals[0].mT] + list(vals[1:])
            device, enc_all, _ = self._encode_and_key(vals)
        enc = tuple(enc_all) if self.all_functional else tuple(enc_all[i] for i in self.functional_idx)
        if self.is_out:
            outs = [vals[i] for i in self.out_idx]
            for o, m in zip(outs, specs):
                if m is not None and o.shape != m[0]:
                    o.resize_(m[0])
            self._run(enc, tuple(_ref(o) for o in outs), gen)
            if self.linalg:
                self._after(vals, outs)
            return outs[0] if len(outs) == 1 else tuple(outs)
        if self.is_inplace:
            self_t = vals[0]
            self._run(enc, (_ref(self_t),), gen)
            return self_t
        dev = _DEVICES.get(device) or _DEVICES.setdefault(device, torch.device("tpu", device))
        outs = [None if m is None else torch.empty_strided(m[0], m[1], dtype=m[2], device=dev) for m in specs]
        # Backward ops with an output_mask leave some outputs undefined (None):
        # the rule receives only the defined ones, in order.
        refs = [_ref(o) for o in outs if o is not None]
        refs += [_ref(vals[i]) for i in self.mutated_idx if isinstance(vals[i], torch.Tensor)]
        self._run(enc, tuple(refs), gen)
        if self.linalg:
            self._after(vals, outs)
        if not outs:
            return None  # "-> ()": only mutated arguments
        if multi:
            return tuple(outs)
        return outs[0]


def _without_cuda_alerts(fn, args, kwargs):
    """fn(*args, **kwargs) (a meta function) with the deterministic-algorithms
    alerts off: PyTorch's meta functions take a meta tensor for a CUDA one
    (device_hint) and raise CUDA's alerts ("median CUDA with indices output
    does not have a deterministic implementation") where the CPU runs; the
    programs these ops lower to are deterministic."""
    if not torch.are_deterministic_algorithms_enabled():
        return fn(*args, **kwargs)
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


_handlers = {}
_DEVICES = {}  # index -> torch.device("tpu", index)
_default_dtype = [torch.float32]  # the one the cached output specs hold for


def _sync_default_dtype():
    """Output specs depend on torch.get_default_dtype() (an int tensor times
    1.5 is of that dtype), which no cache key holds: after a change, start the
    handlers' caches and the core's table (the C++ kernels') over."""
    dt = torch.get_default_dtype()
    if dt is not _default_dtype[0]:
        _default_dtype[0] = dt
        for h in _handlers.values():
            h.meta_cache.clear()
        _C.specs_context(CODE[dt])


def _handler(op):
    h = _handlers.get(op)
    if h is None:
        h = _handlers[op] = _Handler(op)
    return h


# --------------------------------------------------------------------------
# CPU fallback


def _to_cpu(v):
    return v.cpu() if _is_tpu(v) else v


def _run_on_cpu(op, args, kwargs, count=True):
    name = _qualname(op)
    if count:
        with _fallback_lock:
            _fallback_counts[name] = _fallback_counts.get(name, 0) + 1
    device = _device_of(args, kwargs)
    dev = torch.device("tpu", device if device is not None else 0)
    cargs = tree_map(_to_cpu, args)
    ckwargs = tree_map(_to_cpu, kwargs)
    res = op(*cargs, **ckwargs)
    # Write back every argument the op mutates (self for in-place, out=).
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            orig = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
            new = cargs[i] if i < len(args) and not a.kwarg_only else ckwargs.get(a.name)
            if _is_tpu(orig):
                if orig.shape != new.shape:
                    orig.resize_(new.shape)
                orig.copy_(new)
            elif isinstance(orig, (list, tuple)):
                for o, nw in zip(orig, new):
                    if _is_tpu(o):
                        o.copy_(nw)

    def back(r):
        if isinstance(r, torch.Tensor):
            # Returned aliases of mutated arguments are the originals.
            for i, a in enumerate(op._schema.arguments):
                src = cargs[i] if i < len(cargs) else ckwargs.get(a.name)
                if src is r:
                    return args[i] if i < len(args) else kwargs.get(a.name)
            for key, v in ckwargs.items():
                if v is r:
                    return kwargs[key]
            return r.to(dev)
        return r

    return tree_map(back, res)


def _host_sampler(name):
    """Samplers PyTorch writes as per-element rejection loops (gamma, and
    Dirichlet, Poisson, binomial built on it), run on the host: a CPU
    generator seeded by one draw from the tpu generator (the device's, or the
    one passed), so torch.manual_seed and tpu Generators make them
    reproducible.  Counted with the CPU fallbacks."""
    base, _, ovl = name.split("::")[1].partition(".")
    op = getattr(getattr(torch.ops.aten, base), ovl or "default")
    gi = next(i for i, a in enumerate(op._schema.arguments) if a.name == "generator")

    def sample(*args, **kwargs):
        args = list(args)
        gen = args.pop(gi) if gi < len(args) else kwargs.pop("generator", None)
        if gen is not None and gen.device.type != "tpu":
            raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{gen.device.type}'")
        device = _device_of(args, kwargs)
        seed = torch.randint(0, 1 << 62, (1,), device=torch.device("tpu", device or 0), generator=gen).item()
        cpu_gen = torch.Generator().manual_seed(seed)
        return _run_on_cpu(op, tuple(args[:gi]) + (cpu_gen,) + tuple(args[gi:]), kwargs)

    return sample


_HOST_SAMPLERS = {n: _host_sampler(n) for n in
                  ("aten::_standard_gamma", "aten::_sample_dirichlet", "aten::poisson", "aten::binomial")}


# Tensor layouts other than strided have their own dispatch keys; without a
# kernel there PyTorch's error would name "Sparsetpu" and its build process.
_LAYOUT_KEYS = {  # dispatch key: (layout, the way out)
    "SparsePrivateUse1": ("sparse COO", "call .to_dense() first, or keep it on the CPU (nn.Embedding and "
                          "nn.EmbeddingBag: sparse=False)"),
    "SparseCsrPrivateUse1": ("sparse compressed (CSR/CSC/BSR/BSC)", "call .to_dense() first, or keep it on the CPU"),
    "NestedTensorPrivateUse1": ("nested", "pad it into a dense tensor first (torch.nested.to_padded_tensor on "
                                "the CPU) and pass a mask"),
    "QuantizedPrivateUse1": ("quantized", "call .dequantize() first, or keep it on the CPU"),
}


def _layout_error(layout, hint, name):
    return NotImplementedError(
        f"{layout} tensors are not supported on the tpu device (in '{name}'): torch-pjrt "
        f"holds dense (strided) tensors only; {hint}.")


def _layout_fallback(layout, hint):
    def refuse(op, *args, **kwargs):
        raise _layout_error(layout, hint, _qualname(op))
    return refuse


def _unsupported(op):
    name = _qualname(op)
    if name.startswith(("aten::_to_sparse", "aten::to_sparse")):  # dense -> sparse: the layout's error
        return _layout_error(*_LAYOUT_KEYS["SparsePrivateUse1"], name)
    return NotImplementedError(
        f"The operator '{name}' is not currently implemented for the tpu device (torch-pjrt has no "
        f"lowering for it). To run it on the CPU instead, at a cost in speed, set the environment "
        f"variable TORCH_PJRT_CPU_FALLBACK=1 or call torch_pjrt.set_cpu_fallback(True)."
    )


# --------------------------------------------------------------------------
# The fallback itself

_decomp_table = None


def _decomposition(op):
    global _decomp_table
    if _decomp_table is None:
        from torch._decomp import decomposition_table

        _decomp_table = decomposition_table
    return _decomp_table.get(op)


def _into_outs(h, args, kwargs, res):
    """An out= overload's decomposition must leave its results in the out
    tensors; some return new tensors instead (those that compute f16/bf16 in
    float32, like reflection_pad1d.out): copy them in."""
    vals = h._values(args, kwargs, h.all_args)
    outs = [vals[i] for i in h.out_idx]
    got = list(res) if isinstance(res, (tuple, list)) else [res]
    if len(got) != len(outs):
        return res
    for o, r in zip(outs, got):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and r is not o:
            if o.shape != r.shape:
                o.resize_(r.shape)
            o.copy_(r)
    return outs[0] if len(outs) == 1 else tuple(outs)


# PyTorch decompositions whose results differ from PyTorch's CPU kernels:
# never used (the op is unsupported instead of silently wrong).
# multilabel_margin_loss_forward: targets after the first -1 in a row count.
_WRONG_DECOMPOSITIONS = {"aten::multilabel_margin_loss_forward"}


def _fallback(op, *args, **kwargs):
    h = _handler(op)
    if h.lowering is not None:
        return h(args, kwargs)
    name = h.name
    if name in _HOST_OPS:
        return _run_on_cpu(op, args, kwargs)
    special = _SPECIAL.get(name)
    if special is not None:
        return special(*args, **kwargs)
    if h.is_out:  # the out= form of an op with a device kernel
        fop = h.functional_op()
        special = _SPECIAL.get(_qualname(fop)) if fop is not None else None
        if special is not None:
            call_args, call_kwargs = h.functional_call(args, kwargs, fop)
            return _into_outs(h, args, kwargs, special(*call_args, **call_kwargs))
    if h.is_inplace:
        h._check_args(args, kwargs)
    refusal = _NO_COMPLEX.get(h.base.rstrip("_"))
    if refusal is not None:
        z = next((t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor) and t.is_complex()), None)
        if z is not None:
            raise refusal[0](refusal[1].format(_LEGACY_TYPE[z.dtype]))
    depth = getattr(_state, "decomp_depth", 0)
    decomp = _decomposition(op) if depth < 8 and name not in _WRONG_DECOMPOSITIONS else None
    call_args, call_kwargs = args, kwargs
    if h.is_out and depth < 8:
        # An out= overload runs its functional form's decomposition, whose
        # results go into the out tensors: some out= decompositions do not
        # take the out argument's name (reflection_pad1d_backward.grad_input)
        # or return new tensors instead of writing the outs.
        fop = h.functional_op()
        fdecomp = _decomposition(fop) if fop is not None else None
        if fdecomp is not None:
            decomp = fdecomp
            call_args, call_kwargs = h.functional_call(args, kwargs, fop)
    if decomp is not None:
        _state.decomp_depth = depth + 1
        try:
            res = decomp(*call_args, **call_kwargs)
        except NotImplementedError:
            if not _cpu_fallback:
                raise
            res = NotImplemented
        finally:
            _state.decomp_depth = depth
        # Some decompositions cover only some cases and return NotImplemented
        # for the others (adaptive_max_pool2d with uneven windows).
        if res is not NotImplemented:
            return _into_outs(h, args, kwargs, res) if h.is_out else res
    if _cpu_fallback:
        return _run_on_cpu(op, args, kwargs)
    raise _unsupported(op)


# --------------------------------------------------------------------------
# Ops implemented here because they move data between host and device or
# return Python values.


def _resolved(src):
    """A tpu tensor with its lazy conjugate/negative bits applied (a plain
    tensor; _ref reads the raw storage and ignores the bits)."""
    for bit, op in ((src.is_conj(), "aten::conj_physical"), (src.is_neg(), "aten::neg")):
        if bit:
            tmp = torch.empty(src.shape, dtype=src.dtype, device=src.device)
            _C.run(op, (_ref(src),), None, (_ref(tmp),))
            src = tmp
    return src


def _copy_complex32(src, dst):
    """Copies from or to complex32 (no PJRT buffer type): through the
    float16 (re, im) pairs that view_as_real sees, which every device holds."""
    with torch.no_grad():
        if dst.dtype == torch.complex32:
            dr = torch.view_as_real(dst)
            if src.is_complex():
                sr = torch.view_as_real(src.resolve_conj().resolve_neg() if src.device.type == "cpu" else src)
                dr.copy_(sr.expand(dr.shape))
            else:
                dr.select(-1, 0).copy_(src)
                dr.select(-1, 1).zero_()
            if src.is_complex() and src.is_conj():
                dr.select(-1, 1).neg_()
            return dst
        sr = torch.view_as_real(src)
        if dst.is_complex():
            torch.view_as_real(dst).copy_(sr)
            if src.is_conj():
                dst.imag.neg_()
        else:
            dst.copy_(sr.select(-1, 0))  # the real part, as copy_ does
        return dst


def _copy_from(src, dst, non_blocking=False):
    if dst.numel() == 0:
        return dst
    if dst.is_conj() or dst.is_neg():
        # dst's storage holds conj(value) / -value (in-place ops on such views
        # end in this copy_): store src that way, through the plain view.
        plain, val = dst, src
        if dst.is_conj():
            plain, val = plain.conj(), val.conj()
        if dst.is_neg():
            plain, val = torch._neg_view(plain), torch._neg_view(val)
        _copy_from(val, plain, non_blocking)
        return dst
    if torch.complex32 in (src.dtype, dst.dtype):
        return _copy_complex32(src, dst)
    if src.device.type == "tpu" and (src.is_conj() or src.is_neg()):
        src = _resolved(src)
    if src.device.type == "tpu" and dst.device.type == "tpu":
        if src.device == dst.device:
            _C.run("tp::copy", (_ref(src),), None, (_ref(dst),))
            return dst
        return dst.copy_(src.cpu())
    if dst.device.type == "tpu":  # host -> device
        host = src.to(dtype=dst.dtype).expand(dst.shape).contiguous()
        host = host.resolve_conj().resolve_neg()
        _C.write_host(_ref(dst), host.data_ptr())
        return dst
    # device -> host
    if dst.dtype == src.dtype and dst.shape == src.shape and dst.is_contiguous() and dst.device.type == "cpu":
        _C.read_host(_ref(src), dst.data_ptr())
        return dst
    tmp = torch.empty(src.shape, dtype=src.dtype)
    _C.read_host(_ref(src), tmp.data_ptr())
    return dst.copy_(tmp)


def _copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return _copy_from(src, dst)


def _local_scalar_dense(t):
    tmp = torch.empty((), dtype=t.dtype)
    _C.read_host(_ref(t), tmp.data_ptr())
    return tmp.item()


def _equal(a, b):
    if a.shape != b.shape:
        return False
    return bool(torch.eq(a, b).all().item())


def _is_set_to(a, b):
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _cholesky(self, upper=False):
    # The deprecated torch.cholesky raises on a non positive-definite input.
    L, info = torch.ops.aten.linalg_cholesky_ex.default(self, upper=upper)
    torch._linalg_check_errors(info, "cholesky", is_matrix=self.dim() == 2)
    return L


_SPECIAL = {
    **_composite.KERNELS,
    **_HOST_SAMPLERS,
    "aten::cholesky": _cholesky,
    "aten::_fused_sdp_choice": _attention.fused_sdp_choice,
    "aten::_copy_from": _copy_from,
    "aten::_copy_from_and_resize": _copy_from_and_resize,
    "aten::_local_scalar_dense": _local_scalar_dense,
    "aten::equal": _equal,
    "aten::is_set_to": _is_set_to,
}


# Ops with a CompositeExplicitAutograd kernel (so they never reach the
# fallback by themselves) that we lower directly: convolution's composite
# kernel ends in convolution_overrideable, which has no implementation; the
# others decompose into many small ops.  Their autograd formulas are separate,
# so a backend kernel is safe.
_DIRECT = [
    "convolution", "convolution_backward", "native_layer_norm", "native_group_norm",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "stack", "constant_pad_nd", "repeat", "embedding", "index_put",
]


def install():
    """Register the fallback (once per process)."""
    global _fallback_lib, _impl_lib
    if _fallback_lib is not None:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_fallback, "PrivateUse1")
    for key, (layout, hint) in _LAYOUT_KEYS.items():
        lib.fallback(_layout_fallback(layout, hint), key)
    _fallback_lib = lib
    impl = torch.library.Library("aten", "IMPL")
    for op in _direct_ops():
        h = _handler(op)
        if h.plan is None:
            impl.impl(op, functools.partial(_fallback, op), "PrivateUse1")
        else:
            # The C++ kernel (csrc/glue/fast.cpp) serves calls whose output
            # specs the core has recorded; it hands the rest to this one.
            impl.impl(op, _kernel(h), "PrivateUse2")
            if not _register_fast(h):
                impl.impl(op, _kernel(h), "PrivateUse1")
    # Copies onto the device also run while a dispatch mode is active yet
    # their tensors are real: torch.tensor(data, device="tpu") inside
    # torch.compile copies its data under FakeTensorMode.  PyTorch then routes
    # a Python kernel through the mode's interpreter, which finds per-op
    # registrations only (a boxed fallback is not one: an internal assert),
    # so these copies get their own registration.
    # _copy_from between tpu tensors is the C++ CopyKernel's (fast.cpp); it
    # hands every other copy to this kernel, under PrivateUse2.
    impl.impl("_copy_from", functools.partial(_fallback, torch.ops.aten._copy_from.default), "PrivateUse2")
    _register_copy()
    impl.impl("_copy_from_and_resize", functools.partial(_fallback, torch.ops.aten._copy_from_and_resize.default),
              "PrivateUse1")
    # Factories whose CompositeExplicitAutograd kernel ends in a DispatchStub
    # that has only CPU/CUDA kernels (an internal assert for tpu): _composite's.
    for name in ("kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"):
        impl.impl(name, _composite.KERNELS["aten::kaiser_window.beta"], "PrivateUse1")
    for name, fn in _attention.KERNELS.items():  # the fused SDPA backend
        impl.impl(name.split("::")[1], fn, "PrivateUse1")
    # copy_ hands a conjugate/negative view to _copy_from unresolved; the
    # generic Conjugate/Negative fallback would resolve it with clone, which
    # copies through _copy_from again, without end (a stack overflow, as in
    # torch.fft.hfft).  _copy_from applies the bits itself.
    for key in ("Conjugate", "Negative"):
        for name in ("_copy_from", "_copy_from_and_resize"):
            impl.impl(name, torch.library.fallthrough_kernel, key)
    from ._composite import AUTOGRAD

    for name, fn in AUTOGRAD.items():  # derivatives in float64, ops kept whole in graphs (see _composite)
        impl.impl(name, fn, "AutogradPrivateUse1")
    _impl_lib = impl
    if os.environ.get("TORCH_PJRT_FAST_KERNELS", "1") == "0":
        fast_kernels(False)
    _accelerator_policies()
    _print_from_host()


def _accelerator_policies():
    """PyTorch code that picks an algorithm by device type and knows only
    "cpu" and "cuda" treats "tpu" as a device without mixed precision: the
    chunked F.linear_cross_entropy then accumulates float16/bfloat16 logits
    in their own dtype (6% off on small losses).  TPUs multiply bfloat16 with
    float32 accumulation, as the XLA CPU backend does, so "tpu" gets float32
    accumulation, and the CPU's "accurate" policy (float32 logits chunks; the
    chunks are small, so the memory it costs is too)."""
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
        from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions as opts
    except ImportError:  # an older torch without the chunked path
        return
    for dt in (torch.float16, torch.bfloat16):
        if ("cpu", dt) in getattr(lce, "_AUTO_DEFAULTS", {}):
            lce._AUTO_DEFAULTS.setdefault(("tpu", dt), lce._AUTO_DEFAULTS[("cpu", dt)])
    resolve = opts._resolve_auto_acc_dtype

    def resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == "tpu" and dtype in (torch.float16, torch.bfloat16):
            return torch.float32
        return resolve(dtype, device)

    if getattr(resolve, "__name__", "") != "resolve_auto_acc_dtype":
        opts._resolve_auto_acc_dtype = staticmethod(resolve_auto_acc_dtype)


def _print_from_host():
    """PyTorch formats a tensor's values one `.item()` at a time: on "tpu"
    each is a device-to-host read (a 4x256 tensor, 1024 reads, ~100 ms).
    On "tpu" the values repr shows come to the host in one copy instead: a
    tensor printed in full (at most PRINT_OPTS.threshold values) whole, a
    summarised one as a sketch that keeps, in each dim longer than
    2*edgeitems, its edge items and one middle item (which PyTorch's
    summary drops), so PyTorch's own formatter prints the same text.
    torchao formats a tensor on every int8 matmul (`"FakeTensor" in
    input.__repr__()`, torchao/kernel/intmm.py)."""
    from torch import _tensor_str as ts

    tensor_str = ts._tensor_str
    if getattr(tensor_str, "_tp_host", False):
        return

    def _tensor_str(self, indent):
        if self.device.type != "tpu" or self.numel() == 0:
            return tensor_str(self, indent)
        if self.numel() <= ts.PRINT_OPTS.threshold:
            return tensor_str(self.cpu(), indent)
        if self.dtype.is_complex or self.dtype.itemsize == 1 and self.dtype.is_floating_point or self.is_neg():
            return tensor_str(self, indent)  # PyTorch's own steps for these, read value by value
        e = ts.PRINT_OPTS.edgeitems
        sketch = self
        for d, n in enumerate(self.shape):
            if n > 2 * e:
                keep = torch.tensor([*range(e + 1), *range(n - e, n)], device=self.device)
                sketch = sketch.index_select(d, keep)
        sketch = sketch.cpu()
        return ts._tensor_str_with_formatter(sketch, indent, True, ts._Formatter(ts.get_summarized_data(sketch)))

    _tensor_str._tp_host = True
    ts._tensor_str = _tensor_str


def _kernel(h):
    """The Python kernel of an op the C++ fast kernel serves: the C fast path
    (_C.fast_call, which records the output specs for the C++ kernel) when
    the specs are cached, else the handler."""
    plan = h.plan
    names = [a.name for a in h.args_schema]

    def kernel(*args, **kwargs):
        _sync_default_dtype()
        if h.has_bits(args, kwargs):  # _C.fast_call does not look at the bits
            return h(args, kwargs)
        flat = args
        if kwargs and kwargs.keys() <= set(names[len(args):]):
            # keyword-only arguments: positional, as the C++ kernel sees them
            flat = args + tuple(kwargs.get(n, d) for n, d in zip(names[len(args):], h.defaults[len(args):]))
        if flat is not args or not kwargs:
            r = _C.fast_call(plan, flat)
            if r is not NotImplemented:
                return r
        return h(args, kwargs)

    return kernel


@functools.lru_cache(None)
def _glue():
    """_glue.so's C entry points (csrc/glue/fast.cpp)."""
    g = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_glue.so"))
    g.tp_glue_register_fast.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    g.tp_glue_set_fast.argtypes = [ctypes.c_int]
    g.tp_glue_register_copy.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return g


def fast_kernels(enabled):
    """Turn the C++ fast kernels on or off (TORCH_PJRT_FAST_KERNELS=0 starts
    with them off); returns whether they were on.  Off, every op call takes
    the Python kernel: slower, the same results."""
    return bool(_glue().tp_glue_set_fast(int(bool(enabled))))


def _register_fast(h):
    """Register the C++ fast kernel of h's op; False if the op is not one it
    serves (one returning a list of tensors, or nothing)."""
    err = ctypes.create_string_buffer(512)
    r = _glue().tp_glue_register_fast(h.name.encode(), h.lowering.encode(), bytes(h.number_is_scalar),
                                      len(h.args_schema), int(h.numbers_by_value), int(h.is_inplace), err, 512)
    if r < 0:
        raise RuntimeError(f"torch_pjrt: registering the fast kernel of {h.name}: {err.value.decode()}")
    return r == 0


def _register_copy():
    err = ctypes.create_string_buffer(512)
    if _glue().tp_glue_register_copy(err, 512) < 0:
        raise RuntimeError(f"torch_pjrt: registering the copy kernel: {err.value.decode()}")


def _direct_ops():
    """Ops to register as PrivateUse1 kernels that go straight to the
    fallback.  Without a kernel, a structured op's functional and in-place
    forms run PyTorch's generic wrapper, which allocates an empty output and
    calls the out= form: an extra dispatch and a resize per op.  Views,
    factories, ops PyTorch decomposes (CompositeImplicitAutograd) and ops the
    C++ glue implements are left alone."""
    ops = []

    def has(q, key):
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(q, key)
        except RuntimeError:
            return True  # not a registered overload: leave it alone

    for name in _C.lowering_names():
        if not name.startswith("aten::"):
            continue
        base, _, ovl = name[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is None or (ovl or "default") not in packet.overloads():
            continue
        if _is_view(getattr(packet, ovl or "default")):
            continue  # views (and their in-place forms, like transpose_) are metadata
        variants = [(base, ovl or "default")]
        if not base.endswith("_"):
            variants.append((base + "_", ovl or "default"))
        if base in _DIRECT:
            variants += [(base, o) for o in (packet.overloads() if packet else [])]
        for b, o in variants:
            pk = getattr(torch.ops.aten, b, None)
            if pk is None or o not in pk.overloads():
                continue
            op = getattr(pk, o)
            q = _qualname(op)
            sch = op._schema
            if has(q, "CompositeImplicitAutograd") or has(q, "PrivateUse1") or q in _NOT_DIRECT:
                continue
            if not any(str(a.type).startswith(("Tensor", "List[Tensor", "Optional[Tensor")) for a in sch.arguments):
                continue  # factories
            if _is_view(op):
                continue
            if op not in ops:
                ops.append(op)
    return ops


def _fallthrough(name, key):
    try:
        return torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(name, key)
    except RuntimeError:
        return False


def _is_view(op):
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


# Ops whose generic implementation must keep running (device transfers).
# _unsafe_view is a view without the schema's alias mark.  empty_like,
# zeros_like and ones_like: PyTorch's generic kernels allocate (the glue's
# empty_strided: no program, no Python) and fill with a fast kernel; their
# rules serve compiled graphs.
_NOT_DIRECT = {"aten::_to_copy", "aten::copy_", "aten::clone", "aten::lift_fresh_copy", "aten::detach",
               "aten::alias", "aten::_unsafe_view", "aten::_reshape_alias", "aten::empty_like",
               "aten::zeros_like", "aten::ones_like"}
