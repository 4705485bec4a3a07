"""nn.DataParallel on "tpu": the device-to-device primitives it calls.

DataParallel already picks the PrivateUse1 device when no GPU is present
(torch._utils._get_available_device_type), runs its replicas on threads
and syncs through torch.accelerator.  What it lacks is the communication
layer, torch.nn.parallel.comm, whose scatter/gather/broadcast call C++
functions (torch._C._scatter, ...) that only CUDA builds of PyTorch have and
that place results on CUDA devices.  So `nn.DataParallel(model)` failed with
"module 'torch._C' has no attribute '_scatter'" even on one device.

Here the comm functions, when DataParallel targets "tpu", do the same work
with tensor copies (the devices of one host share nothing faster: each copy
goes through PJRT), and the checks and messages follow CUDA's
(torch/csrc/cuda/comm.cpp).  Device arguments are indices, as there.
Everything else keeps PyTorch's own path.
"""
import functools

import torch
import torch.nn.parallel.comm as _comm
from torch._utils import _get_available_device_type, _get_device_index


def _dev(index):
    return torch.device("tpu", index)


def _on_tpu(*tensors):
    return _get_available_device_type() == "tpu" or any(
        isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)


def _check_first(tensors, devices):
    for t in tensors:
        if t.device.type == "tpu" and t.get_device() != devices[0]:
            raise RuntimeError("device of broadcasted tensor must appear as the first on devices list")


def _copies(tensors, devices):
    """One list of tensors per device: the inputs themselves on devices[0]
    when they are there already, fresh copies elsewhere (each with its own
    version counter, as CUDA's broadcast gives them)."""
    out = []
    for i, d in enumerate(devices):
        if i == 0 and all(t.device == _dev(d) for t in tensors):
            out.append(list(tensors))
        else:
            out.append([t.detach().to(_dev(d), copy=True) for t in tensors])
    return out


def broadcast(orig, tensor, devices=None, *, out=None):
    if not _on_tpu(tensor, *(out or ())):
        return orig(tensor, devices, out=out)
    if not ((devices is None) ^ (out is None)):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    tensor = torch._utils._handle_complex(tensor)
    if out is not None:
        for o in out:
            if o.shape != tensor.shape:
                raise RuntimeError(f"Expected all output tensors to have the same shape as the source "
                                   f"tensor {tuple(tensor.shape)}, but output tensor has shape {tuple(o.shape)}")
            o.copy_(tensor)
        return tuple(out)
    devices = [_get_device_index(d) for d in devices]
    _check_first([tensor], devices)
    return tuple(ts[0] for ts in _copies([tensor], devices))


def broadcast_coalesced(orig, tensors, devices, buffer_size=10485760):
    if not _on_tpu(*tensors):
        return orig(tensors, devices, buffer_size)
    devices = [_get_device_index(d) for d in devices]
    tensors = [torch._utils._handle_complex(t) for t in tensors]
    _check_first(tensors, devices)
    return _copies(tensors, devices)


def reduce_add(orig, inputs, destination=None):
    # PyTorch's own version works on any device but asks torch.cuda.nccl
    # first, which warns "not compiled with NCCL support" at every call.
    if not _on_tpu(*inputs):
        return orig(inputs, destination)
    destination = _get_device_index(destination, optional=True)
    if not any(t.device == _dev(destination) for t in inputs):
        raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
    for i, t in enumerate(inputs):
        if t.device.type == "cpu":
            raise AssertionError(f"reduce_add expects all inputs to be on GPUs, but input {i} is on CPU")
        if t.shape != inputs[0].shape:
            got, want = ("x".join(map(str, s)) for s in (t.shape, inputs[0].shape))
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {want}")
    root = next(t for t in inputs if t.device == _dev(destination))
    if len(inputs) == 1:
        return root
    result = root.clone()
    for t in inputs:
        if t is not root:
            result.add_(t.to(result.device))
    return result


def scatter(orig, tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    if not _on_tpu(tensor, *(out or ())):
        return orig(tensor, devices, chunk_sizes, dim, streams, out=out)
    tensor = torch._utils._handle_complex(tensor)
    if out is not None:
        if devices is not None:
            raise RuntimeError(f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}")
        sizes = [o.size(dim) for o in out]
        if sum(sizes) != tensor.size(dim):
            raise RuntimeError(f"Total size for output tensors along scatter dim ({sum(sizes)}) does not match "
                               f"that of the input tensor ({tensor.size(dim)})")
        for o, c in zip(out, tensor.split(sizes, dim)):
            o.copy_(c)
        return tuple(out)
    devices = [_get_device_index(d) for d in devices]
    if chunk_sizes is not None:
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got "
                               f"len(devices) = {len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}")
        chunks = tensor.split(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    return tuple(c.to(_dev(d)) for c, d in zip(chunks, devices))


def gather(orig, tensors, dim=0, destination=None, *, out=None):
    if not _on_tpu(*tensors, out):
        return orig(tensors, dim, destination, out=out)
    tensors = [torch._utils._handle_complex(t) for t in tensors]
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    for t in tensors:
        if t.device.type != "tpu":
            raise RuntimeError(f"Expected all input tensors to be tpu tensors, but got tensor on {t.device}")
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}")
        return out.copy_(torch.cat([t.to(out.device) for t in tensors], dim))
    destination = _get_device_index(destination, allow_cpu=True, optional=True)
    target = torch.device("cpu") if destination == -1 else _dev(destination)
    return torch.cat([t.to(target) for t in tensors], dim)


def install():
    for name in ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather"):
        orig = getattr(_comm, name)
        setattr(_comm, name, functools.wraps(orig)(functools.partial(globals()[name], orig)))
