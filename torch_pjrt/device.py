"""torch.tpu: the device module, shaped like torch.cuda."""
import os
import struct
import warnings

import torch

from . import _C, amp  # noqa: F401 (torch.tpu.amp)

_seed_lock = None
_pid = os.getpid()
# The runtime (plugin and client) opens when torch_pjrt is imported.
# PyTorch reads this flag (torch.utils.checkpoint saves and restores the
# device's random state only for an initialised device module).
_initialized = True


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def init() -> None:
    """The runtime is opened on import; kept for torch.cuda.init's users."""


def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return torch._C._accelerator_getDeviceIndex() if hasattr(torch._C, "_accelerator_getDeviceIndex") else 0


def _index(device=None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        idx = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        idx = device.index if device.index is not None else current_device()
    if not 0 <= idx < device_count():
        raise RuntimeError(f"Invalid device index tpu:{idx}: there are {device_count()} tpu device(s)")
    return idx


def set_device(device) -> None:
    torch._C._accelerator_setDeviceIndex(_index(device))


class device:
    """Context manager that changes the current tpu device (like torch.cuda.device)."""

    def __init__(self, device):
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            set_device(self.prev)
        return False


class device_of(device):  # noqa: N801 (torch.cuda.device_of's name)
    """Context manager that makes the device of tensor `obj` current, if it
    is on tpu (like torch.cuda.device_of)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


def synchronize(device=None) -> None:
    """Wait until all work queued on the device has finished."""
    _C.synchronize(_index(device))


# ---- streams and events ------------------------------------------------------
# One in-order stream per device: ops run asynchronously but in the order
# they were issued, so every stream handle is that stream, and waiting on an
# event or stream waits for the device.  These wrap torch.accelerator's
# generic objects, which the C++ device guard serves.


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


default_stream = current_stream


def Stream(device=None, priority=0) -> torch.Stream:  # noqa: N802 (torch.cuda.Stream's name)
    return torch.Stream(device=torch.device("tpu", _index(device)), priority=priority)


def Event(enable_timing=False, blocking=False, interprocess=False) -> torch.Event:  # noqa: N802
    """A tpu event.  With enable_timing=True, record() waits for the work
    queued so far and notes the host's clock (the device's stream carries no
    timestamps), so elapsed_time() between two records is the time that work
    took, as with CUDA events."""
    return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def set_stream(stream) -> None:
    if stream is not None and stream.device.type != "tpu":
        raise ValueError(f"expected a tpu stream, got one on {stream.device}")


class StreamContext:
    """torch.cuda.StreamContext's counterpart: work inside runs on `stream`,
    which is the device's one stream (None: no change)."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        return None


def stream(s) -> StreamContext:
    return StreamContext(s)


def get_device_name(device=None) -> str:
    idx = _index(device)
    info = _C.info()
    kind = info["device_kind"] or info["platform"]
    return f"{kind} (PJRT plugin {info['platform']}, {info['path']}, device {idx})"


class _DeviceProperties:
    """What torch.tpu.get_device_properties returns: attributes, like
    torch.cuda's _CudaDeviceProperties (name, total_memory), plus what
    backs the device (platform, plugin, xla_version, pjrt_api_version)."""

    __slots__ = ("name", "total_memory", "platform", "plugin", "xla_version", "pjrt_api_version")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw[k])

    def __repr__(self):
        return (f"_TpuDeviceProperties(name={self.name!r}, platform={self.platform!r}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, pjrt_api_version={self.pjrt_api_version!r})")


def get_device_properties(device=None) -> _DeviceProperties:
    idx = _index(device)
    info = _C.info()
    return _DeviceProperties(name=get_device_name(idx), total_memory=mem_get_info(idx)[1], platform=info["platform"],
                             plugin=info["path"], xla_version=info["xla_version"],
                             pjrt_api_version=info["api_version"])


# ---- random numbers ---------------------------------------------------------


def manual_seed(seed) -> None:
    _C.manual_seed(current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF)


def manual_seed_all(seed) -> None:
    for i in range(device_count()):
        _C.manual_seed(i, int(seed) & 0xFFFFFFFFFFFFFFFF)


def seed() -> None:
    import random

    manual_seed(random.getrandbits(63))


def seed_all() -> None:
    import random

    manual_seed_all(random.getrandbits(63))


def initial_seed() -> int:
    return _C.initial_seed(current_device())


