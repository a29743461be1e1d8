"""moe_sum / moe_sum_reduce (sgl_kernel): out[t] = sum_k x[t, k] (* routed_scaling_factor).

Streaming reduction over the top-k slot axis in fp32, one program per (token, hidden block):
memory-bound (reads topk * hidden, writes hidden per token).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _moe_sum_kernel(x_ptr, out_ptr, topk, hidden, x_stride0, x_stride1, out_stride, scale,
                    BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(topk):
        acc += tl.load(x_ptr + t * x_stride0 + k * x_stride1 + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * out_stride + cols, (acc * scale).to(out_ptr.dtype.element_ty), mask=m)


def moe_sum_triton(x: torch.Tensor, out: torch.Tensor, scale: float = 1.0) -> None:
    """x [T, K, H] -> out [T, H]."""
    t, k, h = x.shape
    if t == 0:
        return
    assert x.stride(2) == 1 and out.stride(1) == 1
    block = min(1024, triton.next_power_of_2(h))
    _moe_sum_kernel[(t, triton.cdiv(h, block))](x, out, k, h, x.stride(0), x.stride(1), out.stride(0),
                                                float(scale), BLOCK=block)


def moe_sum_ref(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """fp32 sum over dim 1, scaled, cast back."""
    return (x.float().sum(dim=1) * scale).to(x.dtype)
