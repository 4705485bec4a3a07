"""Tests of the C++ glue (csrc/glue): allocator, device guard, hooks, and the
metadata-only kernels.  Nothing here computes: only ops that create tensors
or change sizes, strides, offsets and storages, which the glue serves alone.

The runtime is opened by `import torch_pjrt` once that package exists;
until then (or if it cannot be imported) by ctypes on the built core, with a
stand-in torch.tpu module.  A missing or broken build fails these tests: it
never skips them.
"""
import ctypes
import os
import pathlib
import subprocess
import sys
import threading
import types

import pytest
import torch

# Ask the package for two CPU devices (unless told otherwise) so the
# multi-device paths are covered; no effect if it was imported already.
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "torch_pjrt"
CPU_DEVICES = 2  # what the ctypes bootstrap asks the XLA CPU plugin for


class _Config(ctypes.Structure):  # tp_runtime_config in csrc/core/runtime.h
    _fields_ = [("plugin_path", ctypes.c_char_p), ("cpu_device_count", ctypes.c_int)]


def _plugin_path():
    import xla_plugins.xla_cpu_pjrt as m

    return os.path.join(os.path.dirname(m.__file__), "xla_cpu_pjrt.so")


def _ctypes_bootstrap():
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    lib = PKG / "libtpcore.so"
    assert lib.exists(), f"{lib} is not built: run `make build`"
    # RTLD_GLOBAL + the same file the glue links against: one runtime state.
    core = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    core.tp_runtime_init.restype = ctypes.c_void_p
    core.tp_runtime_init.argtypes = [ctypes.POINTER(_Config)]
    core.tp_status_message.restype = ctypes.c_char_p
    core.tp_status_message.argtypes = [ctypes.c_void_p]
    cfg = _Config(_plugin_path().encode(), CPU_DEVICES)
    st = core.tp_runtime_init(ctypes.byref(cfg))
    assert not st, "tp_runtime_init: " + core.tp_status_message(st).decode()
    assert core.tp_runtime_device_count() == CPU_DEVICES
    if not hasattr(torch, "tpu"):
        # PyTorch imports torch.<backend> on first use of the device; the
        # real module is the Python package's.  This one has what the tests
        # and torch.accelerator need.
        mod = types.ModuleType("torch.tpu")
        mod.device_count = core.tp_runtime_device_count
        mod.is_available = lambda: core.tp_runtime_device_count() > 0
        mod.current_device = torch._C._accelerator_getDeviceIndex
        torch._register_device_module("tpu", mod)


@pytest.fixture(scope="module", autouse=True)
def tpu():
    try:
        import torch_pjrt
    except ImportError:
        torch_pjrt = None
    # An empty torch_pjrt/ directory imports as a namespace package: only a
    # real package (with __init__.py) opens the runtime.
    if torch_pjrt is None or getattr(torch_pjrt, "__file__", None) is None:
        _ctypes_bootstrap()
    if not torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::empty.memory_format", "PrivateUse1"
    ):
        glue = PKG / "_glue.so"
        assert glue.exists(), f"{glue} is not built: run `make build`"
        torch.ops.load_library(str(glue))
    n = torch.accelerator.device_count()
    assert n >= 1, "the runtime reports no tpu devices"
    return n


def sid(t):
    """Identity of a tensor's storage (its tp_storage handle)."""
    return t.untyped_storage().data_ptr()


def test_empty():
    x = torch.empty(2, 3, device="tpu")
    assert x.device == torch.device("tpu", 0)
    assert x.shape == (2, 3) and x.stride() == (3, 1) and x.dtype == torch.float32
    assert x.untyped_storage().nbytes() == 24
    y = torch.empty(4, dtype=torch.int16, device="tpu")
    assert y.dtype == torch.int16 and y.untyped_storage().nbytes() == 8
    # A storage handle exists even for 0 bytes.
    z = torch.empty(0, device="tpu")
    assert z.untyped_storage().nbytes() == 0 and sid(z) != 0
    assert sid(x) != sid(y)


