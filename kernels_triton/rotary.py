"""Rotary embedding from a cos/sin cache (sgl_kernel / flashinfer apply_rope_with_cos_sin_cache_inplace).

cos_sin_cache is fp32 [max_pos, rot_dim]: cos in the first half, sin in the second. Only the first
rot_dim dims of each head rotate. NeoX style pairs (i, i + rot_dim/2); GPT-J style pairs (2i, 2i+1).

A streaming, memory-bound kernel that rewrites the rotated part of each head in place. The rotated
slice of one head is small (64 bf16 dims = 128 B for DeepSeek-V4), so one program handles a tile of
BLOCK_T tokens x BLOCK_H q heads, and the first head block of a token also rotates its k heads (one
launch, no near-empty programs for 64 q + 1 k heads): enough bytes in flight per program to keep HBM
busy, and GPT-J pairs are loaded as one contiguous row and split in
registers so the loads vectorize instead of striding by two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_tile(x_ptr, pos_ptr, cache_ptr, tok0, h0, nnz, n_heads, tok_stride, head_stride, cache_stride,
               HALF: tl.constexpr, BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
               NEOX: tl.constexpr):
    # Rotate heads [h0, h0 + BLOCK_H) of tokens [tok0, tok0 + BLOCK_T) of one tensor in place. The
    # tile rows are the (token, head) pairs; the cos/sin row of a token repeats for its heads (L1 hits).
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    tok = tok0 + r // BLOCK_H
    head = h0 + r % BLOCK_H
    row_ok = ((tok < nnz) & (head < n_heads))[:, None]
    pos = tl.load(pos_ptr + tok, mask=tok < nnz, other=0).to(tl.int64)
    base = x_ptr + (tok * tok_stride + head * head_stride)[:, None]
    i = tl.arange(0, BLOCK)[None, :]
    mi = row_ok & (i < HALF)
    c_ptr = cache_ptr + pos[:, None] * cache_stride + i
    cos = tl.load(c_ptr, mask=mi, other=0.0)
    sin = tl.load(c_ptr + HALF, mask=mi, other=0.0)
    if NEOX:
        # Pairs (i, i + HALF): two contiguous half rows.
        x1 = tl.load(base + i, mask=mi, other=0.0).to(tl.float32)
        x2 = tl.load(base + i + HALF, mask=mi, other=0.0).to(tl.float32)
        tl.store(base + i, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mi)
        tl.store(base + i + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mi)
    else:
        # Pairs (2i, 2i + 1): load the 2*HALF dims as one contiguous row, split even/odd in registers.
        j = tl.arange(0, 2 * BLOCK)[None, :]
        mj = row_ok & (j < 2 * HALF)
        x = tl.load(base + j, mask=mj, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_T * BLOCK_H, BLOCK, 2)))
        o = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        tl.store(base + j, tl.reshape(o, (BLOCK_T * BLOCK_H, 2 * BLOCK)).to(x_ptr.dtype.element_ty), mask=mj)


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr, nnz, n_q_heads, n_k_heads, q_tok_stride, q_head_stride,
                 k_tok_stride, k_head_stride, cache_stride, HALF: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, HAS_K: tl.constexpr,
                 NEOX: tl.constexpr):
    # Program (i, j): q heads [j*BLOCK_H, (j+1)*BLOCK_H) of BLOCK_T tokens; the programs with j == 0 also
    # rotate all k heads of their tokens (so 64 q + 1 k heads make one full tile, not a near-empty one).
    tok0 = tl.program_id(0).to(tl.int64) * BLOCK_T
    h0 = tl.program_id(1) * BLOCK_H
    _rope_tile(q_ptr, pos_ptr, cache_ptr, tok0, h0, nnz, n_q_heads, q_tok_stride, q_head_stride, cache_stride,
               HALF, BLOCK, BLOCK_T, BLOCK_H, NEOX)
    if HAS_K:
        if h0 == 0:
            _rope_tile(k_ptr, pos_ptr, cache_ptr, tok0, 0, nnz, n_k_heads, k_tok_stride, k_head_stride,
                       cache_stride, HALF, BLOCK, BLOCK_T, BLOCK_K, NEOX)


def rope_config(n_q_heads: int, rot: int) -> tuple[int, int, int]:
    """Default (BLOCK_T, BLOCK_H, num_warps), from the H200 sweep (scripts/bench/ops.py --sweep):
    32 q heads x 1 token per program at 64 rotary dims (about 2048 rotated elements)."""
    block_h = min(triton.next_power_of_2(max(n_q_heads, 1)), 32)
    block_t = max(1, 2048 // (block_h * triton.next_power_of_2(rot)))
    return block_t, block_h, 4


def rope_triton(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
                cos_sin_cache: torch.Tensor, is_neox: bool, config: tuple[int, int, int] | None = None) -> None:
    """Rotate query and key in place (views [nnz, heads, head_size] of the caller's tensors).

    config = (BLOCK_T tokens, BLOCK_H q heads, num_warps) per program overrides rope_config
    (benchmarks, tests)."""
    nnz = positions.numel()
    if nnz == 0:
        return
    q3 = query.view(nnz, -1, head_size)
    k3 = key.view(nnz, -1, head_size) if key is not None else q3
    if q3.stride(-1) != 1 or k3.stride(-1) != 1:
        raise ValueError("rope_triton: query/key must have unit stride in the head dim")
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    n_q, n_k = q3.shape[1], (k3.shape[1] if key is not None else 0)
    block_t, block_h, warps = config or rope_config(n_q, rot)
    grid = (triton.cdiv(nnz, block_t), triton.cdiv(n_q, block_h))
    _rope_kernel[grid](positions, q3, k3, cos_sin_cache, nnz, n_q, n_k, q3.stride(0), q3.stride(1),
                       k3.stride(0), k3.stride(1), cos_sin_cache.stride(0), HALF=half,
                       BLOCK=triton.next_power_of_2(half), BLOCK_T=block_t, BLOCK_H=block_h,
                       BLOCK_K=max(triton.next_power_of_2(n_k), 2), HAS_K=n_k > 0, NEOX=bool(is_neox),
                       num_warps=warps)


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
