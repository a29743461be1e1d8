"""Rotary embedding from a cos/sin cache (sgl_kernel / flashinfer apply_rope_with_cos_sin_cache_inplace).

cos_sin_cache is fp32 [max_pos, rot_dim]: cos in the first half, sin in the second. Only the first
rot_dim dims of each head rotate. NeoX style pairs (i, i + rot_dim/2); GPT-J style pairs (2i, 2i+1).
One program per (token, head) of q and k: a streaming, memory-bound kernel that reads and writes
the rotated part of each head in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr, n_q_heads, n_k_heads, q_tok_stride, q_head_stride,
                 k_tok_stride, k_head_stride, cache_stride, HALF: tl.constexpr, BLOCK: tl.constexpr,
                 NEOX: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK)
    m = i < HALF
    cos = tl.load(cache_ptr + pos * cache_stride + i, mask=m, other=0.0)
    sin = tl.load(cache_ptr + pos * cache_stride + HALF + i, mask=m, other=0.0)
    if head < n_q_heads:
        base = q_ptr + tok * q_tok_stride + head * q_head_stride
    else:
        base = k_ptr + tok * k_tok_stride + (head - n_q_heads) * k_head_stride
    if NEOX:
        i1 = i
        i2 = i + HALF
    else:
        i1 = 2 * i
        i2 = 2 * i + 1
    x1 = tl.load(base + i1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + i2, mask=m, other=0.0).to(tl.float32)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    tl.store(base + i1, o1.to(base.dtype.element_ty), mask=m)
    tl.store(base + i2, o2.to(base.dtype.element_ty), mask=m)


def rope_triton(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
                cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotate query and key in place (views [nnz, heads, head_size] of the caller's tensors)."""
    nnz = positions.numel()
    if nnz == 0:
        return
    q3 = query.view(nnz, -1, head_size)
    k3 = key.view(nnz, -1, head_size) if key is not None else q3[:, :0]
    assert q3.stride(-1) == 1 and k3.stride(-1) == 1
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    n_q, n_k = q3.shape[1], (k3.shape[1] if key is not None else 0)
    _rope_kernel[(nnz, n_q + n_k)](positions, q3, k3, cos_sin_cache, n_q, n_k, q3.stride(0), q3.stride(1),
                                   k3.stride(0), k3.stride(1), cos_sin_cache.stride(0), HALF=half,
                                   BLOCK=triton.next_power_of_2(half), NEOX=bool(is_neox))


def rope_ref(positions: torch.Tensor, x: torch.Tensor, head_size: int, cos_sin_cache: torch.Tensor,
             is_neox: bool) -> torch.Tensor:
    """fp32 torch reference; returns the rotated copy of x ([nnz, heads*head_size] or 3-D)."""
    nnz = positions.numel()
    x3 = x.reshape(nnz, -1, head_size).float()
    rot = cos_sin_cache.shape[-1]
    cs = cos_sin_cache.float()[positions.long()]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    out = x3.clone()
    if is_neox:
        x1, x2 = x3[..., : rot // 2], x3[..., rot // 2: rot]
        out[..., : rot // 2] = x1 * cos - x2 * sin
        out[..., rot // 2: rot] = x2 * cos + x1 * sin
    else:
        x1, x2 = x3[..., 0:rot:2], x3[..., 1:rot:2]
        out[..., 0:rot:2] = x1 * cos - x2 * sin
        out[..., 1:rot:2] = x2 * cos + x1 * sin
    return out.to(x.dtype).reshape(x.shape)
