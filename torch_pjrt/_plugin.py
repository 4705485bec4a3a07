"""Finding the PJRT plugin that backs the "tpu" device.

TORCH_PJRT_PLUGIN=/path/to/plugin.so picks any PJRT plugin (libtpu.so, the
CUDA plugin).  Without it we use the XLA CPU plugin installed with the
package (PyPI: xla-cpu-pjrt), so the same script runs on a laptop, in CI and
on a TPU VM.
"""
import os


def default_plugin():
    """Path of the XLA CPU plugin shipped by the xla-cpu-pjrt wheel."""
    try:
        import xla_plugins.xla_cpu_pjrt as m
    except ImportError:
        return None
    return os.path.join(os.path.dirname(m.__file__), "xla_cpu_pjrt.so")


def plugin_path():
    env = os.environ.get("TORCH_PJRT_PLUGIN")
    if env:
        return env
    path = default_plugin()
    if path is None:
        raise RuntimeError(
            "torch-pjrt found no PJRT plugin: the XLA CPU plugin is not installed and "
            "TORCH_PJRT_PLUGIN is not set. Run `pip install xla-cpu-pjrt`, or set "
            "TORCH_PJRT_PLUGIN=/path/to/plugin.so (e.g. libtpu.so on a TPU VM)."
        )
    return path


# LLVM's loop strength reduction is about a third of the XLA CPU plugin's
# compile time for the small programs eager mode makes (100 -> 70 ms a
# program), and measured no slower kernels without it (docs/architecture.md,
# "Compile time").  Off for the CPU plugin unless XLA_FLAGS already passes
# options to LLVM.  XLA reads XLA_FLAGS once, so this is set before loading.
_CPU_XLA_FLAGS = "--xla_backend_extra_options=-disable-lsr"


def set_default_xla_flags(path):
    if path != default_plugin():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_extra_options" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_CPU_XLA_FLAGS}".strip()


def cpu_device_count():
    raw = os.environ.get("TORCH_PJRT_CPU_DEVICES", "1")
    try:
        n = int(raw)
    except ValueError:
        raise RuntimeError(f"TORCH_PJRT_CPU_DEVICES must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise RuntimeError(f"TORCH_PJRT_CPU_DEVICES must be a positive integer, got {raw!r}")
    return n
