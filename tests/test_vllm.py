"""vLLM on "tpu" (torch_pjrt/vllm): the paged attention against a dense
reference, offline LLM.generate and a real `vllm serve` process against
Hugging Face generate() on the CPU, on small random-weight checkpoints saved
in a temp dir."""
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from checkpoints import hf_greedy, make_checkpoint
from util import assert_close

# make setup installs vLLM (tools/install_vllm.sh).
from torch_pjrt.vllm.attention import build_indices, paged_attention

# Prompts of different lengths (token ids under the checkpoints' vocabulary).
PROMPTS = [[5], [17, 40], [3, 9, 27, 81], [100, 101, 102, 103, 104, 105, 106], list(range(20, 33)),
           list(range(40, 62)), list(range(60, 100, 2)) + [7] * 17, list(range(130, 170))]
MAX_TOKENS = 12
# vLLM's engine on this machine: float32 (greedy tokens of bfloat16 can differ
# from HF's by rounding), a fixed small KV cache, spawned processes.
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=32 << 20, max_model_len=256, seed=0)


def _dense_reference(q, k_seqs, v_seqs, q_lens, scale):
    """Causal attention of each sequence's last q_len queries over its keys."""
    out, t = [], 0
    for k, v, ql in zip(k_seqs, v_seqs, q_lens):
        L, Hkv, _ = k.shape
        qq = q[t:t + ql]
        G = qq.shape[1] // Hkv
        kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        s = torch.einsum("qhd,lhd->hql", qq, kk) * scale
        pos = torch.arange(L - ql, L)
        s = s.masked_fill(torch.arange(L)[None, None, :] > pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hql,lhd->qhd", s.softmax(-1), vv))
        t += ql
    return torch.cat(out)


def test_paged_attention_matches_dense():
    torch.manual_seed(0)
    num_blocks, bs, Hkv, H, D = 16, 4, 2, 4, 8
    seq_lens, q_lens = [9, 6, 3, 13], [9, 1, 2, 1]  # a prefill, decodes, a chunk
    # Block tables with holes: each sequence's blocks scattered over the cache
    # (block 0 is vLLM's null block, never a sequence's).
    tables = [[5, 2, 11], [7, 3], [14], [1, 9, 4, 15]]
    kv = torch.randn(2, num_blocks, bs, Hkv, D)
    k_seqs = [kv[0][t].reshape(-1, Hkv, D)[:n] for t, n in zip(tables, seq_lens)]
    v_seqs = [kv[1][t].reshape(-1, Hkv, D)[:n] for t, n in zip(tables, seq_lens)]
    T = sum(q_lens)
    q = torch.randn(T, H, D)
    table = torch.zeros(len(tables), 6, dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, :len(t)] = torch.tensor(t)
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    slots = torch.zeros(T, dtype=torch.int64)
    idx = build_indices(qsl, seq_lens, table.numpy(), slots.numpy(), T, bs)
    q_pad = torch.zeros(idx[4].shape[0], H, D)
    q_pad[:T] = q
    ref = _dense_reference(q, k_seqs, v_seqs, q_lens, 0.3)
    ix = [torch.from_numpy(a) for a in idx[:4]]
    cpu = paged_attention(q_pad, kv, *ix, 0.3)[:T]
    torch.testing.assert_close(cpu, ref, rtol=1e-5, atol=1e-5)
    dev = [t.to("tpu") for t in [q_pad, kv] + ix]
    eager = paged_attention(*dev, 0.3)
    assert_close(eager[:T], ref, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(paged_attention, backend="tpu", fullgraph=True)(*dev, 0.3)
    assert_close(compiled[:T], ref, rtol=1e-5, atol=1e-5)


def test_paged_attention_sliding_window_and_softcap():
    torch.manual_seed(1)
    kv = torch.randn(2, 8, 4, 1, 8)
    q = torch.randn(8, 2, 8)
    idx = build_indices([0, 5], [7], [[3, 6]], [0] * 5, 5, 4)
    ix = [torch.from_numpy(a) for a in idx[:4]]
    out = paged_attention(q, kv, *ix, 0.5, sliding_window=3, logits_soft_cap=2.0)[:5]
    k = kv[0][[3, 6]].reshape(8, 1, 8)[:7].repeat_interleave(2, 1)
    v = kv[1][[3, 6]].reshape(8, 1, 8)[:7].repeat_interleave(2, 1)
    s = torch.einsum("qhd,lhd->hql", q[:5], k) * 0.5
    s = 2.0 * torch.tanh(s / 2.0)
    pos, keys = torch.arange(2, 7)[None, :, None], torch.arange(7)[None, None, :]
    s = s.masked_fill((keys > pos) | (keys <= pos - 3), float("-inf"))
    torch.testing.assert_close(out, torch.einsum("hql,lhd->qhd", s.softmax(-1), v), rtol=1e-5, atol=1e-5)
    assert_close(paged_attention(q.to("tpu"), kv.to("tpu"), *[t.to("tpu") for t in ix], 0.5, sliding_window=3,
                                 logits_soft_cap=2.0)[:5], out, rtol=1e-5, atol=1e-5)


_OFFLINE = """
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    path, prompts, engine = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(model=path, **engine)
    greedy = llm.generate([{"prompt_token_ids": p} for p in prompts],
                          SamplingParams(temperature=0, max_tokens=%d), use_tqdm=False)
    sampled = [llm.generate([{"prompt_token_ids": prompts[3]}],
                            SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=7, max_tokens=8, n=2,
                                           logprobs=2), use_tqdm=False)[0] for _ in range(2)]
    print("RESULT " + json.dumps({
        "greedy": [list(o.outputs[0].token_ids) for o in greedy],
        "sampled": [[list(c.token_ids) for c in s.outputs] for s in sampled],
        "logprobs": [len(c.logprobs) for c in sampled[0].outputs],
    }))
""" % MAX_TOKENS


def _env():
    # The engine core and workers are spawned: they find torch_pjrt by
    # autoload, and this tree's tests/ is not theirs.
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_offline_generate_matches_hf(tmp_path, arch):
    path = make_checkpoint(str(tmp_path / arch), arch)
    r = subprocess.run([sys.executable, "-c", _OFFLINE, path, json.dumps(PROMPTS), json.dumps(ENGINE)],
                       capture_output=True, text=True, timeout=900, cwd=str(tmp_path), env=_env())
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-6000:]
    got = json.loads(line[len("RESULT "):])
    assert got["greedy"] == hf_greedy(path, PROMPTS, MAX_TOKENS)
    # A seeded sampled request gives the same tokens again; n=2 gives two.
    assert got["sampled"][0] == got["sampled"][1] and len(got["sampled"][0]) == 2
    assert all(len(c) == 8 for c in got["sampled"][0])
    assert got["logprobs"] == [8, 8]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    path = make_checkpoint(str(tmp / "llama"), "llama")
    port = _free_port()
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "vllm"), "serve",
                             path, "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
                             "--kv-cache-memory-bytes", str(32 << 20), "--max-model-len", "256", "--seed", "0"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp), env=_env())
    import urllib.request

    deadline = time.time() + 600
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            break
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                log.close()
                pytest.fail("vllm serve did not start:\n" + open(tmp / "serve.log").read()[-6000:])
            time.sleep(1)
    yield path, f"http://127.0.0.1:{port}/v1", tmp / "serve.log"
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_serve_openai_completions(server):
    import openai

    path, url, log = server
    client = openai.OpenAI(base_url=url, api_key="none")
    model = client.models.list().data[0].id

    def complete(ids):
        r = client.completions.create(model=model, prompt=ids, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"return_token_ids": True})
        return r.choices[0]

    # Eight requests at once: vLLM batches them continuously.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(complete, PROMPTS))
    assert [list(c.token_ids) for c in choices] == hf_greedy(path, PROMPTS, MAX_TOKENS)
    # Streaming gives the same text.
    stream = client.completions.create(model=model, prompt=PROMPTS[5], max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == choices[5].text
    # A seeded sampled request is reproducible.
    two = [client.completions.create(model=model, prompt=PROMPTS[4], max_tokens=8, temperature=0.9, seed=11,
                                     extra_body={"return_token_ids": True}).choices[0].token_ids
           for _ in range(2)]
    assert two[0] == two[1] and len(two[0]) == 8
    assert "torch-pjrt: vLLM runs on \"tpu\"" in open(log).read()


def test_serve_openai_chat(server):
    import openai

    _, url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none")
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "hello world, how are you"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens > 0
    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content
    # vLLM's own error for a prompt longer than the context, not a crash.
    with pytest.raises(openai.BadRequestError, match="maximum context length|longer than"):
        client.completions.create(model=model, prompt=list(range(5, 300)), max_tokens=4)
