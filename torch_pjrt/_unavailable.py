"""The "tpu" device when the runtime could not open.

PyTorch imports torch-pjrt with every `import torch` (device-backend
autoload), so a missing or broken PJRT plugin must not break that import.
Instead the device exists by name and reports itself unusable, as torch.cuda
does on a machine without a GPU:

- torch.tpu.is_available() is False, device_count() 0, is_initialized()
  False; every other torch.tpu function raises the load error;
- an op on a "tpu" tensor (`torch.ones(2, device="tpu")`, `x.to("tpu")`)
  raises the load error from a PrivateUse1 fallback kernel;
- torch_pjrt's own functions (metrics(), bucket(), ...) raise it too.

The load error names what failed and the way out (TORCH_PJRT_PLUGIN,
reinstalling), as `import torch_pjrt` used to raise it.
"""
import types

import torch

_keep = []  # the torch.library.Library objects: their registrations live as long as they do


def _raiser(err, what):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{what}: the tpu device is not available. {err}")

    unavailable.__name__ = what.rsplit(".", 1)[-1]
    return unavailable


def module_getattr(err, prefix="torch_pjrt"):
    """A module __getattr__ whose public names are functions raising `err`
    (so `hasattr` finds them, as it finds torch.cuda's functions without CUDA)."""

    def __getattr__(name):
        if name.startswith("_"):
            raise AttributeError(f"module {prefix!r} has no attribute {name!r}")
        return _raiser(err, f"{prefix}.{name}")

    return __getattr__


def install(err):
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    mod = types.ModuleType("torch.tpu", "torch.tpu: torch-pjrt's device module (unavailable here: see load_error).")
    mod.load_error = err
    mod.is_available = lambda: False
    mod.device_count = lambda: 0
    mod.is_initialized = lambda: False
    mod.__getattr__ = module_getattr(err, "torch.tpu")
    torch._register_device_module("tpu", mod)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

    # PyTorch asks the device's guard before some ops reach the dispatcher
    # (a copy from the CPU, `x.to("tpu")`): without one they fail with "PyTorch
    # is not linked with support for tpu devices".  PyTorch's Python-backend
    # hooks give it one, and hooks that say the device is not available.
    acc = getattr(torch._C, "_acc", None)
    if acc is not None:
        class _Guard(acc.DeviceGuard):
            def type_(self):
                return torch._C._autograd.DeviceType.PrivateUse1

        class _Hooks(acc.PrivateUse1Hooks):
            def is_available(self):
                return False

            def is_built(self):
                return True

            def has_primary_context(self, dev_id):
                return False

        for register, obj in ((acc.register_python_privateuseone_hook, _Hooks()),
                              (acc.register_python_privateuseone_device_guard, _Guard())):
            try:
                register(obj)
                _keep.append(obj)
            except RuntimeError:
                pass  # one was registered already (the glue's): it serves

    def fallback(op, *args, **kwargs):
        raise RuntimeError(f"{op} on a tpu tensor: the tpu device is not available. {err}")

    lib = torch.library.Library("_", "IMPL")
    lib.fallback(fallback, "PrivateUse1")
    _keep.append(lib)
