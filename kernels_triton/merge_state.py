"""Merge two partial attention states (sgl_kernel merge_state_v2, flashinfer.cascade.merge_state).

v = (v_a * e^{s_a - m} + v_b * e^{s_b - m}) / (e^{s_a - m} + e^{s_b - m}), s = m + log(sum) with
m = max(s_a, s_b). sgl_kernel's LSE is natural-log and treats +inf as -inf (an empty partial);
flashinfer's LSE is base 2 (BASE2=True). One program per (token, head): memory-bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(va_ptr, sa_ptr, vb_ptr, sb_ptr, vo_ptr, so_ptr, n_heads, head_dim, va_s0, va_s1, vb_s0,
                  vb_s1, vo_s0, vo_s1, BASE2: tl.constexpr, WRITE_LSE: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sa = tl.load(sa_ptr + t * n_heads + h).to(tl.float32)
    sb = tl.load(sb_ptr + t * n_heads + h).to(tl.float32)
    sa = tl.where(sa == float("inf"), float("-inf"), sa)
    sb = tl.where(sb == float("inf"), float("-inf"), sb)
    m = tl.maximum(sa, sb)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    if BASE2:
        ea = tl.exp2(sa - m_safe)
        eb = tl.exp2(sb - m_safe)
    else:
        ea = tl.exp(sa - m_safe)
        eb = tl.exp(sb - m_safe)
    tot = ea + eb
    d = tl.arange(0, BLOCK)
    dm = d < head_dim
    a = tl.load(va_ptr + t * va_s0 + h * va_s1 + d, mask=dm, other=0.0).to(tl.float32)
    b = tl.load(vb_ptr + t * vb_s0 + h * vb_s1 + d, mask=dm, other=0.0).to(tl.float32)
    o = (a * ea + b * eb) / tot
    tl.store(vo_ptr + t * vo_s0 + h * vo_s1 + d, o.to(vo_ptr.dtype.element_ty), mask=dm)
    if WRITE_LSE:
        if BASE2:
            s = tl.log2(tot) + m_safe
        else:
            s = tl.log(tot) + m_safe
        tl.store(so_ptr + t * n_heads + h, s)


def merge_state_triton(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                       v_out: torch.Tensor, s_out: torch.Tensor | None, base2: bool = False) -> None:
    """v_* [N, H, D], s_* [N, H] fp32 contiguous."""
    n, h, dim = v_a.shape
    if n == 0:
        return
    assert v_a.stride(2) == 1 and v_b.stride(2) == 1 and v_out.stride(2) == 1
    _merge_kernel[(n, h)](v_a, s_a.contiguous(), v_b, s_b.contiguous(), v_out,
                          s_out if s_out is not None else s_a, h, dim, v_a.stride(0), v_a.stride(1),
                          v_b.stride(0), v_b.stride(1), v_out.stride(0), v_out.stride(1), BASE2=base2,
                          WRITE_LSE=s_out is not None, BLOCK=triton.next_power_of_2(dim))


def merge_state_ref(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                    base2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference: (v [N, H, D] in v_a's dtype, s [N, H] fp32)."""
    sa = s_a.float().masked_fill(s_a == float("inf"), float("-inf"))
    sb = s_b.float().masked_fill(s_b == float("inf"), float("-inf"))
    m = torch.maximum(sa, sb)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    ex = torch.exp2 if base2 else torch.exp
    ea, eb = ex(sa - m), ex(sb - m)
    tot = ea + eb
    v = (v_a.float() * ea[..., None] + v_b.float() * eb[..., None]) / tot[..., None]
    s = (torch.log2(tot) if base2 else torch.log(tot)) + m
    return v.to(v_a.dtype), s
