"""The build of torch-pjrt's native parts, run by setuptools (pyproject.toml).

Four shared objects land in torch_pjrt/, under the names the package loads:

  libtpcore.so  the C11 core (csrc/core), built against the pjrt_c_api.h that
                the xla-cpu-pjrt wheel ships (nothing foreign is committed)
  _C.so         the CPython module over the core (csrc/python)
  _glue.so      the C++ glue PyTorch's device hooks need (csrc/glue, less
                dist.cpp); not a Python module: torch.ops.load_library opens it
  _dist.so      torch.distributed's "tpu" backend (csrc/glue/dist.cpp), a
                pybind11 module, so the one glue file built with Python headers

`pip install .`, `pip wheel .` and `pip install -e .` all go through
TpBuild below; `make build` runs the same command in place
(`setup.py build_ext --inplace`).  Each recompiles only the objects whose
sources or headers changed.  The glue is compiled against the torch in the
build environment and must run with the same version: the project pins
torch==2.13.0 for both.
"""
import hashlib
import os
import subprocess
import sys
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CWARN = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-O2", "-g", "-fPIC"]
# -std=c++20: torch 2.13's headers need it (c10/core/AutogradState.h uses
# bit-field initialisers); the glue's own code is plain C++17.
CXXWARN = ["-std=c++20", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
           "-D_GLIBCXX_USE_CXX11_ABI=1"]
# The glue finds libtpcore beside it and PyTorch's libraries in the torch
# package next to torch_pjrt (both are loaded by then; the path is a fallback).
RPATH_CORE = "-Wl,-rpath,$ORIGIN"
RPATH_TORCH = "-Wl,-rpath,$ORIGIN/../torch/lib"


def _files(d, ext, exclude=()):
    d = os.path.join("csrc", d)
    return sorted(os.path.join(d, f) for f in os.listdir(os.path.join(ROOT, d))
                  if f.endswith(ext) and f not in exclude)


def _pjrt_include():
    import xla_plugins.xla_cpu_pjrt as m

    return os.path.join(os.path.dirname(m.__file__), "include")


def _torch_dir():
    # Only torch's headers and libraries are wanted: an installed torch-pjrt
    # (an older build, this one's editable install) is not to be loaded.
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch

    return os.path.dirname(torch.__file__)


