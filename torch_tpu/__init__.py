"""torch-pjrt under TorchTPU's module name.

Libraries that support Google's TorchTPU look for it by this name:
transformers (5.x) finds a TPU when `torch_tpu` is importable and
`torch.tpu.is_available()`, and then trains on "tpu:0" (Trainer,
TrainingArguments: device, `bf16=True`), and compiles generation with
`backend="tpu"`.  torch-pjrt provides the same device, `torch.tpu` module and
compile backend, so it answers to the name too.  Everything is torch-pjrt's:
`import torch_tpu` is `import torch_pjrt`.  (Installing both torch-pjrt and
Google's TorchTPU in one environment is not supported: both claim the "tpu"
device.)
"""
from torch_pjrt import *  # noqa: F401,F403
from torch_pjrt import load_error  # noqa: F401
