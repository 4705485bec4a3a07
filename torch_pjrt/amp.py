"""torch.tpu.amp: torch.cuda.amp's autocast and GradScaler for the tpu device.

torch.cuda.amp's classes are torch.amp's with the device fixed; these are the
same for "tpu".  autocast defaults to bfloat16, the TPU's native mixed
precision (torch.cuda.amp.autocast defaults to float16)."""

import torch


class autocast(torch.amp.autocast):  # noqa: N801 (torch.cuda.amp.autocast's name)
    def __init__(self, enabled=True, dtype=torch.bfloat16, cache_enabled=True):
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
