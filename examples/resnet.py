"""A small ResNet for 32x32 images: a 3x3 stem, stages of BasicBlocks
(two 3x3 convs with BatchNorm and ReLU, a 1x1 conv + BatchNorm shortcut where
a stage halves the resolution with stride 2), adaptive average pooling and a
linear head.  Random init from a config; nothing is downloaded."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ResNetConfig:
    in_channels: int = 3
    widths: tuple = (8, 16, 32)  # one stage per width; every stage after the first halves H and W
    blocks: tuple = (1, 1, 1)  # BasicBlocks per stage
    num_classes: int = 10
    image_size: int = 32


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        w0 = cfg.widths[0]
        self.stem = nn.Sequential(nn.Conv2d(cfg.in_channels, w0, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(w0), nn.ReLU())
        layers, cin = [], w0
        for i, (w, n) in enumerate(zip(cfg.widths, cfg.blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, cfg.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x, targets=None):
        x = self.layers(self.stem(x))
        logits = self.head(torch.flatten(self.pool(x), 1))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


def get_batch(cfg: ResNetConfig, batch_size, generator):
    """Random images with random labels (the model only has to fit them)."""
    x = torch.randn(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size, generator=generator)
    y = torch.randint(0, cfg.num_classes, (batch_size,), generator=generator)
    return x, y


def train(device, steps, cfg=None, batch_size=8, lr=0.05, seed=0, compile=False, dtype=torch.float32):
    """SGD with momentum from a fixed seed (BatchNorm in train mode, so its
    running statistics are updated); returns (model, losses)."""
    cfg = cfg or ResNetConfig()
    torch.manual_seed(seed)
    model = ResNet(cfg).to(device=device, dtype=dtype).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    fwd = torch.compile(model, backend="tpu") if compile else model
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x, y = get_batch(cfg, batch_size, gen)
        _, loss = fwd(x.to(device=device, dtype=dtype), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses
