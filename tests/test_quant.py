"""Quantized models and LoRA fine-tuning on "tpu" (issue 40): torchao's
configs and torch_pjrt.quant's, Hugging Face's TorchAoConfig and GGUF
checkpoints, safetensors straight to the device, PEFT LoRA over float and
quantized bases, the Trainer.  Each result against the same thing on the CPU.
"""
import copy
import re
import warnings

import pytest
import torch

import torch_pjrt

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402

from torch_pjrt.quant import Int4Config, Int4PackedTensor  # noqa: E402

CONFIGS = {
    "int8_weight_only": Int8WeightOnlyConfig,
    "int8_dynamic": Int8DynamicActivationInt8WeightConfig,
    "intx_int4_g32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "intx_int8": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
    "float8_weight_only": Float8WeightOnlyConfig,
    "tp_int4_g32": lambda: Int4Config(32),
}
# (rtol, atol) of a "tpu" model's output against the CPU's, both quantized the
# same way: float32 products in a different order; bfloat16 products rounded once.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}


def _mlp(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32)).to(dtype)


def _data(w):
    """The plain tensors a torchao weight holds (qdata, scales, ...)."""
    return {n: getattr(w, n) for n in w.tensor_data_names}


def _counts():
    m = torch_pjrt.metrics()
    return m["graphs_lowered"], m["graphs_split"], m["graphs_eager"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_torchao_config_matches_cpu_eager_and_compiled(name, dtype):
    """Quantized on "tpu", the weights' integer data and scales are the CPU's
    (exactly); the model's output matches the CPU's eagerly and compiled, and
    each compiled graph is one program."""
    m = _mlp(dtype)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    cpu = copy.deepcopy(m)
    quantize_(cpu, CONFIGS[name]())
    expected = cpu(x)
    tpu = copy.deepcopy(m).to("tpu")
    quantize_(tpu, CONFIGS[name]())
    for lin_c, lin_t in ((cpu[0], tpu[0]), (cpu[2], tpu[2])):
        assert type(lin_t.weight) is type(lin_c.weight)
        for k, v in _data(lin_c.weight).items():
            got = _data(lin_t.weight)[k]
            assert got.device.type == "tpu"
            assert torch.equal(got.cpu(), v), f"{k} differs from the CPU's"
    rtol, atol = TOL[dtype]
    with torch.no_grad():
        torch.testing.assert_close(tpu(x.to("tpu")).cpu(), expected, rtol=rtol, atol=atol)
        before = _counts()
        torch._dynamo.reset()
        compiled = torch.compile(tpu, backend="tpu")(x.to("tpu")).cpu()
        after = _counts()
    torch.testing.assert_close(compiled, expected, rtol=rtol, atol=atol)
    assert after[1:] == before[1:], "a compiled graph was split or ran op by op"
    assert after[0] > before[0]


@pytest.mark.parametrize("shape", [(1, 64, 32), (2, 96, 8), (9, 2048, 40), (33, 1100, 17)])
def test_int_mm_is_exact(shape):
    """torch._int_mm (what torchao's int8 x int8 products run as): int32
    results equal the CPU's, the extreme values included."""
    m, k, n = shape
    g = torch.Generator().manual_seed(m)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    a[0] = -128
    b[:, 0] = -128
    expected = a.to(torch.int32) @ b.to(torch.int32)
    got = torch._int_mm(a.to("tpu"), b.to("tpu"))
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), expected)
    assert got[0, 0].item() == k * 128 * 128
    torch._dynamo.reset()
    compiled = torch.compile(torch._int_mm, backend="tpu")(a.to("tpu"), b.to("tpu"))
    assert torch.equal(compiled.cpu(), expected)


def test_int_mm_rejects_other_dtypes():
    a = torch.ones(4, 8, device="tpu")
    with pytest.raises(RuntimeError, match="int8"):
        torch._int_mm(a, a.t())


