"""Sparse MLA attention of DeepSeek-V4: decode on the FP8 paged V4 cache, prefill on bf16 rows.

Replaces FlashMLA's `flash_mla_with_kvcache` (sparse mode: `indices` given, FP8 "V4" K cache of
584 bytes per token, optional `extra_k_cache` with its own indices, per-query `topk_length`,
attention sink) and `flash_mla_sparse_fwd` (sparse prefill over a dense bf16 `kv`), as SGLang
0.5.23's DeepSeek-V4 backend calls them.

Semantics (FlashMLA's documented interface and reference, restated, not copied):
- MQA with one KV head: every query head attends to the same gathered tokens; K is the full
  512-dim row (448 nope + 64 rope) and V is its first `head_dim_v` (= 512) dims.
- A token slot is ignored when its index is -1 (decode), negative or >= s_kv (prefill), or its
  position in the index row is >= topk_length. Decode attends to the union of the main and the
  extra (compressed-KV) token lists in one softmax.
- scores = q . k * softmax_scale; lse = natural-log logsumexp of the valid scores (the sink is not
  part of lse); out = softmax @ V, then, with a sink, out *= 1 / (1 + exp(sink - lse)).
- A query with no valid token gets out = 0 and lse = +inf (and max_logits = -inf in prefill).
- Returned layouts: decode out `[b, s_q, h_q, dv]` bf16, lse `[b, h_q, s_q]` fp32; prefill out
  `[s_q, h_q, dv]` bf16, max_logits and lse `[s_q, h_q]` fp32.

The torch references are also the CPU path (batched gathers and matmuls, chunked over query rows
to bound memory). The Triton kernel is one flash-decoding style kernel for both: a program owns
(query token, block of heads, split of the token list), runs an online softmax in base 2, and
either finishes the row (one split) or writes a partial that a small combine kernel merges.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_triton import _env
from kernels_triton import dsv4_kv_layout as kvl
from kernels_triton._dispatch import use_triton

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Rows of queries handled per batched matmul in the references: bounds the fp32 gather to about
# chunk x tokens x 512 x 4 bytes.
_REF_GATHER_BYTES = 256 << 20


# ----------------------------------------------------------------------------------------------
# Torch references (also the CPU path)
# ----------------------------------------------------------------------------------------------


def _attend_reference(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, scale: float,
                      attn_sink: torch.Tensor | None, d_v: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, H, D], kv [T, K, D], valid [T, K] -> (out fp32 [T, H, dv], lse [T, H], max [T, H])."""
    scores = torch.einsum("thd,tkd->thk", q, kv) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    mx = scores.amax(dim=-1) if scores.shape[-1] else scores.new_full(scores.shape[:2], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1) if scores.shape[-1] else mx.clone()
    lonely = torch.isneginf(lse)
    probs = torch.exp(scores - torch.where(lonely, 0.0, lse)[..., None])  # exp(-inf) rows -> 0
    out = torch.einsum("thk,tkd->thd", probs, kv[..., :d_v])
    if attn_sink is not None:
        # exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink); +inf sink -> 0, -inf sink -> 1.
        out = out * torch.sigmoid(lse - attn_sink.float()[None, :])[..., None]
    out = out.masked_fill(lonely[..., None], 0.0)
    lse = lse.masked_fill(lonely, float("inf"))
    return out, lse, mx


