"""Decode MXFP4 MoE (W4A16) without tensor cores: one GEMV per routed, GPU-resident expert.

Same inputs, layout and semantics as :func:`kernels_triton.mxfp4_moe.mxfp4_moe` (read its module
docstring); ``mxfp4_moe`` sends small batches here (``GEMV_MAX_SLOTS``). At one token the tl.dot
kernels reach ~10% of copy bandwidth (272 us for 113 MB on the H200): a BLOCK_M = 16 MMA wastes
15/16 of its rows and routes every dequantized weight through a dot-operand layout. Here, as in
fp8_gemm's `_fp8_gemv_kernel`, each program owns BLOCK_N weight rows of one expert, loops over K,
multiplies on CUDA cores in fp32 and reduces with tl.sum.

Grid and routing (both stages): (N tiles, T * top_k pairs), sized from T * top_k only (no host
sync, CUDA-graph capturable). Program (n, p) reads the whole topk_ids block (at most
GEMV_MAX_SLOTS ids) and the expert e of pair p. Ids outside [0, E) (-1: not resident on the GPU,
or masked) exit at once (the down stage writes that pair's zero output first, so the top-k sum
needs no mask). Among the pairs routed to e, the first of each ROWS consecutive ones (in pair
order) leads: it serves them all, so e's weights are read from memory once for up to ROWS tokens,
and every other program of e exits at once. ROWS = min(T, GEMV_MAX_ROWS): with distinct experts
per token a leader serves every token of its expert. Row 0 is always computed; each further row
is behind a runtime branch, so an expert routed by one token costs one row's arithmetic even when
ROWS = 8 (at batch 8 over 384 experts most experts have one token).

Dequantization, two codes per integer op: the weight is read as int32 words (8 codes, columns
8w .. 8w+7, nibble j = column 8w + j). Nibbles j and j + 4 lie 16 bits apart, so one shift and
mask of the word moves both codes' magnitude bits to bits 9..11 of each 16-bit half and one more
their sign bits to bit 15: each half is then the fp16 number value * 2^-14 (the bit trick of
mxfp4_moe._e2m1_half, subnormal 0.5 included), converted to fp32 exactly. Per 8 codes: 7 shifts,
8 masks and 4 ors instead of ~5 integer ops per code. The per-word products with x (each word's 8
activations read as one 16-byte load of int32 bf16 pairs and split in registers, reused by every
tile row a thread holds) are summed over the word,
the 4 words of a 32-column scale group summed in-thread, and only then scaled by the group's
E8M0 scale (two power-of-two fp32 factors from mxfp4_moe._scale_pair, whose product is
2^14 * scale): 1 multiply per 32 products instead of one per weight.

Range: x * value * 2^-14 is a normal fp32 number for |x| >= 2^-111 and sums stay finite for
every bf16 x; the scale is applied to partial sums, so only the final products carry its
magnitude. Activations below 2^-111 (never seen in a real model; products then become fp32
subnormals, which the GPU keeps but at lower precision) are outside what this path promises: the
tl.dot path (an explicit MoeConfig) scales each weight before its product.

Numerics otherwise match the tl.dot kernels: fp32 accumulation of exact products, SwiGLU clamp
(gate <= limit, |up| <= limit), act = bf16(silu(g) * u) rounded once, y = bf16(router weight *
(act @ W2^T)), the top-k sum in fp32 in slot order (moe_sum.py, deterministic) times
routed_scaling_factor, rounded once. Under TRITON_INTERPRET=1 EMULATE_BF16 rounds fp32 -> bf16 by
hand (nearest even; the interpreter truncates); no tl.dot is involved, so nothing else differs.
No Hopper-only instruction (plain loads, integer and fp32 arithmetic): compiles for sm_90 and
sm_120.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels_triton.fp8_gemm import _round_bf16
from kernels_triton.mxfp4_moe import _scale_pair, _swiglu, sum_topk

# mxfp4_moe() takes this path when T * top_k <= GEMV_MAX_SLOTS (8 tokens at top-6). Measured on the
# H200 at V4.1 shapes (scripts/bench/RESULTS.md, "MXFP4 MoE decode GEMV", 2026-12-01), in a CUDA graph
# with DEFAULT_GEMV_CONFIG against the tl.dot kernels: T = 1 106.6 vs 270.7 us, T = 2 224.9 vs 439.4,
# T = 5 544.6 vs 730.4, T = 8 964.6 vs 1051.4, T = 64 6384 vs 5005: the GEMV wins up to 8 tokens.
# Reading x as int32 pairs then took T = 1 / 2 / 5 / 8 from 106.5 / 221.1 / 548.1 / 979.1 us to
# 97.7 / 216.1 / 538.8 / 950.5 us on an H100 (same run, bits identical; RESULTS.md 2026-12-07).
GEMV_MAX_SLOTS = 48
# Rows (tokens) one leader serves; more tokens on one expert take several leaders (weights re-read).
GEMV_MAX_ROWS = 8


@dataclass(frozen=True)
class GemvMoeConfig:
    """Tiles of the two GEMV stages (block_k counts input columns: a multiple of 32, a power of two).

    With 4-word (16-byte) vector loads a warp covers 1024 columns of one row, so block_k =
    1024 * warps puts every warp along K and each thread holds all block_n rows of its columns (x is
    then loaded once per thread and reused by block_n rows, fp8_gemm's "x as one row"); smaller
    block_k spreads rows over threads.
    """

    gu_block_n: int = 4
    gu_block_k: int = 1024
    gu_warps: int = 1
    dn_block_n: int = 4
    dn_block_k: int = 1024
    dn_warps: int = 1
    max_rows: int = GEMV_MAX_ROWS


# The fastest of the 12 tiles `scripts/bench/mxfp4_moe.py --gemv-sweep` timed on the H200 at every
# T in 1, 2, 5, 8 (2026-12-01; the former 4 x 1024 one-warp default took 159-1694 us where this
# takes 107-965): 8 rows x 512 columns on two warps for gate/up, 8 x 256 on one warp for down.
DEFAULT_GEMV_CONFIG = GemvMoeConfig(gu_block_n=8, gu_block_k=512, gu_warps=2, dn_block_n=8, dn_block_k=256, dn_warps=1)


# ------------------------------------------------------------------------------------------ jit helpers
@triton.jit
def _half_lo(h):
    """Low 16 bits of each int32 as fp16 -> fp32 (exact)."""
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_hi(h):
    """High 16 bits of each int32 as fp16 -> fp32 (exact)."""
    return (h >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _bf16_lo(p):
    """Low bf16 of each int32 (a pair of activations) as fp32 (exact)."""
    return (p << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(p):
    """High bf16 of each int32 as fp32 (exact)."""
    return (p & -0x10000).to(tl.float32, bitcast=True)


@triton.jit
def _word_dot(w, xb, kmask):
    """sum_j code_j(w) * 2^-14 * x[8 w + j] per int32 word of `w` [BLOCK_N, G, 4] (fp32).

    xb [1, G, 4]: each word's 8 activations as 4 int32 bf16 pairs (x viewed as int32), read by one
    16-byte load per word and split in registers: 8 two-byte loads per word (strided 16 bytes across
    a warp) kept the L1 at 89% of its throughput (Nsight Compute, H100, gate/up at T = 1) while DRAM
    ran at 27%.
    Shift + mask pairs: nibble q's magnitude (bits 4q..4q+2) to bits 9..11 and its sign (bit 4q+3)
    to bit 15; nibble q + 4 lands 16 bits higher, in the high half."""
    M: tl.constexpr = 0x0E000E00
    S: tl.constexpr = -0x7FFF8000  # 0x80008000 as an int32
    pairs = tl.load(xb[:, :, :, None] + tl.arange(0, 4)[None, None, None, :], mask=kmask[:, :, :, None], other=0)
    p02, p13 = tl.split(tl.reshape(pairs, (pairs.shape[0], pairs.shape[1], pairs.shape[2], 2, 2)))
    p0, p2 = tl.split(p02)  # pair q holds columns 2q (low half) and 2q + 1
    p1, p3 = tl.split(p13)
    # One multiply-add chain (written so: fp adds are not reassociated, a*b + c*d costs an extra add).
    h = ((w << 9) & M) | ((w << 12) & S)
    part = _half_lo(h) * _bf16_lo(p0)
    part = part + _half_hi(h) * _bf16_lo(p2)
    h = ((w << 5) & M) | ((w << 8) & S)
    part = part + _half_lo(h) * _bf16_hi(p0)
    part = part + _half_hi(h) * _bf16_hi(p2)
    h = ((w << 1) & M) | ((w << 4) & S)
    part = part + _half_lo(h) * _bf16_lo(p1)
    part = part + _half_hi(h) * _bf16_lo(p3)
    h = ((w >> 3) & M) | (w & S)
    part = part + _half_lo(h) * _bf16_hi(p1)
    part = part + _half_hi(h) * _bf16_hi(p3)
    return part


@triton.jit
def _group_mac(acc, w, xb, kmask, s_hi, s_lo, BLOCK_N: tl.constexpr, G: tl.constexpr):
    """acc [BLOCK_N, G, 4] += _word_dot * 2^14 * scale (fp32), the group's scale broadcast over its 4 words.

    One accumulator per word, reduced once after the K loop: the x columns of a word are 8 elements
    apart, so x (and, through the contiguity hint at the weight loads, the weight) is laid out one word
    per thread, 4 threads per group; a per-step group sum would be cross-thread shuffles, and a weight
    layout of 4 words per thread made Triton move the decoded codes through shared memory (sm_90 SASS).
    """
    return acc + (_word_dot(w, xb, kmask) * s_hi[:, :, None]) * s_lo[:, :, None]


@triton.jit
def _route(ids_ptr, p, num_pairs, topk, E, s_it, s_ik, ROWS: tl.constexpr, PAIRS_P2: tl.constexpr):
    """(expert, whether pair p runs, rank of p among e's pairs, rows it serves, pair ids, their ranks)."""
    offs = tl.arange(0, PAIRS_P2)
    in_range = offs < num_pairs
    ids_all = tl.load(ids_ptr + (offs // topk) * s_it + (offs % topk) * s_ik, mask=in_range, other=-1).to(tl.int32)
    e = tl.load(ids_ptr + (p // topk) * s_it + (p % topk) * s_ik).to(tl.int32)
    valid = (e >= 0) & (e < E)
    match = (ids_all == e) & in_range
    rank = tl.sum(tl.where(match & (offs < p), 1, 0), axis=0)
    n_rows = tl.minimum(tl.sum(tl.where(match, 1, 0), axis=0) - rank, ROWS)
    ranks = tl.cumsum(tl.where(match, 1, 0), axis=0) - 1
    return e, valid, (rank % ROWS) == 0, rank, n_rows, match, ranks, offs


@triton.jit
def _pair_at(match, ranks, offs, target):
    """The pair whose rank among the expert's pairs is `target` (0 when there is none)."""
    return tl.sum(tl.where(match & (ranks == target), offs, 0), axis=0)


@triton.jit
def _gu_row(accg, accu, wg, wu, xb, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N: tl.constexpr, G: tl.constexpr):
    accg = _group_mac(accg, wg, xb, kmask, sg_hi, sg_lo, BLOCK_N, G)
    accu = _group_mac(accu, wu, xb, kmask, su_hi, su_lo, BLOCK_N, G)
    return accg, accu


@triton.jit
def _gu_store(accg, accu, act_row, offs_n, n_mask, limit, CLAMP: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """act = bf16(silu(min(g, limit)) * clamp(u, -limit, limit)) for one row, rounded once."""
    g = tl.sum(tl.sum(accg, axis=2), axis=1)
    u = tl.sum(tl.sum(accu, axis=2), axis=1)
    a = _swiglu(g, u, limit, CLAMP, EMULATE_BF16)
    tl.store(act_row + offs_n, a.to(act_row.dtype.element_ty), mask=n_mask)


@triton.jit
def _dn_store(acc, y_row, tw, offs_n, n_mask, EMULATE_BF16: tl.constexpr):
    """y = bf16(router weight * (act @ W2^T)) for one row, rounded once."""
    y = tl.sum(tl.sum(acc, axis=2), axis=1) * tw
    if EMULATE_BF16:
        y = _round_bf16(y)
    tl.store(y_row + offs_n, y.to(y_row.dtype.element_ty), mask=n_mask)


# ------------------------------------------------------------------------------------------ kernels
@triton.jit
def _mxfp4_gemv_gate_up_kernel(
        x_ptr, w_ptr, s_ptr, act_ptr, ids_ptr,
        num_pairs, topk, E, H, INTER, limit,
        s_xt, s_it, s_ik, s_we, s_wn, s_se, s_sn, s_at,
        CLAMP: tl.constexpr, SCALE_F32: tl.constexpr, EMULATE_BF16: tl.constexpr, ROWS: tl.constexpr,
        PAIRS_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """act[pair, n] for the BLOCK_N gate rows n (and up rows I + n) of one expert, for each pair it leads.

    x_ptr: hidden as int32 bf16 pairs [T, H/2] (s_xt in pairs); w_ptr: w13 as int32 words [E, 2I, H/8]
    (s_we, s_wn in words); s_ptr: scales [E, 2I, H/32]."""
    pid_n = tl.program_id(0)
    p = tl.program_id(1)
    e, valid, lead, rank, n_rows, match, ranks, offs = _route(ids_ptr, p, num_pairs, topk, E, s_it, s_ik, ROWS,
                                                               PAIRS_P2)
    if not valid:
        return
    if not lead:
        return  # a leader of this expert serves this pair
    KW: tl.constexpr = BLOCK_K // 8
    G: tl.constexpr = BLOCK_K // 32
    e64 = e.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < INTER
    rows64 = offs_n.to(tl.int64)
    wg_rows = w_ptr + e64 * s_we + rows64[:, None] * s_wn
    wu_rows = wg_rows + INTER * s_wn
    sg_rows = s_ptr + e64 * s_se + rows64[:, None] * s_sn
    su_rows = sg_rows + INTER * s_sn
    # The pairs served (rank .. rank + n_rows - 1 among e's pairs) and their activation rows.
    p0 = _pair_at(match, ranks, offs, rank)
    p1 = _pair_at(match, ranks, offs, rank + 1)
    p2 = _pair_at(match, ranks, offs, rank + 2)
    p3 = _pair_at(match, ranks, offs, rank + 3)
    p4 = _pair_at(match, ranks, offs, rank + 4)
    p5 = _pair_at(match, ranks, offs, rank + 5)
    p6 = _pair_at(match, ranks, offs, rank + 6)
    p7 = _pair_at(match, ranks, offs, rank + 7)
    x0 = x_ptr + (p0 // topk).to(tl.int64) * s_xt
    x1 = x_ptr + (p1 // topk).to(tl.int64) * s_xt
    x2 = x_ptr + (p2 // topk).to(tl.int64) * s_xt
    x3 = x_ptr + (p3 // topk).to(tl.int64) * s_xt
    x4 = x_ptr + (p4 // topk).to(tl.int64) * s_xt
    x5 = x_ptr + (p5 // topk).to(tl.int64) * s_xt
    x6 = x_ptr + (p6 // topk).to(tl.int64) * s_xt
    x7 = x_ptr + (p7 // topk).to(tl.int64) * s_xt
    g0 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u0 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g1 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u1 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g2 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u2 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g3 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u3 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g4 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u4 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g5 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u5 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g6 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u6 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    g7 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    u7 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    # Word index k0 + 4 g + j of a [1, G, 4] tile: group g, word j of the group.
    offs_w = (tl.arange(0, G)[:, None] * 4 + tl.arange(0, 4)[None, :])[None, :, :]
    offs_g = tl.arange(0, G)
    kw_total = H // 8
    for k0 in range(0, kw_total, KW):
        kw = tl.max_contiguous(k0 + offs_w, [1, 1, 1])  # one word per thread, as x (see _group_mac)
        kmask = kw < kw_total
        wm = n_mask[:, None, None] & kmask
        wg = tl.load(wg_rows[:, :, None] + kw, mask=wm, other=0)
        wu = tl.load(wu_rows[:, :, None] + kw, mask=wm, other=0)
        gi = k0 // 4 + offs_g
        sm = n_mask[:, None] & (gi < kw_total // 4)[None, :]
        sg_hi, sg_lo = _scale_pair(tl.load(sg_rows + gi[None, :], mask=sm, other=0), SCALE_F32)
        su_hi, su_lo = _scale_pair(tl.load(su_rows + gi[None, :], mask=sm, other=0), SCALE_F32)
        xo = 4 * kw  # x as int32 pairs
        g0, u0 = _gu_row(g0, u0, wg, wu, x0 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 1:
            if n_rows > 1:
                g1, u1 = _gu_row(g1, u1, wg, wu, x1 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 2:
            if n_rows > 2:
                g2, u2 = _gu_row(g2, u2, wg, wu, x2 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 3:
            if n_rows > 3:
                g3, u3 = _gu_row(g3, u3, wg, wu, x3 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 4:
            if n_rows > 4:
                g4, u4 = _gu_row(g4, u4, wg, wu, x4 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 5:
            if n_rows > 5:
                g5, u5 = _gu_row(g5, u5, wg, wu, x5 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 6:
            if n_rows > 6:
                g6, u6 = _gu_row(g6, u6, wg, wu, x6 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
        if ROWS > 7:
            if n_rows > 7:
                g7, u7 = _gu_row(g7, u7, wg, wu, x7 + xo, kmask, sg_hi, sg_lo, su_hi, su_lo, BLOCK_N, G)
    _gu_store(g0, u0, act_ptr + p0.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 1:
        if n_rows > 1:
            _gu_store(g1, u1, act_ptr + p1.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 2:
        if n_rows > 2:
            _gu_store(g2, u2, act_ptr + p2.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 3:
        if n_rows > 3:
            _gu_store(g3, u3, act_ptr + p3.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 4:
        if n_rows > 4:
            _gu_store(g4, u4, act_ptr + p4.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 5:
        if n_rows > 5:
            _gu_store(g5, u5, act_ptr + p5.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 6:
        if n_rows > 6:
            _gu_store(g6, u6, act_ptr + p6.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)
    if ROWS > 7:
        if n_rows > 7:
            _gu_store(g7, u7, act_ptr + p7.to(tl.int64) * s_at, offs_n, n_mask, limit, CLAMP, EMULATE_BF16)


@triton.jit
def _mxfp4_gemv_down_kernel(
        act_ptr, w_ptr, s_ptr, y_ptr, tw_ptr, ids_ptr,
        num_pairs, topk, E, H, INTER,
        s_at, s_it, s_ik, s_we, s_wn, s_se, s_sn, s_yt,
        SCALE_F32: tl.constexpr, EMULATE_BF16: tl.constexpr, ROWS: tl.constexpr,
        PAIRS_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[pair, n] = bf16(topk_weight[pair] * act[pair] @ W2[e, n]^T) for the pairs it leads; zeros for a
    pair whose id is outside [0, E).

    act_ptr: act as int32 bf16 pairs [pairs, I/2] (s_at in pairs); w_ptr: w2 as int32 words [E, H, I/8]
    (s_we, s_wn in words); s_ptr: scales [E, H, I/32]."""
    pid_n = tl.program_id(0)
    p = tl.program_id(1)
    e, valid, lead, rank, n_rows, match, ranks, offs = _route(ids_ptr, p, num_pairs, topk, E, s_it, s_ik, ROWS,
                                                               PAIRS_P2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    if not valid:
        # No expert: this pair adds nothing to the top-k sum.
        tl.store(y_ptr + p.to(tl.int64) * s_yt + offs_n, tl.zeros((BLOCK_N,), dtype=y_ptr.dtype.element_ty),
                 mask=n_mask)
        return
    if not lead:
        return
    KW: tl.constexpr = BLOCK_K // 8
    G: tl.constexpr = BLOCK_K // 32
    e64 = e.to(tl.int64)
    rows64 = offs_n.to(tl.int64)
    w_rows = w_ptr + e64 * s_we + rows64[:, None] * s_wn
    s_rows = s_ptr + e64 * s_se + rows64[:, None] * s_sn
    p0 = _pair_at(match, ranks, offs, rank)
    p1 = _pair_at(match, ranks, offs, rank + 1)
    p2 = _pair_at(match, ranks, offs, rank + 2)
    p3 = _pair_at(match, ranks, offs, rank + 3)
    p4 = _pair_at(match, ranks, offs, rank + 4)
    p5 = _pair_at(match, ranks, offs, rank + 5)
    p6 = _pair_at(match, ranks, offs, rank + 6)
    p7 = _pair_at(match, ranks, offs, rank + 7)
    a0 = act_ptr + p0.to(tl.int64) * s_at
    a1 = act_ptr + p1.to(tl.int64) * s_at
    a2 = act_ptr + p2.to(tl.int64) * s_at
    a3 = act_ptr + p3.to(tl.int64) * s_at
    a4 = act_ptr + p4.to(tl.int64) * s_at
    a5 = act_ptr + p5.to(tl.int64) * s_at
    a6 = act_ptr + p6.to(tl.int64) * s_at
    a7 = act_ptr + p7.to(tl.int64) * s_at
    c0 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c1 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c2 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c3 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c4 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c5 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c6 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    c7 = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    offs_w = (tl.arange(0, G)[:, None] * 4 + tl.arange(0, 4)[None, :])[None, :, :]
    offs_g = tl.arange(0, G)
    kw_total = INTER // 8
    for k0 in range(0, kw_total, KW):
        kw = tl.max_contiguous(k0 + offs_w, [1, 1, 1])  # one word per thread, as x (see _group_mac)
        kmask = kw < kw_total
        w = tl.load(w_rows[:, :, None] + kw, mask=n_mask[:, None, None] & kmask, other=0)
        gi = k0 // 4 + offs_g
        s_hi, s_lo = _scale_pair(tl.load(s_rows + gi[None, :], mask=n_mask[:, None] & (gi < kw_total // 4)[None, :],
                                         other=0), SCALE_F32)
        xo = 4 * kw  # x as int32 pairs
        c0 = _group_mac(c0, w, a0 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 1:
            if n_rows > 1:
                c1 = _group_mac(c1, w, a1 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 2:
            if n_rows > 2:
                c2 = _group_mac(c2, w, a2 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 3:
            if n_rows > 3:
                c3 = _group_mac(c3, w, a3 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 4:
            if n_rows > 4:
                c4 = _group_mac(c4, w, a4 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 5:
            if n_rows > 5:
                c5 = _group_mac(c5, w, a5 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 6:
            if n_rows > 6:
                c6 = _group_mac(c6, w, a6 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
        if ROWS > 7:
            if n_rows > 7:
                c7 = _group_mac(c7, w, a7 + xo, kmask, s_hi, s_lo, BLOCK_N, G)
    _dn_store(c0, y_ptr + p0.to(tl.int64) * s_yt, tl.load(tw_ptr + p0), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 1:
        if n_rows > 1:
            _dn_store(c1, y_ptr + p1.to(tl.int64) * s_yt, tl.load(tw_ptr + p1), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 2:
        if n_rows > 2:
            _dn_store(c2, y_ptr + p2.to(tl.int64) * s_yt, tl.load(tw_ptr + p2), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 3:
        if n_rows > 3:
            _dn_store(c3, y_ptr + p3.to(tl.int64) * s_yt, tl.load(tw_ptr + p3), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 4:
        if n_rows > 4:
            _dn_store(c4, y_ptr + p4.to(tl.int64) * s_yt, tl.load(tw_ptr + p4), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 5:
        if n_rows > 5:
            _dn_store(c5, y_ptr + p5.to(tl.int64) * s_yt, tl.load(tw_ptr + p5), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 6:
        if n_rows > 6:
            _dn_store(c6, y_ptr + p6.to(tl.int64) * s_yt, tl.load(tw_ptr + p6), offs_n, n_mask, EMULATE_BF16)
    if ROWS > 7:
        if n_rows > 7:
            _dn_store(c7, y_ptr + p7.to(tl.int64) * s_yt, tl.load(tw_ptr + p7), offs_n, n_mask, EMULATE_BF16)


# ------------------------------------------------------------------------------------------ launcher
def words_view(w: torch.Tensor) -> torch.Tensor | None:
    """Packed uint8 [E, N, K/2] as int32 words [E, N, K/8] (little-endian: byte 0 = bits 0..7), or None
    when the strides or offset do not allow the view (the caller then takes the tl.dot path)."""
    try:
        return w.view(torch.int32)
    except RuntimeError:
        return None


def _check_config(cfg: GemvMoeConfig) -> None:
    for name in ("gu_block_k", "dn_block_k"):
        v = getattr(cfg, name)
        if v < 32 or v & (v - 1):
            raise ValueError(f"mxfp4_moe: GemvMoeConfig.{name} = {v} must be a power of two >= 32")
    for name in ("gu_block_n", "dn_block_n"):
        v = getattr(cfg, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"mxfp4_moe: GemvMoeConfig.{name} = {v} must be a power of two")
    if not 1 <= cfg.max_rows <= GEMV_MAX_ROWS:
        raise ValueError(f"mxfp4_moe: GemvMoeConfig.max_rows = {cfg.max_rows} must be in 1..{GEMV_MAX_ROWS}")


def mxfp4_moe_gemv(hidden: torch.Tensor, w13w: torch.Tensor, s13: torch.Tensor, w2w: torch.Tensor,
                   s2: torch.Tensor, scale_f32: bool, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   swiglu_limit: float | None, routed_scaling_factor: float, out: torch.Tensor,
                   cfg: GemvMoeConfig, emulate: bool) -> torch.Tensor:
    """Launch the two GEMV stages and the top-k sum into `out` [T, H] bf16.

    Called by mxfp4_moe after its checks: w13w / w2w are the int32 word views (`words_view`), s13 / s2
    the scales as the kernels read them (uint8 E8M0 bytes or float32), `emulate` is TRITON_INTERPRET.
    """
    _check_config(cfg)
    t, topk = topk_ids.shape
    e, two_i, _ = w13w.shape
    i = two_i // 2
    h = hidden.shape[1]
    num_pairs = t * topk
    if num_pairs > 1024:
        raise ValueError(f"mxfp4_moe: the GEMV path takes at most 1024 (token, slot) pairs, got {num_pairs}")
    dev = hidden.device
    rows = max(1, min(t, cfg.max_rows))
    pairs_p2 = triton.next_power_of_2(num_pairs)
    tw = topk_weights.to(torch.float32).reshape(-1).contiguous()
    act = torch.empty(num_pairs, i, dtype=torch.bfloat16, device=dev)
    # The kernels read activations as int32 bf16 pairs (16 bytes per weight word); a view needs an even
    # row stride and offset, which a contiguous copy gives any other layout.
    try:
        xpairs = hidden.view(torch.int32)
    except RuntimeError:
        xpairs = hidden.contiguous().view(torch.int32)
    y = torch.empty(num_pairs, h, dtype=torch.bfloat16, device=dev)
    limit = float(swiglu_limit) if swiglu_limit else 0.0
    _mxfp4_gemv_gate_up_kernel[(triton.cdiv(i, cfg.gu_block_n), num_pairs)](
        xpairs, w13w, s13, act, topk_ids, num_pairs, topk, e, h, i, limit,
        xpairs.stride(0), topk_ids.stride(0), topk_ids.stride(1), w13w.stride(0), w13w.stride(1),
        s13.stride(0), s13.stride(1), act.stride(0),
        CLAMP=bool(swiglu_limit), SCALE_F32=scale_f32, EMULATE_BF16=emulate, ROWS=rows, PAIRS_P2=pairs_p2,
        BLOCK_N=cfg.gu_block_n, BLOCK_K=min(cfg.gu_block_k, triton.next_power_of_2(h)),
        num_warps=cfg.gu_warps, num_stages=1)
    apairs = act.view(torch.int32)
    _mxfp4_gemv_down_kernel[(triton.cdiv(h, cfg.dn_block_n), num_pairs)](
        apairs, w2w, s2, y, tw, topk_ids, num_pairs, topk, e, h, i,
        apairs.stride(0), topk_ids.stride(0), topk_ids.stride(1), w2w.stride(0), w2w.stride(1),
        s2.stride(0), s2.stride(1), y.stride(0),
        SCALE_F32=scale_f32, EMULATE_BF16=emulate, ROWS=rows, PAIRS_P2=pairs_p2,
        BLOCK_N=cfg.dn_block_n, BLOCK_K=min(cfg.dn_block_k, triton.next_power_of_2(i)),
        num_warps=cfg.dn_warps, num_stages=1)
    sum_topk(y.view(t, topk, h), out, routed_scaling_factor, emulate)
    return out
