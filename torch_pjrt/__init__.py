"""torch-pjrt: PyTorch on TPUs and any PJRT device, as the "tpu" device.

    import torch, torch_pjrt
    model = model.to("tpu")

Importing this package opens the PJRT plugin (TORCH_PJRT_PLUGIN, default:
the XLA CPU plugin), renames PyTorch's PrivateUse1 backend to "tpu",
registers torch.tpu and the op fallback that runs ops through the C core.
"""
import os

import torch

from . import _plugin

_ROOT = os.path.dirname(os.path.abspath(__file__))


def _load():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            f"torch-pjrt's C core is not built ({e}). Run `make build` in the repository."
        ) from e
    path = _plugin.plugin_path()
    if not os.path.exists(path):
        raise RuntimeError(
            f"torch-pjrt: the PJRT plugin {path} does not exist. Set TORCH_PJRT_PLUGIN to a PJRT "
            f"plugin (.so), or unset it to use the XLA CPU plugin (pip install xla-cpu-pjrt)."
        )
    try:
        _C.init(path, _plugin.cpu_device_count())
    except Exception as e:
        raise RuntimeError(
            f"torch-pjrt could not open the PJRT plugin {path}: {e}. Set TORCH_PJRT_PLUGIN to a "
            f"working PJRT plugin, or unset it to use the XLA CPU plugin (pip install xla-cpu-pjrt)."
        ) from None
    return _C


_C = _load()

if torch._C._get_privateuse1_backend_name() != "tpu":
    torch.utils.rename_privateuse1_backend("tpu")

if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "PrivateUse1"):
    torch.ops.load_library(os.path.join(_ROOT, "_glue.so"))

from . import device as _device_mod  # noqa: E402

torch._register_device_module("tpu", _device_mod)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

from . import _dispatch  # noqa: E402

_dispatch.install()

from ._dispatch import (  # noqa: E402,F401
    cpu_fallback_counts,
    cpu_fallback_enabled,
    reset_cpu_fallback_counts,
    set_cpu_fallback,
)


def metrics():
    """Counters of the runtime: programs compiled, cache hits, transfers, CPU fallbacks."""
    m = dict(_C.stats())
    m["cpu_fallbacks"] = cpu_fallback_counts()
    return m


def metrics_report() -> str:
    m = metrics()
    lines = [f"{k}: {v}" for k, v in m.items() if k != "cpu_fallbacks"]
    fb = m["cpu_fallbacks"]
    lines.append("cpu_fallbacks: " + (", ".join(f"{k}={v}" for k, v in sorted(fb.items())) or "none"))
    return "\n".join(lines)

from . import _compile  # noqa: E402

_compile.register()
compile_counts = _compile.compile_counts
from .bucket import bucket  # noqa: E402,F401
