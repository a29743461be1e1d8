"""Run mHC's stream combine on CPU tensors in torch instead of interpreted Triton.

Targets sglang 0.5.23 `kernels/ops/layernorm/mhc.py:mhc_combine`, the Triton kernel
`y[m, h] = sum_k pre[m, k] * x_flat[m, k * H + h]` (fp32 accumulation in k order, stored in
out_dtype). Every caller imports it from that module at call time: V4.1's sublayer input
(`srt/models/deepseek_v4_mhc.py:_combine`, hc_pre_from_prev_sublayer), V4's `hc_pre` on the
device-generic route, the final residual combine and DSpark (`deepseek_v4.py`,
`deepseek_v4_dspark.py`). On CPU the kernel runs in Triton's interpreter, one interpreted program
per token: 64% of a 600-token V4.1 demo prefill once the index-K store was in torch (py-spy). CPU
tensors get `combine_torch` below (same k-order fp32 accumulation); CUDA keeps the kernel.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from winport.patches._base import require_source

TARGET = "sglang.kernels.ops.layernorm.mhc.mhc_combine"


def combine_torch(x_flat: torch.Tensor, pre: torch.Tensor, hc: int, out_dtype: torch.dtype) -> torch.Tensor:
    """y[m, h] = sum_k pre[m, k] * x_flat[m, k*H + h], accumulated in fp32 for k = 0..hc-1 (the
    kernel's order: a multiply, then an add per stream), returned in out_dtype."""
    m, width = x_flat.shape
    if width % hc:
        raise ValueError(f"mhc_combine: row width {width} is not a multiple of hc={hc}")
    if pre.shape[0] != m or pre.shape[-1] != hc:
        raise ValueError(f"mhc_combine: pre {tuple(pre.shape)} does not match {m} rows x {hc} streams")
    x = x_flat.reshape(m, hc, width // hc).float()
    p = pre.reshape(m, hc).float()
    acc = torch.zeros(m, width // hc, dtype=torch.float32, device=x_flat.device)
    for k in range(hc):
        acc = acc + p[:, k: k + 1] * x[:, k]
    return acc.to(out_dtype)


def _make(original: Any) -> Any:
    def mhc_combine(x_flat: torch.Tensor, pre: torch.Tensor, hc: int, out_dtype: torch.dtype) -> torch.Tensor:
        if x_flat.is_cuda:
            return original(x_flat, pre, hc, out_dtype)
        return combine_torch(x_flat, pre, hc, out_dtype)

    mhc_combine.__wrapped__ = original  # type: ignore[attr-defined]
    return mhc_combine


def apply() -> None:
    """Rebind the module attribute the callers import at call time."""
    module = importlib.import_module("sglang.kernels.ops.layernorm.mhc")
    original = getattr(module.mhc_combine, "__wrapped__", module.mhc_combine)
    module.mhc_combine = _make(original)


def register_patch() -> None:
    """Check the kernel and its V4.1 caller, then apply."""
    require_source(TARGET, "_mhc_combine_kernel[(m, triton.cdiv(h, block_h))](", "y[m, h] = sum_k pre[m, k]")
    require_source("sglang.srt.models.deepseek_v4_mhc._combine",
                   "from sglang.kernels.ops.layernorm.mhc import mhc_combine",
                   "return norm(mhc_combine(x_flat, apply_pre, cfg.mult, x.dtype))")
    apply()
