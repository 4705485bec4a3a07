"""torch-pjrt: PyTorch on TPUs and any PJRT device, as the "tpu" device.

    import torch                     # installed, the package loads itself
    model = model.to("tpu")

PyTorch imports this package when it is imported (the `torch.backends`
entry point: device-backend autoload; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns
it off, and then `import torch_pjrt` does the same).  Importing it opens the
PJRT plugin (TORCH_PJRT_PLUGIN, default: the XLA CPU plugin), renames
PyTorch's PrivateUse1 backend to "tpu", registers torch.tpu and the op
fallback that runs ops through the C core (torch_pjrt/_api.py).

A plugin that is missing or does not open, or a native part that does not
load, never makes the import fail: torch.tpu.is_available() is then False,
torch.tpu.device_count() 0, and the first use of the device raises the error
that says what went wrong and the way out (torch_pjrt/_unavailable.py).
"""
import os

import torch

from . import _plugin

_ROOT = os.path.dirname(os.path.abspath(__file__))
# Why the device could not open (an exception), or None once it did.
load_error = None


def _open():
    try:
        from . import _C
    except ImportError as e:
        raise RuntimeError(
            f"torch-pjrt's native core does not load ({e}). Reinstall the package "
            f"(`pip install torch-pjrt`), or run `make build` in a checkout of the repository."
        ) from None
    path = _plugin.plugin_path()
    if not os.path.exists(path):
        raise RuntimeError(
            f"torch-pjrt: the PJRT plugin {path} does not exist. Set TORCH_PJRT_PLUGIN to a PJRT "
            f"plugin (.so), or unset it to use the XLA CPU plugin (pip install xla-cpu-pjrt)."
        )
    # The plugin logs INFO lines to stderr at start ("cpu_device_count set via
    # create_options", absl's "All log messages before absl::InitializeLog()"):
    # noise in every script's output.  Warnings and errors still show; set
    # TF_CPP_MIN_LOG_LEVEL=0 to see everything.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    _plugin.set_default_xla_flags(path)
    _plugin.check_xla_flags(path, _C.__file__)
    try:
        _C.init(path, _plugin.cpu_device_count())
    except Exception as e:
        raise RuntimeError(
            f"torch-pjrt could not open the PJRT plugin {path}: {e}. Set TORCH_PJRT_PLUGIN to a "
            f"working PJRT plugin, or unset it to use the XLA CPU plugin (pip install xla-cpu-pjrt)."
        ) from None
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "PrivateUse1"):
        glue = os.path.join(_ROOT, "_glue.so")
        try:
            torch.ops.load_library(glue)
        except OSError as e:
            raise RuntimeError(
                f"torch-pjrt's PyTorch glue {glue} does not load with torch {torch.__version__} ({e}). "
                f"torch-pjrt is built for the torch it pins: reinstall it beside that version."
            ) from None


try:
    _open()
except RuntimeError as e:
    load_error = e

if load_error is None:
    from ._api import *  # noqa: F401,F403,E402
else:
    from . import _unavailable  # noqa: E402

    _unavailable.install(load_error)
    __getattr__ = _unavailable.module_getattr(load_error)

