"""safetensors straight to "tpu": `safetensors.torch.load_file(p, device="tpu")`,
`safe_open(p, "pt", device="tpu")` and what calls them (PEFT's
`torch_device="tpu"`, transformers' loaders).

safetensors' native part knows a fixed list of device names (cpu, cuda,
mps, npu, xpu, xla, hpu, mlu, musa) and refuses any other ("device tpu is
invalid"); for every device on that list it reads a tensor on the host and
moves it with `.to(device)`.  For "tpu" the same happens here: the file is
opened for the CPU (memory-mapped) and each tensor it hands out is copied to
the device once.  Only calls that name a tpu device take this path; the rest
reach safetensors unchanged.  Installed when safetensors is importable, at
torch-pjrt's import, which device-backend autoload runs inside `import torch`,
before any library that imports safetensors' names.
"""
import importlib.util

import torch


def _tpu(device):
    """The torch.device a safetensors `device` argument names when it is a
    tpu device, else None."""
    if isinstance(device, torch.device):
        return device if device.type == "tpu" else None
    if isinstance(device, str) and device.split(":")[0] == "tpu":
        return torch.device(device)
    return None


class _Slice:
    def __init__(self, sl, device):
        self._sl, self._device = sl, device

    def __getitem__(self, index):
        return self._sl[index].to(self._device)

    def __getattr__(self, name):  # get_shape, get_dtype
        return getattr(self._sl, name)


class _OnDevice:
    """A safe_open handle whose tensors land on a tpu device."""

    def __init__(self, handle, device):
        self._h, self._device = handle, device

    def __enter__(self):
        self._h.__enter__()
        return self

    def __exit__(self, *exc):
        return self._h.__exit__(*exc)

    def get_tensor(self, name):
        return self._h.get_tensor(name).to(self._device)

    def get_tensors(self):
        return {k: v.to(self._device) for k, v in self._h.get_tensors().items()}

    def get_slice(self, name):
        return _Slice(self._h.get_slice(name), self._device)

    def __getattr__(self, name):  # keys, metadata, offset_keys
        return getattr(self._h, name)


def install():
    if importlib.util.find_spec("safetensors") is None:
        return
    import safetensors
    import safetensors.torch as st

    native = safetensors.safe_open
    if getattr(native, "_tp_devices", False):
        return

    def safe_open(filename, framework, device="cpu", *args, **kwargs):
        dev = _tpu(device)
        if dev is None:
            return native(filename, framework, device, *args, **kwargs)
        if framework not in ("pt", "torch"):
            raise ValueError(f"safetensors: device {device!r} is a torch device; open the file with framework='pt'")
        return _OnDevice(native(filename, framework, "cpu", *args, **kwargs), dev)

    safe_open._tp_devices = True
    safe_open.__doc__ = native.__doc__
    safetensors.safe_open = safe_open
    st.safe_open = safe_open
