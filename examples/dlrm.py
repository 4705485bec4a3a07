"""A small DLRM (deep learning recommendation model): dense features through
a bottom MLP, one nn.EmbeddingBag (mode "sum", offsets-style input) per
categorical feature, pairwise dot products of all feature vectors (bmm, then
the strict upper triangle selected with triu indices), the dense vector and
the interactions through a top MLP to one logit, BCEWithLogits loss.
Random init from a config; nothing is downloaded."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DLRMConfig:
    num_dense: int = 13
    table_sizes: tuple = (50, 30, 40, 20)  # rows of each embedding table
    embed_dim: int = 16
    bottom_mlp: tuple = (32, 16)  # ends in embed_dim
    top_mlp: tuple = (32, 16)  # hidden layers; then one logit
    bag_size: int = 3  # average indices per bag (a batch holds batch_size * bag_size per table)


def mlp(sizes, last_relu):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        assert cfg.bottom_mlp[-1] == cfg.embed_dim
        self.cfg = cfg
        self.bottom = mlp((cfg.num_dense,) + tuple(cfg.bottom_mlp), last_relu=True)
        self.tables = nn.ModuleList([nn.EmbeddingBag(n, cfg.embed_dim, mode="sum") for n in cfg.table_sizes])
        nf = 1 + len(cfg.table_sizes)
        li, lj = torch.triu_indices(nf, nf, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp((cfg.embed_dim + nf * (nf - 1) // 2,) + tuple(cfg.top_mlp) + (1,), last_relu=False)

    def interact(self, x, embs):
        t = torch.stack([x] + embs, dim=1)  # (B, F, D)
        z = torch.bmm(t, t.transpose(1, 2))  # (B, F, F)
        return torch.cat([x, z[:, self.li, self.lj]], dim=1)

    def forward(self, dense, indices, offsets, targets=None):
        x = self.bottom(dense)
        embs = [table(i, o) for table, i, o in zip(self.tables, indices, offsets)]
        logits = self.top(self.interact(x, embs)).squeeze(1)
        loss = None if targets is None else F.binary_cross_entropy_with_logits(logits, targets)
        return logits, loss


def get_batch(cfg: DLRMConfig, batch_size, generator):
    """Random dense features, bags and click labels.  Each table gets
    batch_size * bag_size indices cut into bags of random sizes (empty bags
    included), so shapes are the same every step."""
    dense = torch.rand(batch_size, cfg.num_dense, generator=generator)
    n = batch_size * cfg.bag_size
    indices, offsets = [], []
    for rows in cfg.table_sizes:
        indices.append(torch.randint(0, rows, (n,), generator=generator))
        cuts = torch.randint(0, n + 1, (batch_size - 1,), generator=generator).sort().values
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), cuts]))
    targets = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return dense, indices, offsets, targets


def to(batch, device):
    dense, indices, offsets, targets = batch
    return (dense.to(device), [i.to(device) for i in indices], [o.to(device) for o in offsets],
            targets.to(device))


def train(device, steps, cfg=None, batch_size=16, lr=0.1, seed=0, compile=False):
    """SGD from a fixed seed; returns (model, losses)."""
    cfg = cfg or DLRMConfig()
    torch.manual_seed(seed)
    model = DLRM(cfg).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    fwd = torch.compile(model, backend="tpu") if compile else model
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        _, loss = fwd(*to(get_batch(cfg, batch_size, gen), device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses
