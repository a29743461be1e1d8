"""FlashAttention-3 forward semantics (flash_attn_varlen_func, flash_attn_with_kvcache) in Triton.

One kernel serves both entry points: queries are in varlen layout [total_q, Hq, D] with cu_seqlens_q;
keys/values come either from a varlen buffer (row = cu_seqlens_k[b] + j) or from a paged cache
(row = page_table[b, j // P] * P + j % P; a dense [B, S, H, D] cache is the P = S case). Features:
causal masking aligned bottom-right as FA does (query i of a length-Sq sequence sees key j when
j <= i + Sk - Sq), sliding window (left, right), tanh softcap, GQA/MQA (query head h reads KV head
h // (Hq / Hk)), natural-log softmax LSE. Online softmax in fp32 with tl.dot on tiles, no
Hopper-only features (TMA, wgmma, warp specialization), so it runs on SM80-SM120.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _fa_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, seqk_ptr, pt_ptr,
                   sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, pt_stride, page_size,
                   n_q_heads, group, head_dim, sm_scale, softcap, win_left, win_right,
                   PAGED: tl.constexpr, HAS_SEQK: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    mblk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    len_q = tl.load(cu_q_ptr + b + 1) - q_start
    if mblk * BLOCK_M >= len_q:
        return
    if HAS_SEQK:
        len_k = tl.load(seqk_ptr + b)
    else:
        len_k = tl.load(cu_k_ptr + b + 1) - tl.load(cu_k_ptr + b)
    k_start = 0
    if not PAGED:
        k_start = tl.load(cu_k_ptr + b)
    kvh = h // group
    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < len_q
    d_valid = offs_d < head_dim
    q = tl.load(q_ptr + (q_start + offs_m).to(tl.int64)[:, None] * sq_t + h * sq_h + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    diag = offs_m + (len_k - len_q)  # bottom-right aligned query position in key coordinates
    lo = 0
    hi = len_k
    if CAUSAL:
        hi = tl.minimum(len_k, mblk * BLOCK_M + BLOCK_M + (len_k - len_q))
    if HAS_WINDOW:
        if win_right >= 0:
            hi = tl.minimum(hi, mblk * BLOCK_M + BLOCK_M + (len_k - len_q) + win_right)
        if win_left >= 0:
            lo = tl.maximum(0, mblk * BLOCK_M + (len_k - len_q) - win_left)
            lo = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < len_k
        if PAGED:
            page = tl.load(pt_ptr + b.to(tl.int64) * pt_stride + offs_n // page_size, mask=n_valid, other=0)
            rows = page.to(tl.int64) * page_size + offs_n % page_size
        else:
            rows = (k_start + offs_n).to(tl.int64)
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(k_ptr + rows[:, None] * sk_t + kvh * sk_h + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * sm_scale
        if SOFTCAP:
            y = s / softcap
            e = tl.exp(-2.0 * tl.abs(y))
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(y >= 0, t, -t) * softcap
        allowed = m_valid[:, None] & n_valid[None, :]
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= diag[:, None])
        if HAS_WINDOW:
            if win_left >= 0:
                allowed = allowed & (offs_n[None, :] >= diag[:, None] - win_left)
            if win_right >= 0:
                allowed = allowed & (offs_n[None, :] <= diag[:, None] + win_right)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + rows[:, None] * sv_t + kvh * sv_h + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(o_ptr + (q_start + offs_m).to(tl.int64)[:, None] * so_t + h * so_h + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(lse_ptr + (q_start + offs_m).to(tl.int64) * n_q_heads + h, lse, mask=m_valid)


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     max_seqlen_q: int, *, cu_seqlens_k: torch.Tensor | None = None,
                     seqused_k: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                     softmax_scale: float | None = None, causal: bool = False,
                     window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [total_q, Hq, D]; k/v varlen [total_k, Hk, D] or paged [pages, P, Hk, D] (with page_table).

    Returns (out [total_q, Hq, D], lse [total_q, Hq] fp32, natural log)."""
    total_q, hq, d = q.shape
    b = cu_seqlens_q.numel() - 1
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(total_q, hq, dtype=torch.float32, device=q.device)
    if total_q == 0 or b == 0:
        return out, lse
    paged = page_table is not None
    if paged:
        page_size = k.shape[1]
        k2, v2 = k.reshape(-1, k.shape[-2], d), v.reshape(-1, v.shape[-2], d)
    else:
        page_size = 1
        k2, v2 = k, v
    hk = k2.shape[1]
    assert hq % hk == 0 and q.stride(-1) == 1 and k2.stride(-1) == 1 and v2.stride(-1) == 1
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    has_window = left >= 0 or (right >= 0 and not causal)
    block_d = max(16, triton.next_power_of_2(d))
    block = 16 if q.device.type == "cpu" else (64 if block_d <= 128 else 32)
    cu_q = cu_seqlens_q.to(torch.int32)
    grid = (triton.cdiv(max(int(max_seqlen_q), 1), block), b, hq)
    _fa_fwd_kernel[grid](
        q, k2, v2, out, lse, cu_q, cu_seqlens_k if cu_seqlens_k is not None else cu_q,
        seqused_k if seqused_k is not None else cu_q, page_table if paged else cu_q,
        q.stride(0), q.stride(1), k2.stride(0), k2.stride(1), v2.stride(0), v2.stride(1),
        out.stride(0), out.stride(1), page_table.stride(0) if paged else 0, page_size, hq, hq // hk, d,
        float(scale), float(softcap), left, right, PAGED=paged, HAS_SEQK=seqused_k is not None,
        CAUSAL=bool(causal), HAS_WINDOW=has_window, SOFTCAP=softcap > 0,
        # The interpreter multiplies bf16 tiles as raw bits in tl.dot; upcast there (and for fp32).
        UPCAST=q.device.type == "cpu" or q.dtype == torch.float32, BLOCK_M=block, BLOCK_N=block,
        BLOCK_D=block_d, num_warps=4 if block_d <= 128 else 8)
    return out, lse


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, *,
                  cu_seqlens_k: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
                  page_table: torch.Tensor | None = None, softmax_scale: float | None = None,
                  causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                  softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference with the same arguments; returns (out in q's dtype, lse [total_q, Hq])."""
    total_q, hq, d = q.shape
    out = torch.zeros(total_q, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((total_q, hq), float("-inf"), dtype=torch.float32, device=q.device)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    cq = cu_seqlens_q.tolist()
    for bi in range(len(cq) - 1):
        qs, qe = cq[bi], cq[bi + 1]
        if page_table is not None:
            lk = int(seqused_k[bi])
            p = k.shape[1]
            pos = torch.arange(lk, device=q.device)
            rows = page_table[bi, pos // p].long() * p + pos % p
            kb = k.reshape(-1, k.shape[-2], d)[rows]
            vb = v.reshape(-1, v.shape[-2], d)[rows]
        else:
            ks = int(cu_seqlens_k[bi])
            lk = int(seqused_k[bi]) if seqused_k is not None else int(cu_seqlens_k[bi + 1]) - ks
            kb, vb = k[ks:ks + lk], v[ks:ks + lk]
        lq = qe - qs
        if lq == 0:
            continue
        rep = hq // kb.shape[1]
        kb = kb.float().repeat_interleave(rep, dim=1)
        vb = vb.float().repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[qs:qe].float(), kb) * scale
        if softcap > 0:
            s = torch.tanh(s / softcap) * softcap
        i = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        j = torch.arange(lk, device=q.device)[None, :]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        left, right = window_size
        if causal:
            right = 0 if right < 0 else min(right, 0)
        if right >= 0:
            allowed &= j <= i + right
        if left >= 0:
            allowed &= j >= i - left
        s = s.masked_fill(~allowed, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [h, q]
        pr = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", pr, vb)
        lse[qs:qe] = row_lse.transpose(0, 1)
    return out.to(q.dtype), lse
