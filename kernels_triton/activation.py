"""Gated activations (sgl_kernel silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, silu_and_mul_clamp).

out = act(x[..., :d]) * x[..., d:]. One program per (row, column block): a pure streaming
kernel (reads 2d, writes d per row). The clamped variant is DeepSeek-V4's swiglu_limit:
gate clamped from above at `limit`, up clamped to [-limit, limit].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ACTS = ("silu", "gelu", "gelu_tanh")


@triton.jit
def _tanh(x):
    # tl.math.tanh is missing on some Triton versions; this form is exact enough for fp32.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, d, x_stride, out_stride, limit,
                        ACT: tl.constexpr, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    if CLAMP:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    if ACT == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        a = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    tl.store(out_ptr + row * out_stride + cols, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


def act_and_mul_triton(x: torch.Tensor, out: torch.Tensor, act: str, limit: float | None = None) -> None:
    """Launch the gated-activation kernel; `limit` selects the clamped (swiglu_limit) variant."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    o2 = out.reshape(-1, d)
    if x2.shape[0] == 0 or d == 0:
        return
    assert x2.stride(-1) == 1 and o2.stride(-1) == 1
    block = min(1024, triton.next_power_of_2(d))
    grid = (x2.shape[0], triton.cdiv(d, block))
    _act_and_mul_kernel[grid](x2, o2, d, x2.stride(0), o2.stride(0), float(limit or 0.0),
                              ACT=ACTS.index(act), CLAMP=limit is not None, BLOCK=block)


def act_and_mul_ref(x: torch.Tensor, act: str, limit: float | None = None) -> torch.Tensor:
    """fp32 torch reference of act(gate) * up."""
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    if limit is not None:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    if act == "silu":
        a = F.silu(g)
    elif act == "gelu":
        a = F.gelu(g)
    else:
        a = F.gelu(g, approximate="tanh")
    return (a * u).to(x.dtype)
