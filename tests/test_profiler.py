"""Device time in torch.profiler: every program execution, copy, compile and
disk-cache load of the tpu device is an event of PyTorch's own profiler
(csrc/core/trace.c records them, csrc/glue/profiler.cpp hands them to
Kineto), linked to the CPU op that launched it."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch_pjrt  # noqa: F401
from torch.profiler import ProfilerActivity, profile, schedule
from torch_pjrt import _C

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _trace(prof, tmp_path, name="trace.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def _device_events(events, cat):
    return [e for e in events if e.get("cat") == cat and e.get("ph") == "X"]


def test_eager_ops_have_device_time_linked_to_their_op(tmp_path):
    x = torch.randn(128, 128, device="tpu")
    (x @ x).relu()  # compiled before the profile
    torch.tpu.synchronize()
    with profile(activities=BOTH) as prof:
        for _ in range(3):
            y = (x @ x).relu()
        host = y.cpu()
        back = host.to("tpu")
    torch.testing.assert_close(back.cpu(), torch.relu(x.cpu() @ x.cpu()), rtol=1e-4, atol=1e-4)

    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::mm"].count == 3
    assert avg["aten::mm"].self_device_time_total > 0
    assert avg["aten::relu"].self_device_time_total > 0
    assert avg["tpu program aten::mm"].count == 3
    # The CPU op's device time is its programs' time.
    assert avg["aten::mm"].self_device_time_total == pytest.approx(
        avg["tpu program aten::mm"].self_device_time_total)
    assert "Self TPU" in prof.key_averages().table(sort_by="self_device_time_total")

    events = _trace(prof, tmp_path)
    kernels = _device_events(events, "kernel")
    assert sorted(e["name"] for e in kernels) == ["tpu program aten::mm"] * 3 + ["tpu program aten::relu"] * 3
    # A tpu process row, named after the device, holds them.
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {names[e["pid"]] for e in kernels} == {"tpu"}
    labels = [e["args"]["labels"] for e in events if e.get("name") == "process_labels"]
    assert any(lbl.startswith("tpu 0 (PJRT") for lbl in labels)
    # Each kernel is linked (same correlation id, a flow arrow) to its CPU op.
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    flows = [e for e in events if e.get("cat") == "ac2g"]
    for k in kernels:
        op = ops[k["args"]["correlation"]]
        assert op["name"] == k["name"].removeprefix("tpu program ")
        assert k["ts"] >= op["ts"]  # runs after its launch began
        assert k["args"]["bytes"] == 128 * 128 * 4
    copies = _device_events(events, "gpu_memcpy")
    # One arrow per device event, from its PJRT launch call on the CPU op's thread.
    starts = [f["id"] for f in flows if f["ph"] == "s"]
    ends = [f["id"] for f in flows if f["ph"] == "f"]
    assert len(set(starts)) == len(starts) == len(kernels) + len(copies)
    assert sorted(starts) == sorted(ends)
    launches = [e for e in events if e.get("cat") == "privateuse1_runtime" and e["name"].startswith("PJRT_")]
    assert sorted(e["name"] for e in launches if e["name"] == "PJRT_LoadedExecutable_Execute") == [
        "PJRT_LoadedExecutable_Execute"] * len(kernels)
    assert {e["tid"] for e in launches} == {ops[kernels[0]["args"]["correlation"]]["tid"]}
    assert {e["name"]: e["args"]["bytes"] for e in copies} == {
        "Memcpy DtoH (tpu -> host)": 128 * 128 * 4, "Memcpy HtoD (host -> tpu)": 128 * 128 * 4}


def test_compiled_training_step_one_event_per_program(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), backend="tpu")
    x = torch.randn(16, 32, device="tpu")
    y = torch.randint(0, 8, (16,), device="tpu")

    def step():
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(2):
        step()
    torch.tpu.synchronize()
    before = _C.stats()["executions"]
    with profile(activities=BOTH) as prof:
        t0 = time.perf_counter_ns()
        step()
        torch.tpu.synchronize()
        wall_us = (time.perf_counter_ns() - t0) / 1e3
    executed = _C.stats()["executions"] - before

    kernels = sorted(_device_events(_trace(prof, tmp_path), "kernel"), key=lambda e: e["ts"])
    assert len(kernels) == executed > 0
    graphs = [k for k in kernels if k["name"].startswith("tpu program tp::graph")]
    assert len(graphs) == 2  # the forward and the backward program
    assert sum(k["dur"] for k in kernels) <= wall_us
    for a, b in zip(kernels, kernels[1:]):  # one device, one stream: no overlap
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-3
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["torch_pjrt::run_graph"].self_device_time_total > 0


def test_default_activities_include_the_device(tmp_path):
    x = torch.randn(64, device="tpu")
    torch.sin(x)
    with profile() as prof:
        torch.sin(x)
        torch.tpu.synchronize()
    assert [e["name"] for e in _device_events(_trace(prof, tmp_path), "kernel")] == ["tpu program aten::sin"]


def test_cpu_only_profile_records_no_device_events(tmp_path):
    x = torch.randn(64, device="tpu")
    torch.cos(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.cos(x)
        torch.tpu.synchronize()
    events = _trace(prof, tmp_path)
    assert any(e.get("name") == "aten::cos" for e in events)
    assert not _device_events(events, "kernel")
    # and a later device profile sees only its own events
    with profile(activities=BOTH) as prof:
        torch.tan(x)
        torch.tpu.synchronize()
    assert [e["name"] for e in _device_events(_trace(prof, tmp_path), "kernel")] == ["tpu program aten::tan"]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_schedule_cycles_each_get_their_steps(tmp_path):
    x = torch.randn(64, device="tpu")
    torch.exp(x)
    counts = []

    def ready(p):
        p.export_chrome_trace(str(tmp_path / "cycle.json"))
        counts.append(len(_device_events(json.loads((tmp_path / "cycle.json").read_text())["traceEvents"],
                                         "kernel")))

    with profile(activities=BOTH, schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=ready) as prof:
        for _ in range(8):
            torch.exp(x)
            torch.tpu.synchronize()
            prof.step()
    assert counts == [2, 2]


def test_compiles_and_disk_cache_loads_are_events(tmp_path):
    # A fresh process per run, sharing one disk cache: the first compiles
    # the program, the second loads it.
    script = textwrap.dedent("""
        import json, sys, torch, torch_pjrt
        from torch.profiler import profile, ProfilerActivity
        x = torch.randn(37, 41, device="tpu")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            torch.atan2(x, x + 1).cpu()
        prof.export_chrome_trace(sys.argv[1])
        """)
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path / "cache"))
    runtime = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        subprocess.run([sys.executable, "-c", script, str(out)], env=env, check=True, timeout=300,
                       capture_output=True)
        events = json.loads(out.read_text())["traceEvents"]
        runtime.append({e["name"] for e in events if e.get("cat") == "privateuse1_runtime"})
    assert "tpu compile aten::atan2" in runtime[0]
    assert "tpu cache load aten::atan2" not in runtime[0]
    assert "tpu cache load aten::atan2" in runtime[1]
    assert "tpu compile aten::atan2" not in runtime[1]


def test_legacy_autograd_profiler_use_device():
    # torch.autograd.profiler.profile(use_device="tpu") without Kineto uses
    # the device's profiler stubs: each op timed with a pair of events.
    x = torch.randn(128, 128, device="tpu")
    x @ x
    torch.tpu.synchronize()
    with torch.autograd.profiler.profile(use_device="tpu") as prof:
        (x @ x).cpu()
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::mm"].device_time_total > 0
    assert avg["aten::mm"].cpu_time_total > 0
    assert all(e.cpu_time_total >= 0 for e in avg.values())
