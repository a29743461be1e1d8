"""RMSNorm family (sgl_kernel rmsnorm, fused_add_rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm).

One program normalizes one row; the row is read once into registers (hidden 5120 fits), so the
kernel moves exactly input + output bytes (+ residual twice for the fused add): memory-bound.
Statistics are computed in fp32 like upstream; the gemma variants scale by (1 + weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_triton._dispatch import next_pow2


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, n_cols, x_stride, r_stride, out_stride, eps,
                    HAS_RESIDUAL: tl.constexpr, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = x + r
        # Upstream stores the sum in the residual's dtype and normalizes that rounded value.
        x_rounded = x.to(r_ptr.dtype.element_ty)
        tl.store(r_ptr + row * r_stride + cols, x_rounded, mask=mask)
        x = x_rounded.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    y = x * rstd * w
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
                   residual: torch.Tensor | None = None, gemma: bool = False) -> None:
    """Launch the row-wise RMSNorm kernel; with `residual`, residual += x and out = norm(residual)."""
    x2, o2 = _rows(x), _rows(out)
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    assert x2.stride(-1) == 1 and o2.stride(-1) == 1, "rows must be contiguous in the last dim"
    r2 = _rows(residual) if residual is not None else x2
    block = next_pow2(n_cols)
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    _rmsnorm_kernel[(n_rows,)](x2, r2, weight, o2, n_cols, x2.stride(0), r2.stride(0), o2.stride(0),
                               float(eps), HAS_RESIDUAL=residual is not None, GEMMA=gemma, BLOCK=block,
                               num_warps=num_warps)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    """fp32 torch reference: x / sqrt(mean(x^2) + eps) * w (or * (1 + w) for gemma)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    return (y * w).to(x.dtype)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          gemma: bool = False) -> None:
    """In place: residual += x (in residual's dtype), x = norm(residual)."""
    residual.copy_((residual.float() + x.float()).to(residual.dtype))
    x.copy_(rmsnorm_ref(residual, weight, eps, gemma))