def test_empty_strided_and_like():
    x = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert x.stride() == (1, 2) and x.untyped_storage().nbytes() == 24
    cl = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    ref = torch.empty(2, 3, 4, 5, memory_format=torch.channels_last)
    assert cl.stride() == ref.stride()
    like = torch.empty_like(cl)
    assert like.device == cl.device and like.stride() == cl.stride()
    with pytest.raises(RuntimeError, match="pinned"):
        torch.empty(1, device="tpu", pin_memory=True)


def test_pinned_host_memory():
    """pin_memory() gives host memory that is_pinned() recognises, as with
    CUDA (DataLoader(pin_memory=True), DDP's reducer asks); other CPU memory
    is not pinned, and a freed block is forgotten."""
    x = torch.randn(4, 4)
    p = x.pin_memory()
    assert p.is_pinned() and p[1:, 2:].is_pinned() and not x.is_pinned()
    assert torch.equal(p, x) and torch.equal(p.to("tpu", non_blocking=True).cpu(), x)
    assert torch.empty(5, pin_memory=True).is_pinned()
    assert torch.empty_like(x, pin_memory=True).is_pinned()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4,
                                         pin_memory=True)
    assert all(b.is_pinned() for (b,) in loader)
    del p  # freed: ordinary memory at its address (malloc often reuses it) is not pinned
    assert not any(torch.empty(16).is_pinned() for _ in range(8))


