"""rmsnorm / fused_add_rmsnorm / gemma variants vs an fp32 torch reference (upstream test_norm.py:
fp32 reference, rtol/atol 1e-3; bf16 rtol 1e-2 atol 2e-2)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch

from kernels_triton import norm
from tests.ops._helpers import PATHS, assert_no_nan_close, poisoned

TOL = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 2e-2), torch.float32: (1e-3, 1e-3)}


def _ref(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    y = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * (w.float() + 1 if gemma else w.float())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(3, 96), (1, 1000), (0, 64)])
def test_rmsnorm(path: str, dtype: torch.dtype, gemma: bool, shape: tuple[int, int]) -> None:
    x = torch.randn(*shape, dtype=dtype)
    w = torch.randn(shape[1], dtype=dtype)
    out = poisoned(*shape, dtype=dtype)
    if path == "torch":
        fn = sgl_kernel.gemma_rmsnorm if gemma else sgl_kernel.rmsnorm
        ret = fn(x, w, 1e-6, out=out)
        assert ret is out
    else:
        norm.rmsnorm_triton(x, w, 1e-6, out, gemma=gemma)
    assert_no_nan_close(out, _ref(x, w, 1e-6, gemma), *TOL[dtype])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm(path: str, dtype: torch.dtype, gemma: bool) -> None:
    x = torch.randn(4, 128, dtype=dtype)
    r = torch.randn(4, 128, dtype=dtype)
    w = torch.randn(128, dtype=dtype)
    r_exp = (x.float() + r.float()).to(dtype)
    y_exp = _ref(r_exp, w, 1e-6, gemma)
    if path == "torch":
        fn = sgl_kernel.gemma_fused_add_rmsnorm if gemma else sgl_kernel.fused_add_rmsnorm
        assert fn(x, r, w, 1e-6) is None
    else:
        norm.rmsnorm_triton(x, w, 1e-6, x, residual=r, gemma=gemma)
    assert_no_nan_close(r, r_exp, *TOL[dtype])
    assert_no_nan_close(x, y_exp, *TOL[dtype])


def test_rmsnorm_default_out_and_3d() -> None:
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    y = sgl_kernel.rmsnorm(x, w)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_no_nan_close(y, _ref(x, w, 1e-6, False), 1e-2, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 128, 4096])
def test_rmsnorm_gpu(tokens: int) -> None:
    x = torch.randn(tokens, 5120, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(5120, dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(x, float("nan"))
    sgl_kernel.rmsnorm(x, w, 1e-6, out=out)
    assert_no_nan_close(out, _ref(x, w, 1e-6, False), 1e-2, 2e-2)
    r_exp = (x.float() + r.float()).bfloat16()
    sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6)
    assert_no_nan_close(x, _ref(r_exp, w, 1e-6, False), 1e-2, 2e-2)
