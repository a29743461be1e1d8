"""silu_and_mul / gelu_and_mul / gelu_tanh_and_mul / silu_and_mul_clamp vs fp32 torch (upstream
test_activation.py: torch.nn.functional reference, 1e-3; bf16 1e-2)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch
import torch.nn.functional as F

from kernels_triton import activation
from tests.ops._helpers import PATHS, assert_no_nan_close, poisoned

FNS = {"silu": lambda g: F.silu(g), "gelu": lambda g: F.gelu(g), "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
SHIM = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}
TOL = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2), torch.float32: (1e-3, 1e-3)}


def _ref(x: torch.Tensor, act: str, limit: float | None = None) -> torch.Tensor:
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return FNS[act](g) * u


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_act_and_mul(path: str, act: str, dtype: torch.dtype) -> None:
    x = torch.randn(5, 2 * 72, dtype=dtype) * 3
    out = poisoned(5, 72, dtype=dtype)
    if path == "torch":
        assert getattr(sgl_kernel, SHIM[act])(x, out) is out
    else:
        activation.act_and_mul_triton(x, out, act)
    assert_no_nan_close(out, _ref(x, act), *TOL[dtype])


@pytest.mark.parametrize("path", PATHS)
def test_silu_and_mul_clamp(path: str) -> None:
    x = torch.randn(6, 256, dtype=torch.bfloat16) * 20  # well past swiglu_limit 10
    out = poisoned(6, 128, dtype=torch.bfloat16)
    if path == "torch":
        sgl_kernel.silu_and_mul_clamp(x, out, 10.0)
    else:
        activation.act_and_mul_triton(x, out, "silu", 10.0)
    assert_no_nan_close(out, _ref(x, "silu", 10.0), 1e-2, 1e-2)
    assert not torch.allclose(out.float(), _ref(x, "silu"), rtol=1e-2, atol=1e-2)  # the clamp matters


def test_shapes_and_errors() -> None:
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    assert sgl_kernel.silu_and_mul(x).shape == (2, 3, 32)
    assert sgl_kernel.silu_and_mul(torch.randn(0, 64)).shape == (0, 32)
    with pytest.raises(ValueError):
        sgl_kernel.silu_and_mul(torch.randn(2, 6, dtype=torch.bfloat16))  # 12 bytes: not 16-aligned


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4096])
def test_silu_and_mul_gpu(tokens: int) -> None:
    x = torch.randn(tokens, 2 * 2304, dtype=torch.bfloat16, device="cuda")
    assert_no_nan_close(sgl_kernel.silu_and_mul(x), _ref(x, "silu"), 1e-2, 1e-2)
    out = torch.full((tokens, 2304), float("nan"), dtype=torch.bfloat16, device="cuda")
    sgl_kernel.silu_and_mul_clamp(x * 20, out, 10.0)
    assert_no_nan_close(out, _ref(x * 20, "silu", 10.0), 1e-2, 1e-2)
