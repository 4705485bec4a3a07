"""The persistent cache of compiled programs, across processes."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, torch, torch_pjrt
x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("tpu")
f = torch.compile(lambda a: (a @ a.t() + 1).relu().sum(), backend="tpu")
y = f(x).item() + (x * 2 - 1).sum().item()
m = torch_pjrt.metrics()
print(json.dumps({"y": y, "compiles": m["compiles"], "disk_hits": m["disk_hits"],
                  "corrupt": m["disk_corrupt_dropped"]}))
"""

def _run(cache_dir, background=False, **extra_env):
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache_dir), TF_CPP_MIN_LOG_LEVEL="2", **extra_env)
    cmd = [sys.executable, "-c", SCRIPT]
    if background:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _expected():
    import torch

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return (x @ x.t() + 1).relu().sum().item() + (x * 2 - 1).sum().item()


def test_second_process_hits_disk_cache(tmp_path):
    first = _run(tmp_path)
    assert first["compiles"] > 0 and first["disk_hits"] == 0
    second = _run(tmp_path)
    assert second["compiles"] == 0
    assert second["disk_hits"] == first["compiles"]
    assert first["y"] == second["y"] == _expected()


def test_xla_flags_are_part_of_the_key(tmp_path):
    """XLA_FLAGS change code generation: other flags must not reuse entries."""
    first = _run(tmp_path, XLA_FLAGS="")
    other = _run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert other["disk_hits"] == 0 and other["compiles"] == first["compiles"]
    again = _run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert again["compiles"] == 0 and again["disk_hits"] == first["compiles"]


def test_corrupt_entries_are_recompiled(tmp_path):
    first = _run(tmp_path)
    files = [p for p in tmp_path.iterdir() if p.suffix == ".tpc"]
    assert files
    for i, p in enumerate(files):
        data = bytearray(p.read_bytes())
        if i % 2:
            data = data[: len(data) // 2]  # truncated
        else:
            data[-1] ^= 0xFF  # flipped payload byte
        p.write_bytes(bytes(data))
    again = _run(tmp_path)
    assert again["y"] == first["y"]
    assert again["compiles"] == first["compiles"]
    assert again["corrupt"] == len(files)


def test_concurrent_writers(tmp_path):
    procs = [_run(tmp_path, background=True) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["y"] == _expected() for o in outs)
    third = _run(tmp_path)
    assert third["compiles"] == 0


def test_unusable_directory_warns_and_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(blocker / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "will not be cached on disk" in r.stderr and str(blocker) in r.stderr


def test_default_location_follows_xdg(tmp_path, monkeypatch):
    import torch_pjrt

    monkeypatch.delenv("TORCH_PJRT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert torch_pjrt.default_cache_dir() == os.path.join(str(tmp_path), "torch_pjrt")
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", "0")
    assert torch_pjrt.default_cache_dir() is None


def test_program_cache_is_capped_and_evicted_programs_come_back(tmp_path):
    """The in-memory program cache keeps at most TORCH_PJRT_PROGRAM_CACHE_SIZE
    programs (each XLA:CPU executable holds memory mappings; thousands of them
    crash the plugin at vm.max_map_count); evicted ones reload from disk."""
    code = (
        "import json, torch, torch_pjrt\n"
        "for i in list(range(1, 41)) + list(range(1, 41, 3)):\n"
        "    x = torch.randn(i)\n"
        "    torch.testing.assert_close((x.to('tpu') * 2 + 1).sin().cpu(), (x * 2 + 1).sin())\n"
        "m = torch_pjrt.metrics()\n"
        "print(json.dumps({'cached': m['cached_programs'], 'disk_hits': m['disk_hits']}))\n")
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path), TORCH_PJRT_PROGRAM_CACHE_SIZE="16")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cached"] == 16
    assert out["disk_hits"] > 0  # the second pass found its programs evicted, and loaded them
