"""`python -m torch_pjrt` (or `torch-pjrt`): what this installation runs on.

Prints the versions of torch-pjrt, torch, the PJRT plugin and XLA, the
devices and their memory, the compilation cache and its size, and the
settings in force.  Exits 1 when the device is not available, saying why.
"""
import os
import sys


def _dir_size(path):
    total = files = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(root, n))
                files += 1
            except OSError:
                pass
    return total, files


def report():
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import torch_pjrt

    def ver(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    lines = [f"torch-pjrt: {ver('torch-pjrt')} ({os.path.dirname(torch_pjrt.__file__)})",
             f"torch: {torch.__version__}",
             f"xla-cpu-pjrt: {ver('xla-cpu-pjrt')}",
             f"python: {sys.version.split()[0]}"]
    if torch_pjrt.load_error is not None:
        lines.append(f"device: not available: {torch_pjrt.load_error}")
        return lines, 1
    info = torch_pjrt._C.info()
    lines += [f"plugin: {info['path']}",
              f"platform: {info['platform']}, XLA {info['xla_version']}, PJRT C API {info['api_version']}",
              f"devices: {torch.tpu.device_count()}"]
    for i in range(torch.tpu.device_count()):
        free, total = torch.tpu.mem_get_info(i)
        lines.append(f"  tpu:{i} {torch.tpu.get_device_name(i)}: {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
    cache = torch_pjrt.default_cache_dir()
    if cache is None:
        lines.append("compilation cache: off (TORCH_PJRT_CACHE_DIR)")
    else:
        size, files = _dir_size(cache) if os.path.isdir(cache) else (0, 0)
        lines.append(f"compilation cache: {cache} ({files} files, {size / 2**20:.1f} MiB)")
    settings = sorted((k, v) for k, v in os.environ.items()
                      if k.startswith("TORCH_PJRT_") or k in ("XLA_FLAGS", "TORCH_DEVICE_BACKEND_AUTOLOAD",
                                                                "TF_CPP_MIN_LOG_LEVEL"))
    lines.append("settings: " + (", ".join(f"{k}={v}" for k, v in settings) or "defaults"))
    lines.append(f"CPU fallback: {'on' if torch_pjrt.cpu_fallback_enabled() else 'off'}")
    return lines, 0


def main():
    lines, rc = report()
    print("\n".join(lines))
    return rc


if __name__ == "__main__":
    sys.exit(main())