def _rows_per_chunk(num_tokens: int, dim: int) -> int:
    return max(1, _REF_GATHER_BYTES // max(1, num_tokens * dim * 4))


def sparse_mla_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    head_dim_v: int = kvl.HEAD_DIM,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over V4 FP8 paged caches (FlashMLA `flash_mla_with_kvcache`, sparse mode).

    q `[b, s_q, h_q, 512]` bf16; k_cache / extra_k_cache: V4 caches as the `[pages, P, 1, 584]`
    views SGLang passes (page stride = the padded page bytes, see dsv4_kv_layout); indices /
    extra_indices `[b, s_q, topk]` int32 token indices `page * P + slot` (-1 = none);
    topk_length / extra_topk_length `[b]` int32; attn_sink `[h_q]` fp32.
    Returns (out `[b, s_q, h_q, head_dim_v]` bf16, lse `[b, h_q, s_q]` fp32).
    """
    b, s_q, h_q, d = q.shape
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    t = b * s_q
    ids, valid = _decode_token_list(k_cache, indices, topk_length, b, s_q)
    sources = [(k_cache, ids, valid)]
    if extra_k_cache is not None:
        ex_ids, ex_valid = _decode_token_list(extra_k_cache, extra_indices, extra_topk_length, b, s_q)
        sources.append((extra_k_cache, ex_ids, ex_valid))
    total = sum(s[1].shape[1] for s in sources)
    qf = q.reshape(t, h_q, d).float()
    out = torch.empty(t, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h_q, dtype=torch.float32, device=q.device)
    step = _rows_per_chunk(total, d)
    for r0 in range(0, t, step):  # chunks of query rows, not a loop over tokens
        rows = slice(r0, min(t, r0 + step))
        kv = torch.cat([kvl.gather_k_v4_reference(c, i[rows]) for c, i, _ in sources], dim=1)
        kv = kv.masked_fill(kv.isnan(), 0.0)  # masked slots may point at never-written rows
        vmask = torch.cat([v[rows] for _, _, v in sources], dim=1)
        o, ls, _ = _attend_reference(qf[rows], kv, vmask, softmax_scale, attn_sink, head_dim_v)
        out[rows] = o
        lse[rows] = ls
    return (out.to(torch.bfloat16).view(b, s_q, h_q, head_dim_v),
            lse.view(b, s_q, h_q).transpose(1, 2).contiguous())


def _decode_token_list(cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor | None,
                       b: int, s_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten `[b, s_q, topk]` indices to `[b*s_q, topk]` and their validity mask."""
    check_v4_cache(cache)
    topk = indices.shape[-1]
    ids = indices.reshape(b * s_q, topk).to(torch.int64)
    pages, page_size = kvl.cache_pages(cache)
    valid = (ids >= 0) & (ids < pages.shape[0] * page_size)
    if lengths is not None:
        pos = torch.arange(topk, device=ids.device)
        lens = lengths.reshape(b).to(torch.int64).repeat_interleave(s_q)
        valid &= pos[None, :] < lens[:, None]
    return ids, valid


def check_v4_cache(cache: torch.Tensor) -> None:
    """Raise for a K cache that is not the V4 layout (the only one non-SM100 SGLang allocates)."""
    last = cache.shape[-1]
    if cache.dim() != 4 or last != kvl.BYTES_PER_TOKEN:
        raise NotImplementedError(
            f"sparse decode supports the DeepSeek-V4 FP8 cache ([pages, P, 1, {kvl.BYTES_PER_TOKEN}]); "
            f"got shape {tuple(cache.shape)} (528/288 bytes would be the V4.1 layouts, which SGLang "
            "selects only on SM100)")


def sparse_mla_prefill_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill over bf16 rows (FlashMLA `flash_mla_sparse_fwd`).

    q `[s_q, h_q, d_qk]` bf16, kv `[s_kv, 1, d_qk]` bf16, indices `[s_q, 1, topk]` int32
    (negative or >= s_kv = none), topk_length `[s_q]` int32, attn_sink `[h_q]` fp32.
    Returns (out `[s_q, h_q, d_v]` bf16, max_logits `[s_q, h_q]`, lse `[s_q, h_q]`), statistics in
    natural-log units of the scaled scores.
    """
    s_q, h_q, d = q.shape
    s_kv, h_kv, _ = kv.shape
    if h_kv != 1 or indices.shape[1] != 1:
        raise NotImplementedError("sparse prefill supports one KV head (MQA), as DeepSeek-V4 uses")
    topk = indices.shape[-1]
    ids = indices.reshape(s_q, topk).to(torch.int64)
    valid = (ids >= 0) & (ids < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=ids.device)[None, :] < topk_length.reshape(s_q, 1).to(torch.int64)
    kv2 = kv.reshape(s_kv, d)
    qf = q.float()
    out = torch.empty(s_q, h_q, d_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    mx = torch.empty_like(lse)
    step = _rows_per_chunk(topk, d)
    for r0 in range(0, s_q, step):
        rows = slice(r0, min(s_q, r0 + step))
        g = kv2[ids[rows].clamp(0, max(s_kv - 1, 0))].float() if s_kv else qf.new_zeros(
            ids[rows].shape + (d,))
        g = g.masked_fill(~valid[rows][..., None], 0.0)
        o, ls, m = _attend_reference(qf[rows], g, valid[rows], sm_scale, attn_sink, d_v)
        out[rows], lse[rows], mx[rows] = o, ls, m
    return out.to(torch.bfloat16), mx, lse


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (the CPU test mode of the Triton kernels)."""
    return _env.interpreting()


@triton.jit
def mma(a, b, DOT_F32: tl.constexpr):
    """`a @ b` with fp32 accumulation; bf16 tensor-core inputs, or fp32 inputs under the interpreter.

    Triton's interpreter multiplies the raw bits of bf16 operands in tl.dot, so it gets the same
    (bf16-exact) values widened to fp32 instead; the products are then identical.
    """
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _load_k_v4_bf16(cache_ptr, ids, valid, page_stride, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """`[BLOCK_N, 512]` bf16 K rows of V4-cache token ids (invalid rows read 0).

    Why not `dsv4_kv_layout.load_k_v4_rows`: that one gathers one scale byte per element (512 byte
    loads per row) and returns an fp32 tile. Here each row's 7 scales are one 8-byte load and the
    row is viewed as 8 chunks of 64 columns ([BLOCK_N, 8, 64]: chunks 0-6 e4m3 nope, chunk 7 the
    bf16 rope), so the scale is broadcast along the chunk instead of gathered; the product
    e4m3 x 2^e is exact in bf16, so the tile goes to bf16 right away.
    """
    ids = tl.where(valid, ids, 0).to(tl.int64)
    page = ids // PAGE_SIZE
    slot = ids % PAGE_SIZE
    data_base = page * page_stride + slot * 576
    scale_base = page * page_stride + PAGE_SIZE * 576 + slot * 8
    c = tl.arange(0, 8)
    j = tl.arange(0, 64)
    is_nope = c < 7
    fp8_ptr = cache_ptr.to(tl.pointer_type(tl.float8e4nv))
    bf16_ptr = cache_ptr.to(tl.pointer_type(tl.bfloat16))
    raw = tl.load(fp8_ptr + data_base[:, None, None] + (c * 64)[None, :, None] + j[None, None, :],
                  mask=valid[:, None, None] & is_nope[None, :, None], other=0.0)
    sc = tl.load(cache_ptr + scale_base[:, None] + c[None, :], mask=valid[:, None] & is_nope[None, :], other=0)
    scale = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2**(s-127); 0 for s == 0
    rope = tl.load(bf16_ptr + ((data_base + 448) // 2)[:, None] + j[None, :], mask=valid[:, None], other=0.0)
    k3 = tl.where(is_nope[None, :, None], raw.to(tl.float32) * scale[:, :, None],
                  rope.to(tl.float32)[:, None, :])
    return tl.reshape(k3, (BLOCK_N, 512)).to(tl.bfloat16)


@triton.jit
def _attend_block(acc, m_i, l_i, q, kv_ptr, idx_row_ptr, pos0, topk, length, bound, row_stride,
                  page_stride, sm_scale_log2, PAGE_SIZE: tl.constexpr, KV_FP8: tl.constexpr,
                  BLOCK_N: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, DOT_F32: tl.constexpr):
    """One online-softmax step over token slots [pos0, pos0 + BLOCK_N) of one index row."""
    pos = pos0 + tl.arange(0, BLOCK_N)
    in_row = pos < tl.minimum(topk, length)
    ids = tl.load(idx_row_ptr + pos, mask=in_row, other=-1)
    valid = in_row & (ids >= 0) & (ids < bound)
    if KV_FP8:
        k = _load_k_v4_bf16(kv_ptr, ids, valid, page_stride, PAGE_SIZE, BLOCK_N)
    else:
        cols = tl.arange(0, D)
        safe = tl.where(valid, ids, 0).to(tl.int64)
        k = tl.load(kv_ptr + safe[:, None] * row_stride + cols[None, :], mask=valid[:, None], other=0.0)
        k = k.to(tl.bfloat16)
    s = mma(q, tl.trans(k), DOT_F32) * sm_scale_log2  # [BLOCK_H, BLOCK_N], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-masked so far: keep exp2 finite
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # V is K itself (the launcher requires d_v == d_qk, DeepSeek-V4's 512 / 512).
    acc = acc * alpha[:, None] + mma(p.to(tl.bfloat16), k, DOT_F32)
    return acc, m_new, l_i


@triton.jit
def _sparse_mla_fwd_kernel(
    q_ptr, stride_qt, stride_qh,
    kv_ptr, kv_page_stride, kv_row_stride, idx_ptr, stride_idx, len_ptr, topk, kv_bound,
    ex_ptr, ex_page_stride, ex_idx_ptr, stride_ex_idx, ex_len_ptr, ex_topk, ex_bound,
    sink_ptr,
    o_ptr, stride_ot, stride_oh,
    lse_ptr, stride_lse_b, stride_lse_h, stride_lse_s,
    max_ptr, stride_max_t,
    part_o_ptr, part_stat_ptr,
    H, S_Q, sm_scale_log2, blocks_per_split, num_splits,
    PAGE_SIZE: tl.constexpr, EX_PAGE_SIZE: tl.constexpr, KV_FP8: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EX_LEN: tl.constexpr, HAS_SINK: tl.constexpr,
    WRITE_MAX: tl.constexpr, LSE_LOG2: tl.constexpr, IS_SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    cols = tl.arange(0, D)
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + cols[None, :], mask=hmask[:, None],
                other=0.0).to(tl.bfloat16)
    bidx = t // S_Q
    length = topk
    if HAS_LEN:
        length = tl.load(len_ptr + bidx)
    ex_length = ex_topk
    if HAS_EX_LEN:
        ex_length = tl.load(ex_len_ptr + bidx)

    acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    nb_main = tl.cdiv(topk, BLOCK_N)
    g0 = split * blocks_per_split
    g1 = g0 + blocks_per_split
    # Main token list: global blocks [g0, min(g1, nb_main)); blocks past `length` are skipped.
    main_end = tl.minimum(g1, tl.minimum(nb_main, tl.cdiv(tl.minimum(length, topk), BLOCK_N)))
    for g in range(g0, main_end):
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, kv_ptr, idx_ptr + t * stride_idx, g * BLOCK_N,
                                      topk, length, kv_bound, kv_row_stride, kv_page_stride,
                                      sm_scale_log2, PAGE_SIZE, KV_FP8, BLOCK_N, D, DV, DOT_F32)
    if HAS_EXTRA:
        ex_start = tl.maximum(g0, nb_main) - nb_main
        ex_end = tl.minimum(g1 - nb_main, tl.cdiv(tl.minimum(ex_length, ex_topk), BLOCK_N))
        for g in range(ex_start, ex_end):
            acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, ex_ptr, ex_idx_ptr + t * stride_ex_idx,
                                          g * BLOCK_N, ex_topk, ex_length, ex_bound, 0, ex_page_stride,
                                          sm_scale_log2, EX_PAGE_SIZE, True, BLOCK_N, D, DV, DOT_F32)

    dcols = tl.arange(0, DV)
    empty = l_i == 0.0
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if not IS_SPLIT:
        _finish_rows(o, lse2, m_i, t, heads, hmask, hmask, dcols, sink_ptr, o_ptr, stride_ot, stride_oh,
                     lse_ptr, stride_lse_b, stride_lse_h, stride_lse_s, max_ptr, stride_max_t, S_Q,
                     HAS_SINK, WRITE_MAX, LSE_LOG2)
    else:
        # partial out [T, NUM_SPLITS, H, DV] fp32; stats [T, NUM_SPLITS, 2, H] (lse2, max2)
        row = (t * num_splits + split) * H
        tl.store(part_o_ptr + (row + heads)[:, None] * DV + dcols[None, :], o, mask=hmask[:, None])
        tl.store(part_stat_ptr + 2 * row + heads, lse2, mask=hmask)
        tl.store(part_stat_ptr + 2 * row + H + heads, m_i, mask=hmask)


@triton.jit
def _finish_rows(o, lse2, max2, t, heads, hmask, smask, dcols, sink_ptr, o_ptr, stride_ot, stride_oh,
                 lse_ptr, stride_lse_b, stride_lse_h, stride_lse_s, max_ptr, stride_max_t, S_Q,
                 HAS_SINK: tl.constexpr, WRITE_MAX: tl.constexpr, LSE_LOG2: tl.constexpr):
    """Apply the sink and the no-token rule, then write out (columns `dcols`) and, where `smask`,
    lse (and max) for a block of heads."""
    lonely = lse2 == float("-inf")
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0)
        # 1 / (1 + exp(sink - lse)) in base 2; sink = +inf gives 0, -inf gives 1.
        factor = 1.0 / (1.0 + tl.exp2(sink * 1.4426950408889634 - lse2))
        o = o * factor[:, None]
    o = tl.where(lonely[:, None], 0.0, o)
    tl.store(o_ptr + t * stride_ot + heads[:, None] * stride_oh + dcols[None, :],
             o.to(o_ptr.dtype.element_ty), mask=hmask[:, None])
    if LSE_LOG2:
        lse_out = lse2
    else:
        lse_out = lse2 * 0.6931471805599453
    lse_out = tl.where(lonely, float("inf"), lse_out)
    bidx = t // S_Q
    sidx = t % S_Q
    tl.store(lse_ptr + bidx * stride_lse_b + heads * stride_lse_h + sidx * stride_lse_s, lse_out,
             mask=smask)
    if WRITE_MAX:
        if LSE_LOG2:
            mx = max2
        else:
            mx = max2 * 0.6931471805599453
        tl.store(max_ptr + t * stride_max_t + heads, mx, mask=smask)


@triton.jit
def _combine_kernel(part_o_ptr, part_stat_ptr, sink_ptr, o_ptr, stride_ot, stride_oh,
                    lse_ptr, stride_lse_b, stride_lse_h, stride_lse_s, max_ptr, stride_max_t,
                    H, S_Q, num_splits, SPLITS_P2: tl.constexpr, BLOCK_H: tl.constexpr,
                    DV: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINK: tl.constexpr,
                    WRITE_MAX: tl.constexpr, LSE_LOG2: tl.constexpr):
    """Merge the split partials of one query token, a block of heads and BLOCK_D output columns.

    The D chunk is a grid axis so that at batch 1 the merge runs on DV / BLOCK_D times more SMs, and
    every split's [BLOCK_H, BLOCK_D] partial is one [SPLITS_P2, BLOCK_H, BLOCK_D] load: a loop over
    the splits waited for one L2 round trip per split (on the H200 the one load took a batch-1 layer
    from 17.5 to 15.5 us).
    """
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pid_d = tl.program_id(2)
    hmask = heads < H
    sp = tl.arange(0, SPLITS_P2)
    smask = sp < num_splits
    rows = (t * num_splits + sp) * H  # [SPLITS_P2]
    stat_mask = smask[:, None] & hmask[None, :]
    lse_p = tl.load(part_stat_ptr + 2 * rows[:, None] + heads[None, :], mask=stat_mask,
                    other=float("-inf"))  # [S, BLOCK_H]
    max_p = tl.load(part_stat_ptr + 2 * rows[:, None] + H + heads[None, :], mask=stat_mask,
                    other=float("-inf"))
    top = tl.max(lse_p, axis=0)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse_p - top_safe[None, :])  # empty splits weigh 0
    wsum = tl.sum(w, axis=0)
    empty = wsum == 0.0
    lse2 = tl.where(empty, float("-inf"), top_safe + tl.log2(tl.where(empty, 1.0, wsum)))
    w = w / tl.where(empty, 1.0, wsum)[None, :]
    dcols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    po = tl.load(part_o_ptr + (rows[:, None, None] + heads[None, :, None]) * DV + dcols[None, None, :],
                 mask=stat_mask[:, :, None], other=0.0)  # [S, BLOCK_H, BLOCK_D]
    # a split that saw no token weighs 0 and its partial is never multiplied in (it may be 0/0)
    o = tl.sum(tl.where(w[:, :, None] > 0.0, po * w[:, :, None], 0.0), axis=0)
    _finish_rows(o, lse2, tl.max(max_p, axis=0), t, heads, hmask, hmask & (pid_d == 0), dcols, sink_ptr,
                 o_ptr, stride_ot, stride_oh, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_s, max_ptr,
                 stride_max_t, S_Q, HAS_SINK, WRITE_MAX, LSE_LOG2)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _launch(q3: torch.Tensor, s_q: int, *, kv: torch.Tensor, kv_fp8: bool, indices2: torch.Tensor,
            lengths: torch.Tensor | None, bound: int, page_size: int, page_stride: int, row_stride: int,
            extra: tuple[torch.Tensor, int, int, torch.Tensor, torch.Tensor | None, int] | None,
            sink: torch.Tensor | None, scale: float, d_v: int, out: torch.Tensor, lse: torch.Tensor,
            lse_strides: tuple[int, int, int], max_out: torch.Tensor | None, lse_log2: bool,
            num_splits: int | None, block_h: int | None, block_n: int, num_warps: int | None = None,
            num_stages: int | None = None) -> None:
    """Launch the fused kernel (+ combine) on q3 `[T, H, D]` and `[T, topk]` index rows."""
    t, h, d = q3.shape
    if d_v != d:
        raise NotImplementedError(f"V is the full K row here (d_v == d_qk); got d_v={d_v}, d_qk={d}")
    if d & (d - 1):
        raise NotImplementedError(f"head dim must be a power of two, got {d}")
    topk = indices2.shape[1]
    bh = block_h or 16  # 32/64 heads per program spill (H200 sweep: 1.5-2x slower at every batch)
    n_hb = triton.cdiv(h, bh)
    ex_topk = extra[3].shape[1] if extra is not None else 0
    n_blocks = triton.cdiv(topk, block_n) + triton.cdiv(ex_topk, block_n)
    if num_splits is None:
        # About one wave of programs, down to one block per split (H200 sweeps, RESULTS.md: with the
        # one-load combine of 2026-11-30, batch 1 -> 20 splits of one 32-token block took 12.6 us
        # against 15.9 for 10 of two; before it, 1 block per split lost to the combine's cost;
        # batch >= 16 wants few or no splits).
        want = triton.cdiv(_num_sms(q3.device), max(1, t * n_hb))
        num_splits = max(1, min(want, n_blocks, 32))
    num_splits = max(1, min(num_splits, max(1, n_blocks)))
    bps = triton.cdiv(max(1, n_blocks), num_splits)
    num_splits = triton.cdiv(max(1, n_blocks), bps)
    if t == 0:
        return
    dev = q3.device
    if num_splits > 1:
        part_o = torch.empty(t, num_splits, h, d_v, dtype=torch.float32, device=dev)
        part_stat = torch.empty(t, num_splits, 2, h, dtype=torch.float32, device=dev)
    else:
        part_o = part_stat = out  # unused
    dummy_i = indices2
    if extra is not None:
        ex_kv, ex_page_size, ex_page_stride, ex_idx, ex_len, ex_bound = extra
    else:
        ex_kv, ex_page_size, ex_page_stride, ex_idx, ex_len, ex_bound = kv, 1, 0, dummy_i, None, 0
    if num_warps is None:
        # 8 warps only help when few programs run (batch 1); at batch >= 16 4 warps were 1.3-1.6x faster.
        num_warps = 8 if (bh * d >= 32 * 512 or t * n_hb <= 16) else 4
    extra_opts = {} if num_stages is None else {"num_stages": num_stages}
    _sparse_mla_fwd_kernel[(t, n_hb, num_splits)](
        q3, q3.stride(0), q3.stride(1),
        kv, page_stride, row_stride, indices2, indices2.stride(0),
        lengths if lengths is not None else dummy_i, topk, bound,
        ex_kv, ex_page_stride, ex_idx, ex_idx.stride(0), ex_len if ex_len is not None else dummy_i,
        ex_topk, ex_bound,
        sink if sink is not None else q3,
        out, out.stride(0), out.stride(1),
        lse, *lse_strides,
        max_out if max_out is not None else lse, max_out.stride(0) if max_out is not None else 0,
        part_o, part_stat,
        h, s_q, scale * LOG2E, bps, num_splits,
        PAGE_SIZE=page_size, EX_PAGE_SIZE=ex_page_size, KV_FP8=kv_fp8,
        HAS_LEN=lengths is not None, HAS_EXTRA=extra is not None, HAS_EX_LEN=ex_len is not None,
        HAS_SINK=sink is not None, WRITE_MAX=max_out is not None, LSE_LOG2=lse_log2,
        IS_SPLIT=num_splits > 1, BLOCK_H=bh, BLOCK_N=block_n, D=d, DV=d_v, DOT_F32=interpreting(),
        num_warps=num_warps, **extra_opts,
    )
    if num_splits > 1:
        cbh = min(bh, 8)
        splits_p2 = triton.next_power_of_2(num_splits)
        # at most 8K partial values per program (64 fp32 registers a thread at 4 warps)
        cbd = min(d_v, max(16, 8192 // (splits_p2 * cbh)))
        _combine_kernel[(t, triton.cdiv(h, cbh), d_v // cbd)](
            part_o, part_stat, sink if sink is not None else q3, out, out.stride(0), out.stride(1),
            lse, *lse_strides, max_out if max_out is not None else lse,
            max_out.stride(0) if max_out is not None else 0, h, s_q, num_splits,
            SPLITS_P2=splits_p2, BLOCK_H=cbh, DV=d_v,
            BLOCK_D=cbd, HAS_SINK=sink is not None, WRITE_MAX=max_out is not None, LSE_LOG2=lse_log2, num_warps=4)


def _as_i32(x: torch.Tensor | None) -> torch.Tensor | None:
    if x is None:
        return None
    x = x.reshape(-1) if x.dim() <= 1 else x
    return x if x.dtype == torch.int32 and x.is_contiguous() else x.to(torch.int32).contiguous()


def sparse_mla_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    head_dim_v: int = kvl.HEAD_DIM,
    *,
    num_splits: int | None = None,
    block_h: int | None = None,
    block_n: int = 32,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `sparse_mla_decode_reference` (same arguments and returns).

    Keyword-only tuning knobs (defaults from the H200 sweep of scripts/bench/attention.py):
    num_splits (token-list splits merged by the combine kernel), block_h (heads per program),
    block_n (tokens per step), num_warps, num_stages (1 by default).
    """
    b, s_q, h_q, d = q.shape
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    check_v4_cache(k_cache)
    t = b * s_q
    q3 = q.reshape(t, h_q, d)
    if q3.stride(-1) != 1:
        q3 = q3.contiguous()
    pages, page_size = kvl.cache_pages(k_cache)
    idx = indices.reshape(t, indices.shape[-1])
    idx = idx if idx.dtype == torch.int32 and idx.stride(-1) == 1 else idx.to(torch.int32).contiguous()
    extra = None
    if extra_k_cache is not None:
        check_v4_cache(extra_k_cache)
        ex_pages, ex_ps = kvl.cache_pages(extra_k_cache)
        ex_idx = extra_indices.reshape(t, extra_indices.shape[-1])
        if ex_idx.dtype != torch.int32 or ex_idx.stride(-1) != 1:
            ex_idx = ex_idx.to(torch.int32).contiguous()
        extra = (ex_pages, ex_ps, ex_pages.stride(0), ex_idx, _as_i32(extra_topk_length),
                 ex_pages.shape[0] * ex_ps)
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    _launch(q3, s_q, kv=pages, kv_fp8=True, indices2=idx, lengths=_as_i32(topk_length),
            bound=pages.shape[0] * page_size, page_size=page_size, page_stride=pages.stride(0),
            row_stride=0, extra=extra, sink=None if attn_sink is None else attn_sink.float().contiguous(),
            scale=softmax_scale, d_v=head_dim_v, out=out.view(t, h_q, head_dim_v), lse=lse,
            lse_strides=(lse.stride(0), lse.stride(1), lse.stride(2)), max_out=None, lse_log2=False,
            num_splits=num_splits, block_h=block_h, block_n=block_n, num_warps=num_warps,
            # One stage by default: a step's token gather depends on its own index load, so deeper
            # pipelining only costs registers (H200 sweep of 2026-11-30, RESULTS.md: batch 1/16/64
            # 14.3/37.5/90.2 us against 16.0/41.0/91.5 with Triton's default stages).
            num_stages=1 if num_stages is None else num_stages)
    return out, lse


def sparse_mla_prefill_triton(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    *,
    lse_log2: bool = False,
    block_h: int | None = None,
    block_n: int = 32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of `sparse_mla_prefill_reference`; `lse_log2` returns base-2 statistics."""
    s_q, h_q, d = q.shape
    s_kv, h_kv, _ = kv.shape
    if h_kv != 1 or indices.shape[1] != 1:
        raise NotImplementedError("sparse prefill supports one KV head (MQA), as DeepSeek-V4 uses")
    q3 = q if q.stride(-1) == 1 else q.contiguous()
    kv2 = kv.reshape(s_kv, d)
    if kv2.stride(-1) != 1:
        kv2 = kv2.contiguous()
    idx = indices.reshape(s_q, indices.shape[-1])
    idx = idx if idx.dtype == torch.int32 and idx.stride(-1) == 1 else idx.to(torch.int32).contiguous()
    out = torch.empty(s_q, h_q, d_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    mx = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    # Prefill has many query rows: one split per row keeps it a single kernel.
    _launch(q3, 1, kv=kv2, kv_fp8=False, indices2=idx, lengths=_as_i32(topk_length), bound=s_kv,
            page_size=1, page_stride=0, row_stride=kv2.stride(0), extra=None,
            sink=None if attn_sink is None else attn_sink.float().contiguous(), scale=sm_scale, d_v=d_v,
            out=out, lse=lse, lse_strides=(lse.stride(0), lse.stride(1), 0), max_out=mx,
            lse_log2=lse_log2, num_splits=1 if s_q >= 64 else None, block_h=block_h, block_n=block_n)
    return out, mx, lse


# ----------------------------------------------------------------------------------------------
# Device dispatch
# ----------------------------------------------------------------------------------------------


def sparse_mla_decode(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode: the Triton kernel on CUDA, the torch reference elsewhere."""
    q = args[0] if args else kwargs["q"]
    fn = sparse_mla_decode_triton if use_triton(q) else sparse_mla_decode_reference
    return fn(*args, **kwargs)


def sparse_mla_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                       d_v: int = 512, attn_sink: torch.Tensor | None = None,
                       topk_length: torch.Tensor | None = None, *, lse_log2: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill: the Triton kernel on CUDA, the torch reference elsewhere (base-e or base-2 stats)."""
    if use_triton(q):
        return sparse_mla_prefill_triton(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                                         lse_log2=lse_log2)
    out, mx, lse = sparse_mla_prefill_reference(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    if lse_log2:
        # +-inf stay +-inf under the scaling.
        mx, lse = mx * LOG2E, lse * LOG2E
    return out, mx, lse


__all__ = [
    "sparse_mla_decode", "sparse_mla_decode_reference", "sparse_mla_decode_triton",
    "sparse_mla_prefill", "sparse_mla_prefill_reference", "sparse_mla_prefill_triton",
]
