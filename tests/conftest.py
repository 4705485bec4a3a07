import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")

import torch  # noqa: E402
import torch_pjrt  # noqa: E402,F401