def test_host_allocator_registered():
    # torch.accelerator's host-cache functions use the device's host
    # allocator (vLLM calls empty_host_cache() at shutdown): it exists and
    # there is nothing cached to empty.  Run in a child: a missing allocator
    # was a segfault.
    code = ("import torch; torch.ones(4).pin_memory(); torch.accelerator.empty_host_cache(); "
            "torch.ones(2, device='tpu').cpu(); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_views_share_storage():
    x = torch.empty(2, 3, device="tpu")
    v = x.view(3, 2)
    assert v.shape == (3, 2) and sid(v) == sid(x) and v._base is x
    t = x.t()
    assert t.shape == (3, 2) and t.stride() == (1, 3) and sid(t) == sid(x)
    s = x[1:]
    assert s.shape == (1, 3) and s.storage_offset() == 3 and sid(s) == sid(x)
    a = x.as_strided((2, 2), (1, 2), 1)
    assert a.stride() == (1, 2) and a.storage_offset() == 1 and sid(a) == sid(x)
    assert x.reshape(6).shape == (6,) and sid(x.reshape(6)) == sid(x)
    u = torch.empty(10, device="tpu").unfold(0, 4, 3)
    assert u.shape == (3, 4) and u.stride() == (3, 1)
    c = torch.empty(3, dtype=torch.complex64, device="tpu")
    r = torch.view_as_real(c)
    assert r.shape == (3, 2) and r.dtype == torch.float32 and sid(r) == sid(c)
    assert torch.view_as_complex(r).dtype == torch.complex64
    for f in (x.unsqueeze(0), x.squeeze(), x.expand(4, 2, 3), x.permute(1, 0),
              x.select(0, 1), x.narrow(1, 1, 2), x.detach(), x.flatten()):
        assert f.device == x.device and sid(f) == sid(x)


def test_view_errors_are_runtime_errors():
    x = torch.empty(2, 3, device="tpu")
    with pytest.raises(RuntimeError, match="view"):
        x.t().view(6)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.as_strided((10,), (1,))


def test_resize_grows_in_place():
    x = torch.empty(2, 3, device="tpu")
    handle = sid(x)
    v = x.view(6)
    x.resize_(4, 5)
    assert x.shape == (4, 5) and x.stride() == (5, 1)
    assert x.untyped_storage().nbytes() == 80
    # Same tp_storage handle, so the older view sees the grown storage.
    assert sid(x) == handle and v.untyped_storage().nbytes() == 80
    x.resize_(2)  # shrinking keeps the storage, as on CPU
    assert x.shape == (2,) and x.untyped_storage().nbytes() == 80
    x.resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    ref = torch.empty(2).resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert x.stride() == ref.stride() and x.untyped_storage().nbytes() == 480
    s = x.untyped_storage()
    s.resize_(1000)  # UntypedStorage.resize_ -> hooks.resizePrivateUse1Bytes
    assert s.nbytes() == 1000 and x.untyped_storage().nbytes() == 1000
    assert sid(x) == handle


def test_set_overloads():
    x = torch.empty(2, 3, device="tpu")
    y = torch.empty(0, device="tpu")
    y.set_(x.untyped_storage(), 1, (2, 2), (1, 2))
    assert y.shape == (2, 2) and y.stride() == (1, 2) and y.storage_offset() == 1
    assert sid(y) == sid(x)
    y.set_(x)
    assert y.is_set_to(x) and y.shape == (2, 3)
    y.set_()
    assert y.shape == (0,) and y.untyped_storage().nbytes() == 0 and sid(y) != sid(x)
    y.set_(x.untyped_storage())
    assert y.shape == (6,) and sid(y) == sid(x)
    # Larger sizes grow the storage in place, as on CPU.
    y.set_(x.untyped_storage(), 0, (10,), (1,))
    assert x.untyped_storage().nbytes() == 40 and sid(y) == sid(x)
    with pytest.raises(RuntimeError, match="devices must match"):
        y.set_(torch.empty(1).untyped_storage())


def test_devices(tpu):
    last = tpu - 1
    assert torch.empty(1, device=f"tpu:{last}").device == torch.device("tpu", last)
    if tpu > 1:
        assert torch.empty(1, device="tpu:1").device == torch.device("tpu", 1)
    with torch.accelerator.device_index(last):
        assert torch.empty(1, device="tpu").device.index == last
        seen = []  # the current device is per thread
        th = threading.Thread(target=lambda: seen.append(torch.empty(1, device="tpu").device))
        th.start()
        th.join()
        assert seen == [torch.device("tpu", 0)]
    assert torch.empty(1, device="tpu").device.index == 0


def test_invalid_device_raises(tpu):
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.empty(1, device=f"tpu:{tpu}")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.Generator(device=f"tpu:{tpu}")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        with torch.accelerator.device_index(tpu):
            pass
    assert torch.empty(1, device="tpu").device.index == 0  # still usable


def test_generator_state(tpu):
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0)
    assert g.initial_seed() == torch.Generator().initial_seed()  # a fresh generator's seed, as on CPU
    assert g.manual_seed(3) is g and g.initial_seed() == 3
    # A user generator has its own state; the default one is the runtime's.
    torch.tpu.manual_seed(5)
    assert torch.Generator(device="tpu").initial_seed() != 3 and torch.tpu.initial_seed() == 5
    assert g.initial_seed() == 3
    g.set_offset(40)
    assert g.get_offset() == 40
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    g.manual_seed(99)
    assert g.initial_seed() == 99 and g.get_offset() == 0  # reseed resets
    g.set_state(state)
    assert g.initial_seed() == 3 and g.get_offset() == 40
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(3, dtype=torch.uint8))
    s = g.seed()
    assert g.initial_seed() == s
    assert g.clone_state().initial_seed() == s
    # the device's default state round-trips through torch.tpu
    torch.tpu.manual_seed(8)
    torch.rand(5, device="tpu")
    st = torch.tpu.get_rng_state()
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.manual_seed(1)
    torch.tpu.set_rng_state(st)
    assert torch.tpu.initial_seed() == 8 and torch.equal(torch.rand(5, device="tpu").cpu(), a)
    if tpu > 1:  # devices are seeded independently
        torch.tpu.manual_seed_all(11)
        torch.tpu.manual_seed(12)
        assert torch.tpu.initial_seed() == 12 and _C_initial_seed(1) == 11


def _C_initial_seed(d):
    from torch_pjrt import _C

    return _C.initial_seed(d)


def test_streams_and_events_are_placeholders():
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("tpu", 0)
    ev = torch.Event(device="tpu")
    ev.record()
    ev.synchronize()
    assert ev.query()
    torch.accelerator.synchronize()
