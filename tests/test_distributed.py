"""torch.distributed on "tpu" (the "tpu" backend, torch_pjrt/distributed.py):
collectives, DDP (eager, its options, compiled), FSDP2, tensor parallelism
(also compiled) and pipeline stages on two ranks, each against the CPU.  One group of two processes runs every scenario
(tests/dist_worker.py); each test reads its scenario's result."""
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dist_worker


def _run_ranks(d, backend="tpu", names=None):
    """Every rank's {scenario: None or its traceback}."""
    ctx = mp.start_processes(dist_worker.run, args=(str(d / "store"), str(d), backend, names),
                             nprocs=dist_worker.WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + 600
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish in 600 s")
    return [json.load(open(d / f"rank{r}.json")) for r in range(dist_worker.WORLD)]


def _check(results, name):
    for rank, res in enumerate(results):
        assert res[name] is None, f"rank {rank}:\n{res[name]}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run_ranks(tmp_path_factory.mktemp("dist"))


@pytest.mark.parametrize("name", sorted(dist_worker.SCENARIOS))
def test_scenario(results, name):
    _check(results, name)


@pytest.mark.parametrize("backend", ["gloo", None, "cpu:gloo,tpu:tpu"])
def test_other_groups_serve_tpu_tensors(tmp_path, backend):
    """init_process_group("gloo") (what scripts pick without CUDA),
    init_process_group() without a backend, and one backend per device:
    tpu tensors, CPU tensors and DDP work in each."""
    results = _run_ranks(tmp_path, backend, ["collectives", "ddp"])
    _check(results, "collectives")
    _check(results, "ddp")


def test_backend_is_registered():
    assert dist.is_backend_available("tpu")
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_torchrun_ddp_example_matches_cpu():
    """examples/mingpt_ddp.py --compile under torchrun, written as for CUDA: LOCAL_RANK
    picks tpu:<local rank> (the CPU plugin exposes LOCAL_WORLD_SIZE devices)
    and init_process_group() without a backend takes "tpu"."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TORCH_PJRT_CPU_DEVICES"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                        os.path.join(root, "examples", "mingpt_ddp.py"), "--steps", "5", "--compile"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 ranks on tpu vs 1 process on cpu" in r.stdout and "(OK" in r.stdout, r.stdout


def test_cpu_device_count_follows_torchrun(monkeypatch):
    from torch_pjrt import _plugin

    monkeypatch.delenv("TORCH_PJRT_CPU_DEVICES", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _plugin.cpu_device_count() == 4
    monkeypatch.setenv("TORCH_PJRT_CPU_DEVICES", "3")  # the explicit setting wins
    assert _plugin.cpu_device_count() == 3
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv("TORCH_PJRT_CPU_DEVICES")
    assert _plugin.cpu_device_count() == 1