def test_int4_weights_take_under_a_third_of_bfloat16():
    """Int4Config stores two weights per byte: weights + scales <= 0.3x of
    the bfloat16 weights' bytes on the device (memory_allocated)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(4)]).to(torch.bfloat16)
    before = torch.tpu.memory_allocated()
    mt = m.to("tpu")
    bf16 = torch.tpu.memory_allocated() - before
    assert bf16 == 4 * 512 * 512 * 2
    quantize_(mt, Int4Config(32))
    int4 = torch.tpu.memory_allocated() - before
    assert isinstance(mt[0].weight, Int4PackedTensor)
    assert mt[0].weight.qdata.dtype == torch.uint8 and mt[0].weight.qdata.shape == (512, 256)
    assert int4 <= 0.3 * bf16, f"int4 {int4} bytes vs bfloat16 {bf16}"


def test_int4_config_is_torchaos_int4():
    """Int4Config's values are torchao's IntxWeightOnlyConfig int4 values,
    repacked: the same outputs, on the CPU and on "tpu"."""
    m = _mlp(torch.float32)
    x = torch.randn(4, 64)
    ref = copy.deepcopy(m)
    quantize_(ref, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    ours = copy.deepcopy(m)
    quantize_(ours, Int4Config(32))
    assert torch.equal(ours[0].weight.unpacked(), ref[0].weight.qdata)
    assert torch.equal(ours(x), ref(x))
    moved = copy.deepcopy(ours).to("tpu")  # quantized on the CPU, then moved
    torch.testing.assert_close(moved(x.to("tpu")).cpu(), ref(x), rtol=1e-5, atol=1e-5)


def test_int4_config_refuses_what_it_cannot_pack():
    with pytest.raises(ValueError, match="group_size"):
        Int4Config(7)
    m = torch.nn.Sequential(torch.nn.Linear(48, 8))
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_(m, Int4Config(32))


def _text(r):
    """repr's text without the device suffix and line layout."""
    r = re.sub(r"\s+", " ", r.replace("device='tpu:0'", ""))
    return re.sub(r",\s*\)", ")", re.sub(r",\s*,", ",", r))


def test_printing_reads_the_device_once():
    """repr of a tpu tensor: the CPU's text, read from the device in one
    copy (at most 2 transfers), not one read per value (torchao formats its
    int8 activations on every product)."""
    torch.manual_seed(0)
    cases = [torch.randn(4, 5), torch.randn(8, 512), torch.randn(3, 40, 50) * 1e6, torch.arange(3000),
             torch.randn(1500).to(torch.bfloat16), torch.randn(30, 40)[:, ::2], torch.empty(0, 3),
             torch.randint(0, 2, (2000,)).bool(), torch.randn(7, 1, 2000)]
    for c in cases:
        t = c.to("tpu")
        before = torch_pjrt._C.stats()["d2h_transfers"]
        text = repr(t)
        reads = torch_pjrt._C.stats()["d2h_transfers"] - before
        assert _text(text) == _text(repr(c)), text
        assert reads <= 2, f"{reads} device reads printing {tuple(c.shape)}"


# ---- safetensors, Hugging Face, GGUF ------------------------------------------------------------


