"""Per-token-group 8-bit quantization (sgl_kernel sgl_per_token_group_quant_8bit / _fp8 / _int8,
sgl_per_token_quant_fp8, sgl_per_tensor_quant_fp8).

For each group of `group_size` consecutive values of a row: s = max(absmax, eps) / qmax (rounded up
to a power of two for UE8M0 scales), q = clamp(x / s, qmin, qmax) cast to fp8 (or rounded to int8).
One program per (row, block of groups): a streaming kernel; the scale tensor is written through its
strides so column-major (transposed) scale layouts work as upstream allows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, n_groups, x_stride, q_stride, s_stride_row, s_stride_grp, eps,
                        qmin, qmax, GROUP: tl.constexpr, CBLOCK: tl.constexpr, GBLOCK: tl.constexpr,
                        UE8M0: tl.constexpr, IS_INT: tl.constexpr):
    # CBLOCK: GROUP rounded up to a power of two (tl.arange needs one; per-token quantization makes
    # the whole row one group, e.g. 5120); the padding lanes are masked off and read as 0.
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GBLOCK + tl.arange(0, GBLOCK)
    c = tl.arange(0, CBLOCK)
    m = (g < n_groups)[:, None] & (c < GROUP)[None, :]
    gm = g < n_groups
    offs = g[:, None] * GROUP + c[None, :]
    x = tl.load(x_ptr + row * x_stride + offs, mask=m, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), eps)
    s = amax / qmax
    if UE8M0:
        s = tl.exp2(tl.ceil(tl.log2(s)))
    y = x / s[:, None]
    y = tl.minimum(tl.maximum(y, qmin), qmax)
    if IS_INT:
        # Round half away from zero like the CUDA cast path (rintf would be half-to-even;
        # the difference only shows on exact .5 ties, which random inputs never hit).
        y = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))
    tl.store(q_ptr + row * q_stride + offs, y.to(q_ptr.dtype.element_ty), mask=m)
    tl.store(s_ptr + row * s_stride_row + g * s_stride_grp, s, mask=gm)


def _qrange(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.int8:
        return -128.0, 127.0
    fi = torch.finfo(dtype)
    return float(fi.min), float(fi.max)


def group_quant_triton(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group_size: int, eps: float,
                       qmin: float, qmax: float, ue8m0: bool = False) -> None:
    """x [..., H] -> q (same shape, 8-bit) and s [..., H/group] (fp32, any 2-D strides)."""
    x2 = x.reshape(-1, x.shape[-1])
    q2 = q.reshape(-1, q.shape[-1])
    s2 = s.reshape(-1, s.shape[-1]) if s.dim() != 2 else s
    rows, h = x2.shape
    if rows == 0:
        return
    assert h % group_size == 0 and x2.stride(1) == 1 and q2.stride(1) == 1
    n_groups = h // group_size
    q_dst = q2
    if x.device.type == "cpu" and q.dtype != torch.int8:
        # Triton 3.8's interpreter rounds fp32 -> fp8 wrongly when rounding carries into the exponent
        # (-127.76 -> -64); on CPU the kernel writes fp32 and torch does the (correct) final cast.
        q_dst = torch.empty(q2.shape, dtype=torch.float32)
    cblock = triton.next_power_of_2(group_size)
    gblock = max(1, min(triton.next_power_of_2(n_groups), 4096 // cblock))
    _group_quant_kernel[(rows, triton.cdiv(n_groups, gblock))](
        x2, q_dst, s2, n_groups, x2.stride(0), q_dst.stride(0), s2.stride(0), s2.stride(1), float(eps),
        float(qmin), float(qmax), GROUP=group_size, CBLOCK=cblock, GBLOCK=gblock, UE8M0=bool(ue8m0),
        IS_INT=q.dtype == torch.int8)
    if q_dst is not q2:
        q2.copy_(q_dst.to(q.dtype))


def group_quant_ref(x: torch.Tensor, group_size: int, eps: float, qmin: float, qmax: float,
                    out_dtype: torch.dtype, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """torch reference: (q [..., H] out_dtype, s [..., H/group] fp32)."""
    shp = x.shape
    xg = x.float().reshape(*shp[:-1], shp[-1] // group_size, group_size)
    s = xg.abs().amax(-1).clamp_min(eps) / qmax
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    y = (xg / s[..., None]).clamp(qmin, qmax)
    if out_dtype == torch.int8:
        y = torch.where(y >= 0, torch.floor(y + 0.5), torch.ceil(y - 0.5))
    return y.reshape(shp).to(out_dtype), s
