"""Quantized decoding on "tpu" against torchao on the CPU, in one run (issue 40).

    .venv/bin/python bench/quant.py [--rounds 3] [--small]

A Llama-style model built from a config with random weights (~110M
parameters: hidden 768, 12 layers, 12 heads on 4 kv heads, MLP 2048, 32000
tokens, tied embeddings), in bfloat16, then each of: bfloat16 (no
quantization), torchao int8 weight-only, torchao int8 dynamic activation +
int8 weight, int4 weight-only (torch_pjrt.quant.Int4Config, groups of 32:
torchao's int4 configs need CUDA or keep one int4 per byte).  The linear
layers are quantized; the tied embedding / lm_head stays bfloat16.

For each config and batch 1 and 8: greedy decoding with a static KV cache
(transformers' generate, cache_implementation="static"): on "tpu" compiled
(transformers compiles the decode step with backend="tpu"), on the CPU
eagerly (torchao's CPU kernels; Inductor's compile of every config would take
longer than the run).  Decode tokens/s = batch * (N2 - N1) / (t(N2) - t(N1))
for N1 = 4 and N2 = 20 new tokens after a 16-token prompt, median of the
rounds.  Weight bytes: what the model's parameters hold on the device
(torch.tpu.memory_allocated), on the CPU the bytes of their tensors, and
those of the quantized linear weights alone (scales included).
Prints one JSON object.
"""
import argparse
import copy
import datetime
import json
import os
import statistics
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import torch_pjrt  # noqa: F401,E402


def build(small):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if small:
        cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=True)
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                          num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=256,
                          tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def configs():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    from torch_pjrt.quant import Int4Config

    return {"bfloat16": None, "int8_weight_only": Int8WeightOnlyConfig,
            "int8_dynamic": Int8DynamicActivationInt8WeightConfig, "int4_weight_only": lambda: Int4Config(32)}


def quantized(model, make, device):
    from torchao.quantization import quantize_

    m = copy.deepcopy(model).to(device)
    if make is not None:
        quantize_(m, make(), filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and fqn != "lm_head")
    return m


def weight_bytes(m):
    total = 0
    for p in m.parameters():
        inner = getattr(p, "tensor_data_names", None)
        parts = [getattr(p, n) for n in inner] if inner else [p]
        total += sum(t.untyped_storage().nbytes() for t in parts)
    return total


def decode_rate(m, device, batch, rounds, n1=4, n2=20):
    ids = torch.randint(0, m.config.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(batch))
    ids = ids.to(device)
    kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
    if device == "cpu":
        kw["disable_compile"] = True

    def gen(n):
        t = time.perf_counter()
        out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        out.cpu()
        return time.perf_counter() - t, out

    with torch.no_grad():
        gen(n2)  # warm-up: compiles (tpu) and fills the caches
        rates, tokens = [], None
        for _ in range(rounds):
            t1, _ = gen(n1)
            t2, out = gen(n2)
            rates.append(batch * (n2 - n1) / max(t2 - t1, 1e-9))
            tokens = out[:, ids.shape[1]:].cpu()
    return statistics.median(rates), tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a 2-layer model, for a quick check")
    args = ap.parse_args()
    base = build(args.small)
    res = {"date": datetime.date.today().isoformat(), "params": sum(p.numel() for p in base.parameters()),
           "rounds": args.rounds, "configs": {}}
    for name, make in configs().items():
        row = {}
        cpu = quantized(base, make, "cpu")
        row["cpu_weight_bytes"] = weight_bytes(cpu)
        row["linear_weight_bytes"] = sum(weight_bytes(mod) for fqn, mod in cpu.named_modules()
                                         if isinstance(mod, torch.nn.Linear) and fqn != "lm_head")
        before = torch.tpu.memory_allocated()
        tpu = quantized(base, make, "tpu")
        row["tpu_weight_bytes"] = torch.tpu.memory_allocated() - before
        for batch in (1, 8):
            torch._dynamo.reset()
            rt, tok_t = decode_rate(tpu, "tpu", batch, args.rounds)
            rc, tok_c = decode_rate(cpu, "cpu", batch, args.rounds)
            row[f"b{batch}"] = {"tpu_tok_s": round(rt, 1), "cpu_tok_s": round(rc, 1),
                                "tpu_over_cpu_time": round(rc / rt, 2),
                                "same_tokens_as_cpu": float((tok_t == tok_c).float().mean())}
        res["configs"][name] = row
        del cpu, tpu
        print(json.dumps({name: row}), flush=True)
    bf = res["configs"]["bfloat16"]
    i4 = res["configs"]["int4_weight_only"]
    res["int4_over_bfloat16_bytes"] = {"linear_weights": round(i4["linear_weight_bytes"] / bf["linear_weight_bytes"], 3),
                                       "all_parameters_on_tpu": round(i4["tpu_weight_bytes"] / bf["tpu_weight_bytes"], 3)}
    res["int8_weight_only_over_bfloat16_tok_s"] = {
        f"b{b}": round(res["configs"]["int8_weight_only"][f"b{b}"]["tpu_tok_s"] / bf[f"b{b}"]["tpu_tok_s"], 2)
        for b in (1, 8)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
