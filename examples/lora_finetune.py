"""LoRA fine-tuning of a small Llama on "tpu" with PEFT, beside the same run on the CPU.

    python examples/lora_finetune.py [--quant int8|int4] [--compile] [--steps 30]

A Llama (transformers) built from a config with random weights, a byte-level
BPE tokenizer trained (tokenizers) on the short text below, and LoRA adapters
(PEFT) on the attention and MLP projections; the base stays frozen.
`--quant int8` / `--quant int4` quantize the base first (QLoRA-style:
torchao's Int8WeightOnlyConfig, or torch_pjrt.quant.Int4Config, two int4
weights per byte); `--compile` trains the model through
torch.compile(backend="tpu"); `--checkpointing` recomputes activations in
the backward.  Prints each step's loss on "tpu" and on the CPU, then saves
the adapters, loads them back onto "tpu" and merges them into the base.
Nothing is downloaded.
"""
import argparse
import os
import tempfile

import torch

import torch_pjrt  # noqa: F401  (import torch alone loads it when installed)

TEXT = """\
The tide came in slowly over the flat grey sand, filling the footprints one by one.
A heron stood in the shallows and did not move, as if it had been placed there.
Far out, a small boat turned toward the harbour while the light went copper.
The lighthouse keeper climbed the stairs, counted them as always, and lit the lamp.
Children ran along the sea wall, shouting names the wind carried away.
By nightfall the beach was smooth again, as though nobody had walked there at all.
"""


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def build(base_dir, device, quant, checkpointing):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, TorchAoConfig

    kw = {}
    if quant == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        kw["quantization_config"] = TorchAoConfig(Int8WeightOnlyConfig())
    elif quant == "int4":
        from torch_pjrt.quant import Int4Config

        kw["quantization_config"] = TorchAoConfig(Int4Config(group_size=32))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_dir, device_map=device, **kw)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(base, lora)


def train(model, ids, device, steps, compiled):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    run = torch.compile(model, backend="tpu") if compiled and device == "tpu" else model
    batch = ids.to(device)
    losses = []
    for _ in range(steps):
        loss = run(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quant", choices=["none", "int8", "int4"], default="none")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--checkpointing", action="store_true")
    args = ap.parse_args()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    ids = torch.tensor([tok.encode(line).ids[:24] for line in TEXT.splitlines() if line])
    ids = ids[:, : min(len(r) for r in ids)]
    work = tempfile.mkdtemp(prefix="lora_finetune_")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(os.path.join(work, "base"))

    results = {}
    for device in ("cpu", "tpu"):
        torch._dynamo.reset()
        model = build(os.path.join(work, "base"), device, args.quant, args.checkpointing)
        results[device] = (model, train(model, ids, device, args.steps, args.compile))
    print(f"LoRA on a {sum(p.numel() for p in results['cpu'][0].parameters()) / 1e6:.2f}M-parameter Llama, "
          f"base {args.quant}, {'compiled' if args.compile else 'eager'}; "
          f"{sum(p.numel() for p in results['cpu'][0].parameters() if p.requires_grad)} trainable")
    print(f"{'step':>4}  {'tpu loss':>10}  {'cpu loss':>10}")
    for i, (a, b) in enumerate(zip(results["tpu"][1], results["cpu"][1])):
        print(f"{i:4d}  {a:10.5f}  {b:10.5f}")
    worst = max(abs(a - b) for a, b in zip(results["tpu"][1], results["cpu"][1]))
    print(f"largest |tpu - cpu| loss difference: {worst:.2e}")

    model = results["tpu"][0]
    model.save_pretrained(os.path.join(work, "adapter"))
    base = AutoModelForCausalLM.from_pretrained(os.path.join(work, "base"), device_map="tpu")
    loaded = PeftModel.from_pretrained(base, os.path.join(work, "adapter"), torch_device="tpu")
    with torch.no_grad():
        batch = ids.to("tpu")
        trained = model(input_ids=batch, labels=batch).loss.item()
        reloaded = loaded(input_ids=batch, labels=batch).loss.item()
        merged = loaded.merge_and_unload()(input_ids=batch, labels=batch).loss.item()
    print(f"loss after training {trained:.5f}; adapters saved and loaded on tpu {reloaded:.5f}; merged {merged:.5f}")
    if args.quant != "none":
        print("(the loaded and merged models use the float base: the adapters were trained on a quantized one)")


if __name__ == "__main__":
    main()
