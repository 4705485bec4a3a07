"""Small Qwen2-, Qwen3- and Qwen3-MoE-style decoders (random init from a
config), trained on "tpu", eagerly and compiled, and on the CPU, from the same
seed; prints the losses side by side.

    .venv/bin/python examples/qwen.py [--steps N]

They are examples/llama.py's decoder with the options Qwen's models use:
- Qwen2: biases on the q, k and v projections;
- Qwen3: no biases, an RMSNorm over each head's q and k before the rotary
  embedding, and a head size independent of the model width;
- Qwen3-MoE: Qwen3's attention with top-k routed SwiGLU experts;
- all: tied input and output embeddings, rotary base 1e6, RMSNorm eps 1e-6,
  and attention through F.scaled_dot_product_attention (grouped-query,
  causal), as Hugging Face's Qwen models call it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402,F401

from llama import LlamaConfig, train  # noqa: E402

_QWEN = dict(tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6, sdpa=True)


def qwen2_config(**kw):
    return LlamaConfig(**{**_QWEN, "qkv_bias": True, **kw})


def qwen3_config(**kw):
    return LlamaConfig(**{**_QWEN, "qk_norm": True, "head_dim": 32, **kw})


def qwen3_moe_config(**kw):
    return qwen3_config(**{"n_experts": 4, "top_k": 2, **kw})


CONFIGS = {"qwen2": qwen2_config, "qwen3": qwen3_config, "qwen3_moe": qwen3_moe_config}


def main():
    import torch_pjrt  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    status = 0
    for name, make in CONFIGS.items():
        cpu = train("cpu", args.steps, make())
        eager = train("tpu", args.steps, make())
        compiled = train("tpu", args.steps, make(), compile=True)
        worst = max(abs(a - c) / abs(c) for run in (eager, compiled) for a, c in zip(run, cpu))
        print(f"{name}: loss {cpu[0]:.4f} -> {cpu[-1]:.4f} on cpu; tpu eager {eager[-1]:.4f}, "
              f"compiled {compiled[-1]:.4f}; largest relative difference {worst:.1e}")
        status |= worst > 1e-4
    sys.exit(status)


if __name__ == "__main__":
    main()
