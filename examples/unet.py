"""A small UNet like those of diffusion models: at each level two
Conv2d + GroupNorm + SiLU layers (a sinusoidal timestep embedding, through a
small MLP, is added between them), MaxPool2d on the way down, upsampling on
the way up (ConvTranspose2d, or F.interpolate nearest/bilinear followed by a
3x3 conv) and skip connections joined with torch.cat.  Trained to predict
the noise added to random images (MSE).  Random init from a config; nothing
is downloaded."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class UNetConfig:
    channels: int = 3
    widths: tuple = (8, 16, 32)  # one level per width; each level below the first halves H and W
    up_modes: tuple = ("transpose", "bilinear")  # per upsampling step, deepest first: transpose|nearest|bilinear
    groups: int = 4  # GroupNorm groups
    time_dim: int = 32  # 0: no timestep embedding
    image_size: int = 32
    timesteps: int = 100


def timestep_embedding(t, dim):
    """Sinusoidal embedding of integer timesteps t (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ConvBlock(nn.Module):
    def __init__(self, cin, cout, groups, time_dim):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.time = nn.Linear(time_dim, cout) if time_dim else None

    def forward(self, x, temb):
        h = F.silu(self.norm1(self.conv1(x)))
        if self.time is not None:
            h = h + self.time(temb)[:, :, None, None]
        return F.silu(self.norm2(self.conv2(h)))


class Up(nn.Module):
    def __init__(self, cin, cout, mode):
        super().__init__()
        self.mode = mode
        if mode == "transpose":
            self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        else:
            self.up = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        if self.mode == "transpose":
            return self.up(x)
        if self.mode == "bilinear":
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        else:
            x = F.interpolate(x, scale_factor=2, mode=self.mode)
        return self.up(x)


class UNet(nn.Module):
    def __init__(self, cfg: UNetConfig):
        super().__init__()
        assert len(cfg.up_modes) == len(cfg.widths) - 1
        self.cfg = cfg
        td = cfg.time_dim
        self.time_mlp = nn.Sequential(nn.Linear(td, td), nn.SiLU(), nn.Linear(td, td)) if td else None
        self.down = nn.ModuleList()
        cin = cfg.channels
        for w in cfg.widths:
            self.down.append(ConvBlock(cin, w, cfg.groups, td))
            cin = w
        self.pool = nn.MaxPool2d(2)
        self.ups = nn.ModuleList()
        self.up_blocks = nn.ModuleList()
        for w, mode in zip(reversed(cfg.widths[:-1]), cfg.up_modes):
            self.ups.append(Up(cin, w, mode))
            self.up_blocks.append(ConvBlock(2 * w, w, cfg.groups, td))  # after cat with the skip
            cin = w
        self.out = nn.Conv2d(cin, cfg.channels, 1)

    def forward(self, x, t=None):
        temb = None
        if self.time_mlp is not None:
            temb = self.time_mlp(timestep_embedding(t, self.cfg.time_dim))
        skips = []
        for i, block in enumerate(self.down):
            if i > 0:
                x = self.pool(x)
            x = block(x, temb)
            skips.append(x)
        skips.pop()  # the bottom level's output is x itself
        for up, block in zip(self.ups, self.up_blocks):
            x = block(torch.cat([up(x), skips.pop()], dim=1), temb)
        return self.out(x)


def noise_schedule(cfg: UNetConfig):
    """sqrt(alpha_bar) and sqrt(1 - alpha_bar) of a linear beta schedule."""
    betas = torch.linspace(1e-4, 0.02, cfg.timesteps)
    abar = torch.cumprod(1 - betas, 0)
    return abar.sqrt(), (1 - abar).sqrt()


def get_batch(cfg: UNetConfig, batch_size, generator):
    """(noisy images, timesteps, the noise): a denoising regression task."""
    x0 = torch.randn(batch_size, cfg.channels, cfg.image_size, cfg.image_size, generator=generator).tanh()
    t = torch.randint(0, cfg.timesteps, (batch_size,), generator=generator)
    noise = torch.randn(x0.shape, generator=generator)
    a, s = noise_schedule(cfg)
    xt = a[t][:, None, None, None] * x0 + s[t][:, None, None, None] * noise
    return xt, t, noise


def train(device, steps, cfg=None, batch_size=4, lr=2e-3, seed=0, compile=False):
    """AdamW on the noise-prediction MSE from a fixed seed; returns (model, losses)."""
    cfg = cfg or UNetConfig()
    torch.manual_seed(seed)
    model = UNet(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    fwd = torch.compile(model, backend="tpu") if compile else model
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        xt, t, noise = get_batch(cfg, batch_size, gen)
        loss = F.mse_loss(fwd(xt.to(device), t.to(device)), noise.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses
