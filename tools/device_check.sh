#!/usr/bin/env bash
# Run torch-pjrt on a machine with another PJRT plugin (the CUDA plugin of
# jax-cuda13-pjrt on a lent GPU machine): build the C core, the CPython module
# and the glue against that machine's python3/torch, then a smoke test.
# Needs build/pjrt_include/pjrt_c_api.h carried from the xla-cpu-pjrt wheel.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
PY=python3
PLUGIN=$($PY - <<'P'
import glob, os, site
c = []
for d in site.getsitepackages():
    c += glob.glob(os.path.join(d, "jax_plugins", "*cuda*", "*.so"))
print(next((p for p in c if "plugin" in os.path.basename(p)), c[0] if c else ""))
P
)
echo "plugin: $PLUGIN"; nvidia-smi -L || true
$PY -c "import torch; print('torch', torch.__version__)"
INC=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
TD=$($PY -c "import os, torch; print(os.path.dirname(torch.__file__))")
EXT=torch_pjrt
set -e
gcc -std=c11 -Wall -Wextra -D_GNU_SOURCE -O2 -fPIC -shared -Ibuild/pjrt_include -o $EXT/libtpcore.so csrc/core/*.c -ldl -lpthread -lm
gcc -std=c11 -Wall -Wextra -D_GNU_SOURCE -O2 -fPIC -shared -Icsrc/core -I"$INC" -o $EXT/_C.so csrc/python/module.c -L$EXT -ltpcore -Wl,-rpath,'$ORIGIN'
g++ -std=c++20 -O2 -fPIC -shared -Wno-unused-parameter -D_GLIBCXX_USE_CXX11_ABI=1 -Icsrc/core -I"$TD/include" \
  -I"$TD/include/torch/csrc/api/include" -o $EXT/_glue.so csrc/glue/*.cpp -L$EXT -ltpcore -L"$TD/lib" -lc10 -ltorch -ltorch_cpu \
  -Wl,-rpath,'$ORIGIN' -Wl,-rpath,"$TD/lib"
set +e
export TORCH_PJRT_PLUGIN="$PLUGIN" TORCH_PJRT_CACHE_DIR=/tmp/tpc TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH=$PWD:$PWD/examples
$PY - <<'P'
import time, torch, torch_pjrt
print("device:", torch.tpu.get_device_name(), "count", torch.tpu.device_count())
x = torch.randn(256, 256); y = torch.randn(256, 256)
t = (x.to("tpu") @ y.to("tpu")).relu().sum(0)
print("matmul+relu+sum max err", (t.cpu() - (x @ y).relu().sum(0)).abs().max().item())
a = torch.arange(24.).reshape(4, 6); ta = a.to("tpu"); ta[1:3, ::2] = -1; a[1:3, ::2] = -1
print("view write ok", torch.equal(ta.cpu(), a))
from mingpt import GPTConfig, train
c = train("cpu", 20, GPTConfig()); g = train("tpu", 20, GPTConfig())
print("minGPT max rel loss diff", max(abs(p - q) / abs(q) for p, q in zip(g, c)))
k = train("tpu", 20, GPTConfig(), compile=True)
print("minGPT compiled max rel loss diff", max(abs(p - q) / abs(q) for p, q in zip(k, c)))
for name, steps in (("eager", 100), ("compiled", 100)):
    t0 = time.perf_counter(); train("tpu", steps, GPTConfig(), compile=name == "compiled"); torch.tpu.synchronize()
    print(f"minGPT {name}: {steps} steps in {time.perf_counter() - t0:.2f} s")
print(torch_pjrt.metrics_report())
P
$PY bench/eager_overhead.py --iters 300 --no-inductor > "$OUT/eager_overhead_gpu.json" && cat "$OUT/eager_overhead_gpu.json"
