"""The package as a user installs it: a wheel built from this tree, installed
into a fresh virtual environment with only torch==2.13.0 beside it, where
`import torch` alone finds the "tpu" device (PyTorch's device-backend
autoload) and torch.compile finds the "tpu" backend."""
import os
import subprocess
import sys
import zipfile

import filelock
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_USE = """
import torch, sys
assert "torch_pjrt" in sys.modules, "autoload did not import torch_pjrt"
assert torch.tpu.is_available() and torch.accelerator.current_accelerator().type == "tpu"
x = torch.arange(6.0).reshape(2, 3).to("tpu")
eager = (x * 2 + 1).sum(0)
compiled = torch.compile(lambda t: (t.sin() @ t.T).relu(), backend="tpu")(x)
torch.testing.assert_close(eager.cpu(), (x.cpu() * 2 + 1).sum(0))
torch.testing.assert_close(compiled.cpu(), (x.cpu().sin() @ x.cpu().T).relu(), rtol=1e-5, atol=1e-5)
import torch_pjrt
assert torch_pjrt.metrics()["graphs_lowered"] == 1, torch_pjrt.metrics()
print("ok", torch_pjrt.__file__)
"""


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="session")
def venv(tmp_path_factory, worker_id):
    # One wheel and one venv for the whole run: pytest-xdist workers share
    # them through a directory above their own temp dirs, under a lock.
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent
    tmp = root / "pkg"
    with filelock.FileLock(str(root / "pkg.lock")):
        py = str(tmp / "v" / "bin" / "python")
        if not (tmp / "ready").exists():
            tmp.mkdir(exist_ok=True)
            # The build reuses this tree's compiled objects where flags and
            # sources are the same (setup.py): the wheel is the package
            # `make build` made.
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(tmp),
                  ROOT])
            _run([sys.executable, "-m", "venv", str(tmp / "v")])
            wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
            assert len(wheels) == 1, wheels
            _run([py, "-m", "pip", "install", "-q", "torch==2.13.0", str(tmp / wheels[0])])
            (tmp / "ready").write_text(wheels[0])
        wheel = tmp / (tmp / "ready").read_text()
    return py, wheel, tmp


def test_concurrent_wheel_builds(tmp_path):
    # Two builds of this tree at once (as two workers or two terminals do)
    # each give a complete wheel: no shared staging directory between them.
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"]
    procs = [subprocess.Popen(cmd + ["-w", str(tmp_path / str(i)), ROOT], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for p in procs:
        out = p.communicate(timeout=900)[0]
        assert p.returncode == 0, out[-3000:]
    for i in range(2):
        (whl,) = os.listdir(tmp_path / str(i))
        assert "torch_pjrt/_glue.so" in zipfile.ZipFile(tmp_path / str(i) / whl).namelist()


def test_wheel_contents(venv):
    _, wheel, _ = venv
    names = zipfile.ZipFile(wheel).namelist()
    for so in ("libtpcore.so", "_C.so", "_glue.so", "_dist.so"):
        assert f"torch_pjrt/{so}" in names
    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    eps = zipfile.ZipFile(wheel).read(info).decode()
    assert "[torch.backends]" in eps and "torch_pjrt._autoload:load" in eps
    assert "[torch_dynamo_backends]" in eps and "torch_pjrt._compile:tpu_backend" in eps


def test_import_torch_alone_finds_tpu(venv):
    py, _, tmp = venv
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    out = _run([py, "-c", _USE], cwd=str(tmp), env=env).stdout
    assert out.startswith("ok ") and str(tmp / "v") in out, out  # the installed copy, not this tree


def test_autoload_off_and_import_order(venv):
    py, _, tmp = venv
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = _run([py, "-c", "import torch, sys; print('torch_pjrt' in sys.modules, hasattr(torch, 'tpu'))"],
               cwd=str(tmp), env=env).stdout.split()
    assert out == ["False", "False"]
    # torch_pjrt imported first: torch autoloads it while it is half imported.
    out = _run([py, "-c", "import torch_pjrt, torch; print((torch.ones(2, device='tpu') + 1).sum().item())"],
               cwd=str(tmp)).stdout.split()
    assert out == ["4.0"]


def test_environment_report(venv):
    py, _, tmp = venv
    out = _run([py, "-m", "torch_pjrt"], cwd=str(tmp)).stdout
    for want in ("torch-pjrt: 0.1.0", "torch: 2.13.0", "platform: cpu", "devices: ", "tpu:0", "compilation cache:"):
        assert want in out, out
    bad = subprocess.run([py, "-m", "torch_pjrt"], cwd=str(tmp), capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TORCH_PJRT_PLUGIN="/nonexistent/libtpu.so"))
    assert bad.returncode == 1 and "device: not available" in bad.stdout and "/nonexistent/libtpu.so" in bad.stdout
