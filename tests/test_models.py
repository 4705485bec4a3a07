"""Models on "tpu", eager and compiled, against CPU from the same seed."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import dlrm  # noqa: E402
import llama  # noqa: E402
import mingpt  # noqa: E402
import qwen  # noqa: E402
from util import all_graphs_lowered, one_program_per_call  # noqa: E402

REL = 1e-4  # relative loss difference allowed at every step


def _close(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= REL * abs(y), f"step {i}: {x} vs {y}"


def test_llama_eager_and_compiled_match_cpu():
    cpu = llama.train("cpu", 10)
    _close(llama.train("tpu", 10), cpu)
    _close(llama.train("tpu", 10, compile=True), cpu)
    assert cpu[-1] < cpu[0] + 0.5  # sane values


def test_mixture_of_experts_llama_eager_and_compiled_match_cpu():
    """A Mixtral-style decoder (examples/llama.py with n_experts): top-2
    routing, integer histc and grouped_mm on tpu, 10 AdamW steps."""
    cfg = llama.LlamaConfig(n_experts=4)
    cpu = llama.train("cpu", 10, cfg)
    _close(llama.train("tpu", 10, cfg), cpu)
    with all_graphs_lowered():
        _close(llama.train("tpu", 10, cfg, compile=True), cpu)
    assert cpu[-1] < cpu[0]


@pytest.mark.parametrize("name", sorted(qwen.CONFIGS))
def test_qwen_eager_and_compiled_match_cpu(name):
    """examples/qwen.py's decoders: q/k/v biases (Qwen2), per-head q/k
    RMSNorm and an independent head size (Qwen3), routed experts (Qwen3-MoE),
    tied embeddings and grouped-query causal SDPA, 10 AdamW steps; the
    compiled step is one program per graph."""
    make = qwen.CONFIGS[name]
    cpu = llama.train("cpu", 10, make())
    _close(llama.train("tpu", 10, make()), cpu)
    with all_graphs_lowered():
        _close(llama.train("tpu", 10, make(), compile=True), cpu)
    m = llama.Llama(make())
    assert m.out.weight is m.tok.weight
    assert m.to("tpu").out.weight is m.tok.weight  # the tie survives the move


def test_llama_forward_compiled_matches_cpu():
    cfg = llama.LlamaConfig()
    torch.manual_seed(0)
    m = llama.Llama(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    ref, _ = m(idx)
    cm = torch.compile(m.to("tpu"), backend="tpu")
    with torch.no_grad():
        out, _ = cm(idx.to("tpu"))
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-4, atol=1e-5)


def test_mingpt_compiled_matches_cpu():
    cfg = mingpt.GPTConfig()
    data, vocab = mingpt.dataset(cfg.block_size)
    cfg.vocab_size = vocab

    def run(device, compile):
        torch.manual_seed(0)
        m = mingpt.GPT(cfg).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        fwd = torch.compile(m, backend="tpu") if compile else m
        gen = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(10):
            x, y = mingpt.get_batch(data, cfg.block_size, 8, gen)
            _, loss = fwd(x.to(device), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    _close(run("tpu", True), run("cpu", False))


def test_whole_training_step_compiled():
    """forward, backward and the AdamW step in one torch.compile'd function."""
    cfg = mingpt.GPTConfig()

    def run(device, compile_step):
        torch.manual_seed(0)
        m = mingpt.GPT(cfg).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

        def step(x, y):
            _, loss = m(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        if compile_step:
            step = torch.compile(step, backend="tpu")
        g = torch.Generator().manual_seed(0)
        out = []
        for _ in range(4):
            d = torch.randint(0, cfg.vocab_size, (4, cfg.block_size + 1), generator=g)
            out.append(step(d[:, :-1].to(device), d[:, 1:].to(device)).item())
        return out

    _close(run("tpu", True), run("cpu", False))


# DLRM: EmbeddingBag sums (offsets input, empty bags included), bmm
# interactions with triu index selection, BCEWithLogits.  Outputs and weights
# (embedding tables included: the embedding_bag backward) within rtol 1e-4,
# atol 1e-6.


def _close_params(mt, mc):
    for (n, pc), pt in zip(mc.named_parameters(), mt.parameters()):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_dlrm_eager_matches_cpu():
    cfg = dlrm.DLRMConfig()
    torch.manual_seed(0)
    m = dlrm.DLRM(cfg)
    batch = dlrm.get_batch(cfg, 8, torch.Generator().manual_seed(1))
    assert any((o[1:] == o[:-1]).any() for o in batch[2]), "the batch should hold empty bags"
    mt = dlrm.DLRM(cfg).to("tpu")
    mt.load_state_dict(m.state_dict())
    ref, lref = m(*batch)
    out, lout = mt(*dlrm.to(batch, "tpu"))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-6)
    _close([lout.item()], [lref.item()])

    mc, cpu = dlrm.train("cpu", 5)
    mt, tpu = dlrm.train("tpu", 5)
    _close(tpu, cpu)
    _close_params(mt, mc)


def test_dlrm_compiled_matches_cpu():
    mc, cpu = dlrm.train("cpu", 5)
    with all_graphs_lowered():
        mt, tpu = dlrm.train("tpu", 5, compile=True)
    _close(tpu, cpu)
    _close_params(mt, mc)

    batch = dlrm.get_batch(mc.cfg, 8, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, _ = mc(*batch)
    with all_graphs_lowered():
        out, _ = one_program_per_call(torch.compile(mt, backend="tpu"), *dlrm.to(batch, "tpu"))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-6)
