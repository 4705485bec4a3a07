"""Bucketing for variable-length inputs.

Compiled programs have static shapes: every new prompt length would compile a
new program.  Pad the variable dimension up to one of a few sizes instead, and
carry a mask that says which positions are real:

    ids, mask = torch_pjrt.bucket(ids, dim=1, sizes=(32, 64, 128, 256))
    logits = compiled_model(ids)          # at most 4 distinct shapes
    loss = (per_token_loss * mask).sum() / mask.sum()
"""
import torch
import torch.nn.functional as F


def pick_size(n, sizes=None):
    """The smallest bucket >= n (default buckets: powers of two)."""
    if sizes is None:
        b = 1
        while b < n:
            b *= 2
        return b
    for s in sorted(sizes):
        if s >= n:
            return s
    raise ValueError(f"length {n} is larger than the largest bucket {max(sizes)}; add a bigger bucket size")


def bucket(x: torch.Tensor, dim: int = -1, sizes=None, value=0):
    """Pad `x` along `dim` up to a bucket size; returns (padded, mask).

    `mask` is a bool tensor of shape (padded.shape[dim],) on x's device, True
    at the original positions."""
    dim = dim % x.dim()
    n = x.shape[dim]
    size = pick_size(n, sizes)
    pad = [0, 0] * (x.dim() - dim - 1) + [0, size - n]
    padded = F.pad(x, pad, value=value) if size > n else x
    mask = torch.arange(size, device=x.device) < n
    return padded, mask