def test_safetensors_load_straight_to_tpu(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    d = {"a": torch.randn(3, 4), "b": torch.arange(5), "c": torch.randn(2, 2).to(torch.bfloat16)}
    p = str(tmp_path / "x.safetensors")
    save_file(d, p, metadata={"k": "v"})
    for dev in ("tpu", "tpu:0", torch.device("tpu", 0)):
        out = load_file(p, device=dev)
        assert out.keys() == d.keys()
        for k, v in out.items():
            assert v.device.type == "tpu" and torch.equal(v.cpu(), d[k])
    with safe_open(p, "pt", device="tpu") as f:
        assert sorted(f.keys()) == ["a", "b", "c"] and f.metadata() == {"k": "v"}
        assert torch.equal(f.get_tensor("b").cpu(), d["b"])
        s = f.get_slice("a")
        assert s.get_shape() == [3, 4]
        part = s[1:3, :2]
        assert part.device.type == "tpu" and torch.equal(part.cpu(), d["a"][1:3, :2])
    assert load_file(p)["a"].device.type == "cpu"  # other devices: safetensors' own path
    with pytest.raises(Exception, match="invalid"):
        load_file(p, device="nosuchdevice")


def _llama_dir(tmp_path, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    path = str(tmp_path / "base")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize("qname", ["int8_weight_only", "tp_int4_g32"])
def test_hf_torchao_config_loads_on_tpu_and_saves(tmp_path, qname):
    """from_pretrained(quantization_config=TorchAoConfig(...), device_map="tpu")
    loads quantized onto the device; save_pretrained (safetensors and
    pickle) and loading back keep the quantized model."""
    from transformers import AutoModelForCausalLM, TorchAoConfig

    base = _llama_dir(tmp_path)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    q = TorchAoConfig(CONFIGS[qname]())
    cpu = AutoModelForCausalLM.from_pretrained(base, quantization_config=q)
    tpu = AutoModelForCausalLM.from_pretrained(base, quantization_config=q, device_map="tpu")
    w = tpu.model.layers[0].self_attn.q_proj.weight
    assert type(w) is type(cpu.model.layers[0].self_attn.q_proj.weight) and w.device.type == "tpu"
    expected = cpu(ids).logits
    with torch.no_grad():
        torch.testing.assert_close(tpu(ids.to("tpu")).logits.cpu(), expected, rtol=1e-5, atol=1e-5)
        for safe in (True, False):
            out = str(tmp_path / f"q_{safe}")
            tpu.save_pretrained(out, safe_serialization=safe)
            back = AutoModelForCausalLM.from_pretrained(out, device_map="tpu")
            assert type(back.model.layers[0].self_attn.q_proj.weight) is type(w)
            torch.testing.assert_close(back(ids.to("tpu")).logits.cpu(), expected, rtol=1e-5, atol=1e-5)


def _write_gguf(path, rng):
    """A llama GGUF checkpoint from random weights: Q8_0 (quantized by the gguf
    package) for the attention and embeddings, Q4_K (random blocks: d and
    dmin as small float16, random 6-bit scales and 4-bit values) for the MLP."""
    import gguf
    import numpy as np

    h, inter, layers, heads, kv, vocab = 256, 512, 2, 4, 2, 128
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(h)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(h // heads)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)

    def add(name, shape, kind):
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if kind == "f32":
            w.add_tensor(name, x)
        elif kind == "q8_0":
            w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            rows, cols = shape
            blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
            blocks[:, :4] = (rng.random((len(blocks), 2)) * 0.01).astype(np.float16).view(np.uint8)
            w.add_tensor(name, blocks.reshape(rows, cols // 256 * 144), raw_dtype=gguf.GGMLQuantizationType.Q4_K)

    add("token_embd.weight", (vocab, h), "q8_0")
    add("output_norm.weight", (h,), "f32")
    add("output.weight", (vocab, h), "q8_0")
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (h,), "f32")
        add(f"blk.{i}.ffn_norm.weight", (h,), "f32")
        add(f"blk.{i}.attn_q.weight", (h, h), "q8_0")
        add(f"blk.{i}.attn_k.weight", (kv * h // heads, h), "q8_0")
        add(f"blk.{i}.attn_v.weight", (kv * h // heads, h), "q8_0")
        add(f"blk.{i}.attn_output.weight", (h, h), "q8_0")
        add(f"blk.{i}.ffn_gate.weight", (inter, h), "q4_k")
        add(f"blk.{i}.ffn_up.weight", (inter, h), "q4_k")
        add(f"blk.{i}.ffn_down.weight", (h, inter), "q4_k")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_checkpoint_generates_the_cpus_tokens(tmp_path):
    pytest.importorskip("gguf")
    import numpy as np
    from transformers import AutoModelForCausalLM

    _write_gguf(str(tmp_path / "m.gguf"), np.random.default_rng(0))
    cpu = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    tpu = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", device_map="tpu")
    assert tpu.model.layers[0].mlp.up_proj.weight.device.type == "tpu"
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    expected = cpu.generate(ids, max_new_tokens=10, do_sample=False)
    got = tpu.generate(ids.to("tpu"), max_new_tokens=10, do_sample=False)
    assert torch.equal(got.cpu(), expected)


# ---- LoRA fine-tuning ---------------------------------------------------------------------------


def _lora_losses(base_dir, dev, qname, compiled, checkpointing, steps=3, save_to=None):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, TorchAoConfig

    torch.manual_seed(1)
    torch._dynamo.reset()
    kw = {"quantization_config": TorchAoConfig(CONFIGS[qname]())} if qname else {}
    base = AutoModelForCausalLM.from_pretrained(base_dir, device_map=dev, **kw)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                            lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    run = torch.compile(model, backend="tpu") if compiled else model
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0)).to(dev)
    losses = []
    for _ in range(steps):
        out = run(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    if save_to:
        model.save_pretrained(save_to)
    return losses, model


@pytest.mark.parametrize("qname,compiled,checkpointing", [
    (None, False, False), (None, True, True), ("int8_weight_only", False, True),
    ("int8_weight_only", True, False), ("tp_int4_g32", False, False), ("tp_int4_g32", True, True)])
def test_lora_trains_with_the_cpus_losses(tmp_path, qname, compiled, checkpointing):
    """PEFT LoRA over a float, int8 or int4 (QLoRA-style: frozen, quantized)
    base, eager and compiled, with and without gradient checkpointing."""
    base = _llama_dir(tmp_path)
    before = _counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected, _ = _lora_losses(base, "cpu", qname, False, checkpointing)
        got, model = _lora_losses(base, "tpu", qname, compiled, checkpointing)
    ours = [str(w.message) for w in caught if str(w.message).startswith("torch-pjrt: running")]  # graphs cut or op by op
    assert not ours, ours
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
    assert got[-1] < got[0]
    if compiled:
        after = _counts()
        assert after[1:] == before[1:] and after[0] > before[0]
    assert all(p.device.type == "tpu" for p in model.parameters())


def test_lora_adapters_save_load_and_merge(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _llama_dir(tmp_path)
    _, trained = _lora_losses(base, "tpu", None, False, False, save_to=str(tmp_path / "adapter"))
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3)).to("tpu")
    with torch.no_grad():
        expected = trained(input_ids=ids).logits.cpu()
        fresh = AutoModelForCausalLM.from_pretrained(base, device_map="tpu")
        loaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter"), torch_device="tpu")
        lora = [p for n, p in loaded.named_parameters() if "lora_A" in n]
        assert lora and all(p.device.type == "tpu" for p in lora)
        torch.testing.assert_close(loaded(input_ids=ids).logits.cpu(), expected, rtol=1e-5, atol=1e-5)
        merged = loaded.merge_and_unload()
        assert not any("lora" in n for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=ids).logits.cpu(), expected, rtol=1e-4, atol=1e-4)


class _TokenData(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.clone(), "attention_mask": torch.ones(16, dtype=torch.long)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_trainer_trains_on_tpu(tmp_path, compiled):
    """transformers.Trainer picks "tpu:0" (through the torch_tpu name) and
    trains a LoRA model with the CPU's losses; compiled with
    `model.compile(backend="tpu")`, which keeps forward's signature (a
    torch.compile'd OptimizedModule shows (*args, **kwargs), so the Trainer's
    remove_unused_columns drops every column: PyTorch's and transformers'
    behaviour on any device)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    base = _llama_dir(tmp_path)
    losses = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(1)
        torch._dynamo.reset()
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        if compiled and dev == "tpu":
            model.compile(backend="tpu")
        args = TrainingArguments(output_dir=str(tmp_path / dev), per_device_train_batch_size=2, max_steps=3,
                                 learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                                 use_cpu=dev == "cpu", disable_tqdm=True)
        assert args.device.type == dev
        trainer = Trainer(model=model, args=args, train_dataset=_TokenData())
        trainer.train()
        losses[dev] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert next(model.parameters()).device.type == dev
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-4, atol=1e-4)
    assert TrainingArguments(output_dir=str(tmp_path / "bf16"), bf16=True, report_to=[]).device.type == "tpu"


def test_lora_finetune_example_runs(tmp_path):
    """examples/lora_finetune.py as a user runs it: "tpu" losses beside the CPU's."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "lora_finetune.py"), "--steps", "3"],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    worst = float(re.search(r"largest \|tpu - cpu\| loss difference: (\S+)", r.stdout).group(1))
    assert worst < 1e-4, r.stdout
    assert "adapters saved and loaded on tpu" in r.stdout