def get_rng_state(device="tpu") -> torch.Tensor:
    """The device's random state as a CPU ByteTensor (like torch.cuda): 16
    bytes, the seed then the counter of values drawn so far (uint64 each)."""
    seed, offset = _C.rng_state(_index(device))
    return torch.frombuffer(bytearray(struct.pack("=QQ", seed, offset)), dtype=torch.uint8)


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    """Restore a state from get_rng_state: the same random numbers follow."""
    if new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise RuntimeError(f"RNG state of a tpu generator must be 16 bytes (torch.uint8), got {new_state.numel()} "
                           f"{new_state.dtype} values")
    seed, offset = struct.unpack("=QQ", bytes(new_state.detach().cpu().contiguous().view(torch.uint8).tolist()))
    _C.set_rng_state(_index(device), seed, offset)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def get_amp_supported_dtype() -> list:
    """The dtypes torch.autocast("tpu", dtype=...) takes (PyTorch asks the
    device module).  TPUs compute bfloat16 natively; float16 works too (the
    XLA CPU plugin computes both)."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_in_bad_fork() -> bool:
    """True in a forked child: the parent's runtime cannot be used there."""
    return os.getpid() != _pid


# ---- memory -----------------------------------------------------------------


def memory_allocated(device=None) -> int:
    return _C.mem_stats(_index(device))[0]


def max_memory_allocated(device=None) -> int:
    return _C.mem_stats(_index(device))[1]


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes held for tpu tensors.  There is no caching allocator on top of
    the plugin's, so this is memory_allocated."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


memory_cached = memory_reserved  # torch.cuda's deprecated names
max_memory_cached = max_memory_reserved


def empty_cache() -> None:
    """Return freed memory kept for reuse to the system.  With the XLA CPU
    plugin, device buffers are host memory, and torch-pjrt has the host
    allocator keep up to 256 MiB of freed memory (fresh pages for every
    large output cost more than the op; TORCH_PJRT_HOST_MALLOC=default turns
    this off).  Other plugins free device buffers at once."""
    _C.release_host_memory()


def ipc_collect() -> None:
    """Nothing to collect: tensors cross processes by value (no IPC handles)."""


def is_current_stream_capturing() -> bool:
    """Always False: there is no stream (CUDA graph) capture on tpu."""
    return False


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats's keys (those of torch.accelerator.memory_stats).
    There is no caching allocator: allocated, reserved and active bytes are
    the same, and segment and allocation counts are live buffers."""
    return dict(torch.accelerator.memory_stats(_index(device)))


_memory_fraction = {}  # device index -> fraction set


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Cap what this process's tpu tensors may hold on `device` at `fraction`
    of its total memory (mem_get_info's total: the host's memory for the XLA
    CPU plugin), as torch.cuda.set_per_process_memory_fraction.  Going over
    raises torch.OutOfMemoryError before the op runs (its inputs, donated
    ones too, are left as they were).  1.0 lifts the cap."""
    idx = _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C.set_mem_limit(idx, -1 if fraction == 1.0 else int(fraction * mem_get_info(idx)[1]))
    _memory_fraction[idx] = fraction


def get_per_process_memory_fraction(device=None) -> float:
    return _memory_fraction.get(_index(device), 1.0)


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats with its dotted keys nested, as torch.cuda's:
    "allocated_bytes.all.current" is d["allocated_bytes"]["all"]["current"]."""
    out = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        d = out
        for part in path:
            d = d.setdefault(part, {})
        d[last] = value
    return out


def can_device_access_peer(device, peer_device) -> bool:
    """True for any two tpu devices: tensors copy between them directly
    (PJRT device-to-device copies)."""
    _index(device)
    _index(peer_device)
    return True


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch.tpu.reset_max_memory_cached now calls torch.tpu.reset_peak_memory_stats, which resets "
                  "/all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Nothing accumulates (see memory_stats)."""


OutOfMemoryError = torch.OutOfMemoryError


def memory_summary(device=None, abbreviated=False) -> str:
    """A short report of tpu memory, like torch.cuda.memory_summary (there is
    no caching allocator, so there are no pool or segment statistics)."""
    idx = _index(device)
    in_use, peak, live = _C.mem_stats(idx)
    free, total = mem_get_info(idx)

    def mb(n):
        return f"{n / (1 << 20):,.1f} MiB"

    return "\n".join([
        f"torch-pjrt memory summary, device tpu:{idx} ({get_device_name(idx)})",
        f"  allocated (current): {mb(in_use)} in {live} buffers",
        f"  allocated (peak):    {mb(peak)}",
        f"  device free / total: {mb(free)} / {mb(total)}",
    ])


def mem_get_info(device=None):
    """(free, total) bytes, like torch.cuda.mem_get_info.

    Plugins that do not report device memory (the XLA CPU plugin) give the
    host's physical memory as total and total minus what tpu tensors hold as
    free (the allocator's getMemoryInfo, csrc/glue/device.cpp)."""
    return torch.accelerator.get_memory_info(_index(device))