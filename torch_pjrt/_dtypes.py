"""torch.dtype <-> the C core's dtype codes (c10::ScalarType values)."""
import torch

class _Codes(dict):
    def __missing__(self, dtype):
        # A tensor of a dtype the device cannot hold (complex32 from .chalf()).
        raise NotImplementedError(f"dtype {dtype} is not supported on the tpu device (torch-pjrt)")


CODE = _Codes({
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.complex64: 9,
    torch.complex128: 10,
    torch.bool: 11,
    torch.bfloat16: 15,
    torch.float8_e5m2: 23,
    torch.float8_e4m3fn: 24,
    torch.float8_e5m2fnuz: 25,
    torch.float8_e4m3fnuz: 26,
    torch.uint16: 27,
    torch.uint32: 28,
    torch.uint64: 29,
})
DTYPE = {v: k for k, v in CODE.items()}


def code(dtype):
    try:
        return CODE[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the tpu device") from None
