"""Per-token-group 8-bit quantization (fp8 e4m3, int8, UE8M0 scales) vs a torch reference
(upstream test_per_token_group_quant_8bit.py: scales rtol 1e-3 atol 1e-5; quantized values compared
after dequantization)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch

from kernels_triton import quant
from tests.ops._helpers import PATHS, poisoned

FP8 = torch.float8_e4m3fn


def _ref(x: torch.Tensor, g: int, qmax: float, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xg = x.float().view(x.shape[0], -1, g)
    s = xg.abs().amax(-1).clamp_min(1e-10) / qmax
    if ue8m0:
        s = 2.0 ** torch.ceil(torch.log2(s))
    return xg / s[..., None], s


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [FP8, torch.int8])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("col_major", [False, True])
def test_group_quant(path: str, dtype: torch.dtype, ue8m0: bool, col_major: bool) -> None:
    if dtype == torch.int8 and ue8m0:
        pytest.skip("UE8M0 scales are an fp8 feature upstream")
    t, h, g = 5, 512, 128
    x = torch.randn(t, h, dtype=torch.bfloat16) * 4
    q = torch.empty(t, h, dtype=dtype)
    s = poisoned(h // g, t).t() if col_major else poisoned(t, h // g)
    qmin, qmax = (-448.0, 448.0) if dtype == FP8 else (-128.0, 127.0)
    if path == "torch":
        sgl_kernel.sgl_per_token_group_quant_8bit(x, q, s, g, 1e-10, qmin, qmax, scale_ue8m0=ue8m0)
    else:
        quant.group_quant_triton(x, q, s, g, 1e-10, qmin, qmax, ue8m0)
    y_ref, s_ref = _ref(x, g, qmax, ue8m0)
    assert not torch.isnan(s).any()
    torch.testing.assert_close(s, s_ref, rtol=1e-3, atol=1e-5)
    deq = q.float().view(t, -1, g)
    # fp8 e4m3 has 3 mantissa bits: relative step 2^-3; int8 rounds to the nearest integer.
    tol = (0.0625, 0.0) if dtype == FP8 else (0.0, 0.5 + 1e-3)
    torch.testing.assert_close(deq, y_ref.clamp(qmin, qmax), rtol=tol[0], atol=tol[1] + 1e-3)


@pytest.mark.parametrize("h,g", [(640, 640), (480, 96)])
def test_group_quant_triton_group_not_a_power_of_two(h: int, g: int) -> None:
    """Groups that are not a power of two (per-token quantization makes the whole row one group, e.g.
    hidden 5120) through the Triton kernel: tl.arange needs a power of two, so the group is padded
    and masked (the recorded specialization is compiled for sm_90 / sm_120 by test_triton_compile)."""
    x = torch.randn(7, h, dtype=torch.bfloat16) * 4
    q = torch.empty(7, h, dtype=FP8)
    s = poisoned(7, h // g)
    quant.group_quant_triton(x, q, s, g, 1e-10, -448.0, 448.0)
    y_ref, s_ref = _ref(x, g, 448.0, False)
    torch.testing.assert_close(s, s_ref, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(q.float().view(7, -1, g), y_ref, rtol=0.0625, atol=1e-3)


def test_per_token_and_per_tensor_fp8() -> None:
    x = torch.randn(6, 256, dtype=torch.bfloat16)
    q = torch.empty(6, 256, dtype=FP8)
    s = poisoned(6, 1)
    sgl_kernel.sgl_per_token_quant_fp8(x, q, s)
    torch.testing.assert_close(s.view(-1), x.float().abs().amax(-1) / 448.0, rtol=1e-3, atol=1e-5)
    st = poisoned(1)
    sgl_kernel.sgl_per_tensor_quant_fp8(x, q, st, False)
    torch.testing.assert_close(st, x.float().abs().amax().view(1) / 448.0, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(q.float() * st, x.float(), rtol=0.0625, atol=1e-2)


@pytest.mark.gpu
def test_group_quant_gpu() -> None:
    x = torch.randn(4096, 5120, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(4096, 5120, dtype=FP8, device="cuda")
    s = torch.full((4096, 40), float("nan"), device="cuda")
    sgl_kernel.sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -448.0, 448.0)
    y_ref, s_ref = _ref(x, 128, 448.0, False)
    torch.testing.assert_close(s, s_ref, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(q.float().view(4096, -1, 128), y_ref, rtol=0.0625, atol=1e-3)


@pytest.mark.gpu
def test_per_token_and_per_tensor_fp8_gpu() -> None:
    """Per-token and per-tensor FP8 quantization at a prefill size (8192 x 5120) on the GPU."""
    x = torch.randn(8192, 5120, dtype=torch.bfloat16, device="cuda") * 4
    q = torch.empty(8192, 5120, dtype=FP8, device="cuda")
    s = torch.full((8192, 1), float("nan"), device="cuda")
    sgl_kernel.sgl_per_token_quant_fp8(x, q, s)
    torch.testing.assert_close(s.view(-1), x.float().abs().amax(-1) / 448.0, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(q.float() * s, x.float(), rtol=0.0625, atol=1e-2)
    st = torch.full((1,), float("nan"), device="cuda")
    sgl_kernel.sgl_per_tensor_quant_fp8(x, q, st, False)
    torch.testing.assert_close(st, x.float().abs().amax().view(1) / 448.0, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(q.float() * st, x.float(), rtol=0.0625, atol=2e-2)
