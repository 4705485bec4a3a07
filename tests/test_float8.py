"""float8 tensors (e4m3fn, e5m2 and their fnuz forms): conversions with
PyTorch's rounding and overflow rules, and _scaled_mm."""
import pytest
import torch

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
VALUES = torch.tensor([0.0, -0.0, 1.0, -1.5, 0.3, -2.5e-3, 1.7e-5, 1e-9, 0.0019, 240.0, 241.0, 248.0, 448.0, 449.0,
                       464.0, 500.0, 57344.0, 61440.0, 70000.0, float("inf"), -float("inf"), float("nan")])


def same_values(got, want):
    """Equal bits, except that any NaN matches any NaN (payloads differ)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.cpu().float(), want.float()
    assert torch.equal(g.isnan(), w.isnan())
    keep = ~w.isnan()
    assert torch.equal(got.cpu()[keep].view(torch.uint8), want[keep].view(torch.uint8)), (g, w)


@pytest.mark.parametrize("dtype", F8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32])
def test_conversions_round_and_overflow_as_pytorch(dtype, src):
    # e4m3fn saturates at +-448 (infinities too); e5m2 overflows to inf; the fnuz forms to NaN
    x = VALUES if src != torch.int32 else torch.tensor([0, 1, -3, 17, 300, 449, 70000, -100000])
    x = x.to(src)
    want = x.to(dtype)
    same_values(x.to("tpu").to(dtype), want)
    back = want.to("tpu").float().cpu()  # float8 -> float32 is exact
    assert torch.equal(back.nan_to_num(7), want.float().nan_to_num(7))


@pytest.mark.parametrize("dtype", F8, ids=str)
def test_between_float8_types_and_factories(dtype):
    for other in F8:
        x = (VALUES[:-3] * 3).to(other)
        same_values(x.to("tpu").to(dtype), x.to(dtype))
    same_values(torch.full((3,), 3.3, dtype=dtype, device="tpu"), torch.full((3,), 3.3, dtype=dtype))
    same_values(torch.zeros(2, 3, dtype=dtype, device="tpu"), torch.zeros(2, 3, dtype=dtype))
    x = (torch.randn(4, 6) * 10).to(dtype)
    same_values(x.to("tpu").t().contiguous(), x.t().contiguous())
    same_values(torch.cat([x.to("tpu"), x.to("tpu")]), torch.cat([x, x]))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm(out_dtype, with_bias):
    torch.manual_seed(0)
    a = (torch.randn(16, 32) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(32, 48) * 2).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as CUDA requires
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    bias = torch.randn(48).to(out_dtype) if with_bias else None
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    dev = [t.to("tpu") if t is not None else None for t in (a, b, sa, sb, bias)]
    got = torch._scaled_mm(dev[0], dev[1], dev[2], dev[3], bias=dev[4], out_dtype=out_dtype)
    assert got.dtype == out_dtype
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    compiled = torch.compile(lambda *t: torch._scaled_mm(t[0], t[1], t[2], t[3], bias=t[4], out_dtype=out_dtype),
                             backend="tpu")
    torch.testing.assert_close(compiled(*dev).cpu(), want, rtol=0, atol=0)
