"""A small Llama-style decoder: RMSNorm, rotary position embeddings,
grouped-query attention and a SwiGLU MLP, or with n_experts > 0 a
mixture of SwiGLU experts (Mixtral/Qwen-MoE style: top-k routing, tokens
sorted by expert and multiplied with torch.nn.functional.grouped_mm).
The options Qwen's models add (q/k/v biases, RMSNorm of each head's q and k,
a head size of its own, tied embeddings, scaled_dot_product_attention) are
config fields; examples/qwen.py sets them.  Random init from a config."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 128
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden_dim: int = 128
    max_seq_len: int = 32
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_experts: int = 0  # 0: a dense MLP
    top_k: int = 2
    head_dim: int = 0  # 0: dim // n_heads
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k, before the rotation
    tie_embeddings: bool = False  # the output projection shares the embedding's weight
    sdpa: bool = False  # F.scaled_dot_product_attention instead of an explicit softmax

    @property
    def head_size(self):
        return self.head_dim or self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: LlamaConfig):
    head_dim = cfg.head_size
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    t = torch.arange(cfg.max_seq_len).float()
    freqs = torch.outer(t, inv)  # (T, head_dim/2)
    return torch.cos(freqs), torch.sin(freqs)


def apply_rope(x, cos, sin):
    # x: (B, H, T, D); rotate pairs (even, odd)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    T = x.shape[-2]
    c, s = cos[:T], sin[:T]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.sdpa = cfg.n_heads, cfg.n_kv_heads, cfg.sdpa
        self.head_dim = cfg.head_size
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-2, -1)) / (self.head_dim ** 0.5)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Experts(nn.Module):
    """Top-k routed SwiGLU experts, computed as Hugging Face's grouped-mm
    path does: each token's k copies sorted by expert, the tokens per expert
    counted with histc (of integers off the CPU, as on CUDA; the CPU's histc
    takes floats only), their end offsets given to grouped_mm."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        E, d, h = cfg.n_experts, cfg.dim, cfg.hidden_dim
        self.top_k = cfg.top_k
        self.router = nn.Linear(d, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, d, h) / d ** 0.5)
        self.w3 = nn.Parameter(torch.randn(E, d, h) / d ** 0.5)
        self.w2 = nn.Parameter(torch.randn(E, h, d) / h ** 0.5)

    def forward(self, x):
        shape, E = x.shape, self.w1.shape[0]
        x = x.reshape(-1, shape[-1])
        weights, ids = self.router(x).softmax(-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        ids, perm = ids.flatten().sort(stable=True)
        token = perm // self.top_k
        counts = torch.histc(ids.float() if x.device.type == "cpu" else ids.int(), bins=E, min=0, max=E - 1)
        offs = counts.cumsum(0, dtype=torch.int32)
        xs = x[token]
        hs = F.silu(F.grouped_mm(xs, self.w1, offs=offs)) * F.grouped_mm(xs, self.w3, offs=offs)
        ys = F.grouped_mm(hs, self.w2, offs=offs) * weights.flatten()[perm].unsqueeze(-1)
        return torch.zeros_like(x).index_add(0, token, ys).reshape(shape)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = Experts(cfg) if cfg.n_experts else FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.out = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:  # scaled as an output projection (N(0, 1) would give logits of std sqrt(dim))
            nn.init.normal_(self.tok.weight, std=cfg.dim ** -0.5)
            self.out.weight = self.tok.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets=None):
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.out(self.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def train(device, steps, cfg=None, batch_size=8, lr=1e-3, seed=0, compile=False):
    """Train on random token sequences from a fixed seed; returns the losses."""
    cfg = cfg or LlamaConfig()
    torch.manual_seed(seed)
    model = Llama(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    fwd = torch.compile(model, backend="tpu") if compile else model
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        data = torch.randint(0, cfg.vocab_size, (batch_size, cfg.max_seq_len + 1), generator=gen)
        x, y = data[:, :-1].to(device), data[:, 1:].to(device)
        _, loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
