"""Make this checkout importable from the virtual environment (a development
install, like `pip install -e`), run by `make setup`:

- a .pth file puts the repository root on sys.path;
- a minimal torch_pjrt.dist-info declares the Dynamo backend "tpu" as a
  `torch_dynamo_backends` entry point, so torch.compile(backend="tpu") finds
  it without `import torch_pjrt` importing torch._dynamo (seconds of start-up
  that eager-only programs do not need).
"""
import os
import site
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    sp = site.getsitepackages()[0]
    with open(os.path.join(sp, "torch_pjrt_dev.pth"), "w") as f:
        f.write(ROOT + "\n")
    info = os.path.join(sp, "torch_pjrt-0.1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torch-pjrt\nVersion: 0.1.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[torch_dynamo_backends]\ntpu = torch_pjrt._compile:tpu_backend\n")
    print(f"development install of {ROOT} into {sp}", file=sys.stderr)


if __name__ == "__main__":
    main()
