"""torch.distributed on "tpu": the "tpu" process-group backend.

    import torch.distributed as dist
    dist.init_process_group("tpu")        # or init_process_group() under torchrun
    model = DistributedDataParallel(model.to("tpu"))

Importing torch_pjrt registers the backend.  Collectives on "tpu" tensors
run through Gloo on host copies (csrc/dist/backend.cpp); CPU tensors in the
same group go to Gloo directly.  Each call finishes before it returns.
"""
import torch
import torch.distributed as dist

BACKEND = "tpu"


def _dist():
    from . import _dist

    return _dist


def _has(pg, backend_type):
    try:
        pg._backend_id(backend_type)
        return True
    except RuntimeError:
        return False


def _create(store, rank, size, timeout):
    # The group's store may be shared with a Gloo backend for CPU tensors
    # ("cpu:gloo,tpu:tpu"): a prefix of its own keeps their keys apart.
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(BACKEND, store), rank, size, timeout)
    return _dist().TpuBackend(gloo, rank, size)


def _default_to_tpu(helper):
    """init_process_group() without a backend maps the accelerator, "tpu", to
    this backend, but then names Gloo the group's default backend (PyTorch
    picks NCCL if it is in the map, else Gloo), which is not in the group:
    DDP then fails with "Could not find backend type 1 for Process Group".
    A group whose default backend is missing and that has a "tpu" backend
    gets it as the default, as a CUDA group gets NCCL."""
    import functools

    @functools.wraps(helper)
    def wrapper(*args, **kwargs):
        pg, store = helper(*args, **kwargs)
        types = dist.ProcessGroup.BackendType
        if isinstance(pg, dist.ProcessGroup) and _has(pg, types.CUSTOM) and not _has(pg, types.GLOO):
            try:
                if isinstance(pg._get_backend(torch.device(BACKEND)), _dist().TpuBackend):
                    pg._set_default_backend(types.CUSTOM)
            except RuntimeError:  # no "tpu" backend in this group
                pass
        return pg, store

    wrapper._torch_pjrt = True
    return wrapper


def install():
    if not dist.is_available() or not dist.is_gloo_available():
        return
    if BACKEND.upper() not in dist.Backend._plugins:
        # "cpu" too: init_process_group("tpu") serves CPU tensors, as "gloo"
        # serves CPU and CUDA ones.  The default for CPU stays Gloo.
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", BACKEND])
    c10d = dist.distributed_c10d
    if not getattr(c10d._new_process_group_helper, "_torch_pjrt", False):
        c10d._new_process_group_helper = _default_to_tpu(c10d._new_process_group_helper)
