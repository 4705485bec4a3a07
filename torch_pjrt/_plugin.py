"""Finding the PJRT plugin that backs the "tpu" device.

TORCH_PJRT_PLUGIN=/path/to/plugin.so picks any PJRT plugin (libtpu.so, the
CUDA plugin).  Without it we use the XLA CPU plugin installed with the
package (PyPI: xla-cpu-pjrt), so the same script runs on a laptop, in CI and
on a TPU VM.
"""
import os
import re
import subprocess
import sys


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


# Defaults for the XLA CPU plugin, each unless XLA_FLAGS already sets that
# option.  XLA reads XLA_FLAGS once, so they are set before loading.
# - LLVM's loop strength reduction is about a third of the plugin's compile
#   time for the small programs eager mode makes (100 -> 70 ms a program),
#   and measured no slower kernels without it (docs/architecture.md,
#   "Compile time").
# - With two CPUs or fewer, Eigen's intra-op thread pool (matmuls,
#   convolutions) costs more in hand-offs than it gains: minGPT and Llama
#   training steps 10-13% faster without it, eager and compiled, and a
#   1024x1024 matmul or a 64-channel 3x3 convolution no slower (measured on
#   this project's 2-CPU machines, docs/architecture.md "Compile time").
_CPU_XLA_FLAGS = {"xla_backend_extra_options": "--xla_backend_extra_options=-disable-lsr",
                  "xla_cpu_multi_thread_eigen": "--xla_cpu_multi_thread_eigen=false"}


def _with_cpu_defaults(flags):
    for option, flag in _CPU_XLA_FLAGS.items():
        if option == "xla_cpu_multi_thread_eigen" and (os.cpu_count() or 1) > 2:
            continue
        if option not in flags:
            flags = f"{flags} {flag}".strip()
    return flags


def set_default_xla_flags(path):
    if path == default_plugin():
        os.environ["XLA_FLAGS"] = _with_cpu_defaults(os.environ.get("XLA_FLAGS", ""))


# XLA parses XLA_FLAGS when the plugin creates its client and aborts the
# process on a flag it does not know or a value it cannot parse.  So when the
# user set XLA_FLAGS, a child process opens the plugin with them first (the C
# core only, no torch: about 0.3 s), and a failure there becomes an exception
# here instead of an abort.
_PROBE = """
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.ExtensionFileLoader("torch_pjrt._C", sys.argv[1])
_C = importlib.util.module_from_spec(importlib.util.spec_from_loader("torch_pjrt._C", loader))
loader.exec_module(_C)
_C.init(sys.argv[2], 1)
"""


def check_xla_flags(path, c_module_file):
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if not flags or flags == _with_cpu_defaults(""):
        return
    r = subprocess.run([sys.executable, "-c", _PROBE, c_module_file, path], capture_output=True, text=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if r.returncode == 0 or r.returncode > 0 and "XLA_FLAGS" not in r.stderr:
        return  # fine, or an error that opening the plugin here reports itself
    # absl log lines: "E0000 00:00:... file.cc:93] message" (E: error, F: fatal)
    logged = {k: [ln.split("] ", 1)[-1] for ln in r.stderr.splitlines() if re.match(k + r"\d{4} ", ln)]
              for k in "EF"}
    why = "; ".join(m.rstrip(".") for m in logged["E"] or logged["F"]) or f"it exited with status {r.returncode}"
    raise RuntimeError(
        f"torch-pjrt: the PJRT plugin {path} aborts with XLA_FLAGS={flags!r}: {why}. Fix or unset XLA_FLAGS.")


def cpu_device_count():
    # Under torchrun (LOCAL_WORLD_SIZE set), the CPU plugin gives every
    # process one device per local rank, so that a script written for CUDA,
    # `torch.tpu.set_device(local_rank)` and `DDP(model, device_ids=[local_rank])`,
    # runs unchanged.  Each process still computes on its own devices only.
    raw = os.environ.get("TORCH_PJRT_CPU_DEVICES") or os.environ.get("LOCAL_WORLD_SIZE") or "1"
    try:
        n = int(raw)
    except ValueError:
        raise RuntimeError(f"TORCH_PJRT_CPU_DEVICES must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise RuntimeError(f"TORCH_PJRT_CPU_DEVICES must be a positive integer, got {raw!r}")
    return n