class TpBuild(build_ext):
    """Builds each shared object with the flags of its language, compiling
    the sources in parallel and skipping objects newer than their inputs."""

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext):
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        kind = ext.name.rsplit(".", 1)[-1]
        plan = getattr(self, "_plan_" + kind.lstrip("_"))()
        flags, incs, libs = plan["flags"], plan["include"], plan["link"]
        headers = [h for d in plan["header_dirs"] for h in _files(d, (".h", ".hpp"))]
        objs = self._compile(ext.sources, flags + ["-I" + i for i in incs], headers)
        deps = objs + ([self._core_path()] if kind != "libtpcore" else [])
        if self.force or not os.path.exists(out) or any(_newer(d, out) for d in deps):
            cc = self.compiler.compiler_cxx[0] if plan["cxx"] else self.compiler.compiler_so[0]
            _run_to(out, lambda o: [cc, "-shared", "-o", o] + objs + libs)

    # Flags, include dirs and link line of each object.
    def _plan_libtpcore(self):
        return dict(cxx=False, flags=CWARN, include=[_pjrt_include()], header_dirs=["core"],
                    link=["-ldl", "-lpthread", "-lm"])

    def _plan_C(self):
        return dict(cxx=False, flags=CWARN, include=["csrc/core", sysconfig.get_paths()["include"]],
                    header_dirs=["core"], link=self._link_core())

    def _plan_glue(self):
        t = _torch_dir()
        return dict(cxx=True, flags=CXXWARN, include=["csrc/core", os.path.join(t, "include")],
                    header_dirs=["core", "glue"],
                    link=self._link_core() + self._link_torch(t))

    def _plan_dist(self):
        t = _torch_dir()
        return dict(cxx=True, flags=CXXWARN, header_dirs=["glue"],
                    include=[sysconfig.get_paths()["include"], os.path.join(t, "include"),
                             os.path.join(t, "include", "torch", "csrc", "api", "include")],
                    link=self._link_torch(t) + ["-ltorch_python"])

    def _core_path(self):
        return self.get_ext_fullpath("torch_pjrt.libtpcore")

    def _link_core(self):
        return ["-L" + os.path.dirname(self._core_path()), "-ltpcore", RPATH_CORE]

    @staticmethod
    def _link_torch(t):
        return ["-L" + os.path.join(t, "lib"), "-lc10", "-ltorch", "-ltorch_cpu", RPATH_TORCH]

    def _compile(self, sources, flags, headers):
        # Objects live in build/obj/<hash of the flags>/, one place for the
        # in-place build (make build), editable installs and wheels built from
        # this tree: a build with other flags or headers (another torch) has
        # its own directory.
        key = hashlib.sha256("\0".join(flags).encode()).hexdigest()[:12]
        tmp = os.path.join(ROOT, "build", "obj", key)
        os.makedirs(tmp, exist_ok=True)
        jobs = []
        objs = []
        for src in sources:
            obj = os.path.join(tmp, src.replace(os.sep, "_") + ".o")
            objs.append(obj)
            stale = self.force or not os.path.exists(obj) or _newer(src, obj) or \
                any(_newer(h, obj) for h in headers)
            if stale:
                cxx = src.endswith(".cpp")
                cc = self.compiler.compiler_cxx[0] if cxx else self.compiler.compiler_so[0]
                jobs.append((obj, lambda o, cc=cc, src=src: [cc, "-c", src, "-o", o] + flags))
        workers = int(os.environ.get("TORCH_PJRT_BUILD_JOBS", os.cpu_count() or 1))
        with ThreadPoolExecutor(max(1, workers)) as pool:
            for f in [pool.submit(_run_to, *j) for j in jobs]:
                f.result()
        return objs


class TpWheel(bdist_wheel):
    """bdist_wheel staging in a directory of its own: two wheel builds of
    one tree at once (parallel test workers, two terminals) would otherwise
    share build/bdist.<platform>/ and fail on each other's files."""

    def finalize_options(self):
        if self.bdist_dir is None:
            # Made by the run, removed after it (bdist_wheel's own cleanup).
            self.bdist_dir = os.path.join(ROOT, "build", f"bdist.{os.getpid()}")
        super().finalize_options()


def _newer(a, b):
    return os.path.getmtime(a) > os.path.getmtime(b)


def _run_to(out, cmd):
    # Writes `out` through a private name and renames it into place, so a
    # concurrent build never sees half a file, and a process that has the old
    # shared object loaded keeps its (unlinked) copy.
    part = f"{out}.{os.getpid()}.{threading.get_ident()}.part"
    cmd = cmd(part)
    print(" ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=ROOT)
    if r.returncode:
        if os.path.exists(part):
            os.unlink(part)
        sys.exit(f"torch-pjrt build: command failed ({r.returncode}): {' '.join(cmd)}")
    os.replace(part, out)


# Built in this order: the other three link against libtpcore.
EXTENSIONS = [
    Extension("torch_pjrt.libtpcore", _files("core", ".c")),
    Extension("torch_pjrt._C", _files("python", ".c")),
    Extension("torch_pjrt._glue", _files("glue", ".cpp", exclude=("dist.cpp",))),
    Extension("torch_pjrt._dist", ["csrc/glue/dist.cpp"]),
]

# setuptools' egg-info goes under build/, not the tree's root: there, a stale
# copy would shadow the installed package's metadata (its entry points) for
# any Python started in the tree.
os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": TpBuild, "bdist_wheel": TpWheel},
      options={"egg_info": {"egg_base": "build"}})
