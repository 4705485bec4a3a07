"""The package once the runtime is open: the "tpu" device module, the op
kernels, the compiled-mode backend, the disk cache and the metrics.
torch_pjrt/__init__.py imports this only when the PJRT plugin and the glue
loaded; its public names are the package's."""
import os
import sys

import torch

from . import _C

__all__ = ["bucket", "compile_counts", "cpu_fallback_counts", "cpu_fallback_enabled", "default_cache_dir",
           "metrics", "metrics_report", "reset_cpu_fallback_counts", "set_cache_dir", "set_cpu_fallback"]
from . import device as _device_mod

torch._register_device_module("tpu", _device_mod)
sys.modules["torch.tpu.amp"] = _device_mod.amp  # `from torch.tpu.amp import GradScaler`, as for torch.cuda.amp
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
# torch.autocast("tpu") without a dtype: bfloat16, the TPU's native mixed
# precision (PyTorch's default for a PrivateUse1 device is float16).
if hasattr(torch, "set_autocast_dtype"):
    torch.set_autocast_dtype("tpu", torch.bfloat16)

from . import _dispatch

_dispatch.install()

from ._dispatch import (  # noqa: F401
    cpu_fallback_counts,
    cpu_fallback_enabled,
    reset_cpu_fallback_counts,
    set_cpu_fallback,
)


# ---- persistent compilation cache -----------------------------------------

_DEFAULT_CACHE_MB = 2048


def default_cache_dir():
    """TORCH_PJRT_CACHE_DIR if set ("" or "0" turn the cache off), else
    $XDG_CACHE_HOME/torch_pjrt, else ~/.cache/torch_pjrt."""
    env = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "0", "off", "false") else env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt")


def set_cache_dir(path, max_size_mb=None):
    """Move the on-disk cache of compiled programs to `path` (None: turn it off).
    Returns True if the cache is in use; a directory that cannot be used gives a
    warning and no cache, never an error."""
    if max_size_mb is None:
        max_size_mb = int(os.environ.get("TORCH_PJRT_CACHE_SIZE_MB", _DEFAULT_CACHE_MB))
    try:
        _C.set_disk_cache(path, int(max_size_mb) << 20)
    except RuntimeError as e:
        import warnings

        warnings.warn(f"torch-pjrt: compiled programs will not be cached on disk: {e}", stacklevel=2)
        _C.set_disk_cache(None, 0)
        return False
    return path is not None


set_cache_dir(default_cache_dir())


def metrics():
    """Counters of the runtime: programs compiled, cache hits, transfers, CPU
    fallbacks, and torch.compile graphs lowered to one program or run eagerly
    (op by op) because compiled mode cannot lower one of their ops."""
    m = dict(_C.stats())
    m.update(_compile.graph_counts())
    m["cpu_fallbacks"] = cpu_fallback_counts()
    err = _C.disk_cache_error()
    if err:
        import warnings

        warnings.warn(f"torch-pjrt disk cache: {err}", stacklevel=2)
    return m


def metrics_report() -> str:
    m = metrics()
    lines = [f"{k}: {v}" for k, v in m.items() if k != "cpu_fallbacks"]
    fb = m["cpu_fallbacks"]
    lines.append("cpu_fallbacks: " + (", ".join(f"{k}={v}" for k, v in sorted(fb.items())) or "none"))
    return "\n".join(lines)

from . import _compile

_compile.register()
_compile._route_default_backend()
_compile._hook_torch_compile()
_compile._register_rng_hops()
_compile._register_fake_kernels()
_compile._allow_flex_attention()
compile_counts = _compile.compile_counts
from .bucket import bucket  # noqa: F401
from . import _multiprocessing

_multiprocessing.install()
from . import _data_parallel

_data_parallel.install()
from . import distributed as _distributed

_distributed.install()
from . import _safetensors

_safetensors.install()
