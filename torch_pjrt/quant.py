"""Quantization configs of torch-pjrt for torchao's `quantize_` (and Hugging
Face's `TorchAoConfig`), for the formats torchao's own tensor classes do not
offer on a non-CUDA device.

    from torchao.quantization import quantize_
    from torch_pjrt.quant import Int4Config
    quantize_(model, Int4Config(group_size=32))            # on "tpu" or the CPU

`Int4Config`: int4 weight-only, symmetric, one scale per `group_size` input
channels.  torchao's `Int4WeightOnlyConfig` needs CUDA's kernels (its
"plain_int32" packing refuses devices other than XPU and NPU, the others need
mslk), and `IntxWeightOnlyConfig(weight_dtype=torch.int4)` keeps one int4 in
each byte.  Here the weights are stored two per byte (`Int4PackedTensor`):
half a byte per weight plus a scale per group (0.28x of bfloat16's bytes
with groups of 32).  The
values are torchao's: quantized by `IntxUnpackedToInt8Tensor.from_hp` and
dequantized by `dequantize_affine`, so a model gives what
`IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(g))`
gives.  A linear layer unpacks and dequantizes its weight, then multiplies in
the activation's dtype; compiled, the unpacking fuses into the product's
program.  Both are torchao extension points: `TorchAOBaseTensor` and
`register_quantize_module_handler`; nothing of torchao is patched.
"""
import types
from dataclasses import dataclass
from functools import partial

import torch
from torchao.core.config import AOBaseConfig
from torchao.quantization.quant_api import _module_extra_repr
from torchao.quantization.quant_primitives import dequantize_affine
from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import IntxUnpackedToInt8Tensor
from torchao.quantization.transform_module import register_quantize_module_handler
from torchao.utils import TorchAOBaseTensor

__all__ = ["Int4Config", "Int4PackedTensor"]

aten = torch.ops.aten
_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


class Int4PackedTensor(TorchAOBaseTensor):
    """A 2-d weight quantized to int4 with one scale per group of input
    channels, stored packed.

    qdata: uint8 [N, K / 2]: element k of a row in the low nibble of byte
        k // 2 when k is even, the high nibble when odd, each as its int4
        value + 8 (0..15).
    scale: [N, K / group_size] in the weight's dtype (symmetric: no zero
        points).
    block_size: (1, group_size).  dtype: the dequantized weight's dtype.
    """

    tensor_data_names = ["qdata", "scale"]
    tensor_attribute_names = ["block_size", "dtype"]

    def __new__(cls, qdata, scale, block_size, dtype):
        shape = (qdata.shape[0], qdata.shape[1] * 2)
        return torch.Tensor._make_wrapper_subclass(cls, shape, device=qdata.device, dtype=dtype, requires_grad=False)

    def __init__(self, qdata, scale, block_size, dtype):
        super().__init__()
        if qdata.dtype != torch.uint8 or qdata.dim() != 2:
            raise ValueError(f"Int4PackedTensor: qdata must be a 2-d uint8 tensor, got {qdata.dtype} {tuple(qdata.shape)}")
        if dtype not in _FLOAT or scale.dtype not in _FLOAT:
            raise ValueError(f"Int4PackedTensor: dtype and scale must be one of {_FLOAT}, got {dtype} and {scale.dtype}")
        self.qdata, self.scale = qdata, scale
        self.block_size = tuple(block_size)

    def _quantization_type(self):
        return f"shape={tuple(self.shape)}, block_size={self.block_size}, device={self.device}"

    @classmethod
    def from_hp(cls, w, group_size):
        if w.dim() != 2:
            raise ValueError(f"Int4Config quantizes 2-d weights (linear layers), got a {w.dim()}-d weight")
        n, k = w.shape
        if k % group_size or group_size % 2:
            raise ValueError(f"Int4Config: the weight's {k} input channels must be a multiple of group_size "
                             f"({group_size}, an even number); pick a group_size that divides {k}")
        q = IntxUnpackedToInt8Tensor.from_hp(w, (1, group_size), torch.int4)
        u = (q.qdata.to(torch.int16) + 8).to(torch.uint8)  # 0..15
        packed = u[:, 0::2] | (u[:, 1::2] << 4)
        return cls(packed, q.scale, (1, group_size), w.dtype)

    def unpacked(self):
        """The int4 values as int8 [N, K] (-8..7)."""
        lo = (self.qdata & 15).to(torch.int8)
        hi = (self.qdata >> 4).to(torch.int8)
        return torch.stack([lo, hi], dim=-1).reshape(self.shape) - 8

    def dequantize(self, output_dtype=None):
        return dequantize_affine(self.unpacked(), self.block_size, self.scale, None, torch.int8,
                                 -8, 7, output_dtype=output_dtype or self.dtype)

    def to(self, *args, **kwargs):
        kwargs = self._get_to_kwargs(*args, **kwargs)
        device, dtype = kwargs.pop("device"), kwargs.pop("dtype")
        return Int4PackedTensor(self.qdata.to(device), self.scale.to(device=device, dtype=dtype), self.block_size, dtype)


implements = Int4PackedTensor.implements
implements_torch_function = Int4PackedTensor.implements_torch_function


@implements(aten.linear.default)
@implements_torch_function(torch.nn.functional.linear)
def _linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return torch.nn.functional.linear(x, w.dequantize(), bias)


Int4PackedTensor.__module__ = "torch_pjrt.quant"
torch.serialization.add_safe_globals([Int4PackedTensor])


@dataclass
class Int4Config(AOBaseConfig):
    """int4 weight-only quantization of linear layers, stored two weights per
    byte (see the module's documentation).  group_size: input channels per
    scale (32, 64, 128, ...; it must divide in_features)."""

    group_size: int = 32

    def __post_init__(self):
        if not isinstance(self.group_size, int) or self.group_size < 2 or self.group_size % 2:
            raise ValueError(f"Int4Config: group_size must be an even integer >= 2, got {self.group_size!r}")


@register_quantize_module_handler(Int4Config)
def _int4_transform(module, config, *, parameter_name="weight"):
    w = getattr(module, parameter_name)
    new = Int4PackedTensor.from_hp(w.detach(), config.group_size)
    setattr(module, parameter_name, torch.nn.Parameter(new, requires_grad=False))
    module.extra_repr = types.MethodType(
        partial(_module_extra_repr, original_extra_repr=module.extra_repr, parameter_name=parameter_name), module)
    return module


def _register_with_torchao():
    """Where torchao looks up classes by name when it loads what it saved
    (transformers' save_pretrained / from_pretrained of a torchao model):
    configs in the modules ALLOWED_AO_MODULES lists (torchao.core.config
    exports it), tensor classes its safetensors serialization lists (the way
    its TorchAOBaseTensor documentation gives to add one)."""
    from torchao.core import config as ao_config

    ao_config.ALLOWED_AO_MODULES.add(__name__)
    try:
        from torchao.prototype.safetensors import safetensors_utils as su
    except ImportError:
        return
    if "Int4PackedTensor" not in su.ALLOWED_TENSORS_SUBCLASSES:
        su.ALLOWED_TENSORS_SUBCLASSES.append("Int4PackedTensor")
    su.ALLOWED_CLASSES.setdefault("Int4PackedTensor", Int4PackedTensor)


_register_with_torchao()
