"""tpu tensors through torch.multiprocessing queues (DataLoader workers,
mp.Queue): sent by value through host memory.

PyTorch shares CPU tensors through shared-memory file descriptors and CUDA
tensors through CUDA IPC handles.  PJRT has no handle another process could
open, so a tpu tensor travels as the bytes of a CPU copy and is moved to the
same device index on arrival (a DataLoader worker's batch, say).  Unlike CUDA's sharing,
a write in one process is not seen by the other.  Without this the worker's
pickler failed in a background thread ("_share_fd_: only available on
CPU") and the parent waited forever."""
import io
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _reductions


def _rebuild(cls, raw, index, requires_grad):
    t = torch.load(io.BytesIO(raw), weights_only=True).to(torch.device("tpu", index))
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad)
    return t.requires_grad_(requires_grad)


def _reduce_tensor(t):
    if t.device.type != "tpu":
        return _reductions.reduce_tensor(t)
    if t.requires_grad and not t.is_leaf:
        return _reductions.reduce_tensor(t)  # PyTorch's error: autograd cannot cross processes
    cls = torch.nn.Parameter if isinstance(t, torch.nn.Parameter) else torch.Tensor
    # The copy's bytes, not the copy: a CPU tensor would be shared through a
    # shared-memory file that a spawned Process's arguments only pass on
    # after the temporary copy has been freed ("unable to resize file").
    raw = io.BytesIO()
    torch.save(t.detach().cpu(), raw)
    return (_rebuild, (cls, raw.getvalue(), t.device.index, t.requires_grad))


def _reduce_storage(s):
    if s.device.type != "tpu":
        return _reductions.reduce_storage(s)
    raise RuntimeError("tpu storages cannot be sent to another process; send the tensor "
                       "(it travels as a copy through host memory) or a CPU copy of the storage")


def install():
    for cls in (torch.Tensor, torch.nn.Parameter, *torch._tensor_classes):
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
