#!/usr/bin/env bash
# Installs vLLM 0.32.0 built for no device (VLLM_TARGET_DEVICE=empty) into the
# Python environment of $1 (default: python3): pure Python, no CUDA kernels,
# no torch requirement of its own, so it sits beside torch==2.13.0 CPU.
# torch-pjrt's platform plugin (torch_pjrt/vllm) is its device.
#
# pip cannot install this build by name (its version is 0.32.0+empty, not the
# 0.32.0 the index lists), so the source distribution is named by URL and
# checked by hash.
set -euo pipefail
PY=${1:-python3}
VERSION=0.32.0
URL=https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz
SHA256=d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
if [ "$("$PY" -c 'from importlib.metadata import version; print(version("vllm"))' 2>/dev/null)" = "$VERSION+empty" ]; then
  exit 0
fi
# vLLM's build requirements (its pyproject.toml), installed here because the
# build runs without isolation (an isolated one would fetch a CUDA torch).
"$PY" -m pip install -q "setuptools>=77.0.3,<81" "setuptools-scm>=8" "cmake>=3.26.1" ninja "setuptools-rust>=1.9" jinja2 wheel
VLLM_TARGET_DEVICE=empty "$PY" -m pip install -q --no-build-isolation "vllm @ $URL#sha256=$SHA256"
