"""MoE routing: softmax / sigmoid / sqrtsoftplus scores, optional correction bias and expert groups,
top-k selection, renormalization and routed scaling (sgl_kernel topk_softmax, topk_sigmoid,
moe_fused_gate, biased_topk).

Selection uses score + bias; the returned weight is the unbiased score (DeepSeek noaux_tc). The
Triton kernel handles BLOCK_T tokens per program with their whole expert rows in registers, laid out
as NCHUNK chunks of C experts (C a power of two; 384 experts = 3 x 128, no padding). Every choice
value becomes a packed int64 key (the order-preserving integer image of the fp32 value in the high
word, the reversed expert index in the low word), so keys are unique, a larger key is a better
expert and, among equal values, the lowest index wins: exact. The NCHUNK keys of each column are
sorted once; each of the k rounds then reduces only the C column tops (one max-reduction yields the
best value and its expert) and pops the winner's column. The weights are recomputed from the k
gathered logits instead of being extracted from the row (no extra reductions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
RENORM_EPS = 1e-20  # SGLang's _RENORMALIZE_SUM_EPSILON


@triton.jit
def _softcap(x, softcap):
    # softcap * tanh(x / softcap), tanh from exp(-2|y|) (stable for large |y|).
    y = x / softcap
    ey = tl.exp(-2.0 * tl.abs(y))
    t = (1.0 - ey) / (1.0 + ey)
    return tl.where(y >= 0, t, -t) * softcap


@triton.jit
def _elementwise_score(x, SCORE: tl.constexpr):
    # SCORE 1: sigmoid, 2: sqrt(softplus(x)) (softplus = x above 20, as torch's threshold).
    if SCORE == 1:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        s = tl.sqrt(tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))))
    return s


_NEG_KEY = tl.constexpr(-9223372036854775807 - 1)  # int64 min: a popped or absent key


@triton.jit
def _load_x(row_ptr, rmask, e, n_experts, softcap, PAD: tl.constexpr):
    # One chunk of logits [BLOCK_T, C] in fp32 (softcapped); padded experts read as 0 (masked later).
    if PAD:
        m = rmask[:, None] & (e < n_experts)[None, :]
    else:
        m = rmask[:, None] & (e >= 0)[None, :]
    x = tl.load(row_ptr + e[None, :], mask=m, other=0.0).to(tl.float32)
    if softcap > 0:
        x = _softcap(x, softcap)
    return x


@triton.jit
def _choice(x, row_max, inv_sum, bias_ptr, e, n_experts, SCORE: tl.constexpr, HAS_BIAS: tl.constexpr,
            PAD: tl.constexpr):
    # Selection value of one chunk: score (+ bias); padded experts get -inf.
    if SCORE == 0:
        s = tl.exp(x - row_max[:, None]) * inv_sum[:, None]
    else:
        s = _elementwise_score(x, SCORE)
    if HAS_BIAS:
        if PAD:
            s = s + tl.load(bias_ptr + e, mask=e < n_experts, other=0.0).to(tl.float32)[None, :]
        else:
            s = s + tl.load(bias_ptr + e).to(tl.float32)[None, :]
    if PAD:
        s = tl.where((e < n_experts)[None, :], s, float("-inf"))
    return s


@triton.jit
def _masked_max(c, inside, m):
    return tl.maximum(m, tl.max(tl.where(inside, c, float("-inf")), axis=1))


@triton.jit
def _masked_argmin(c, inside, m, e, a, NPAD: tl.constexpr):
    # Lowest expert id in `inside` whose value equals m (running minimum a).
    return tl.minimum(a, tl.min(tl.where(inside & (c == m[:, None]), e[None, :], NPAD), axis=1))


@triton.jit
def _pack(choice, e, NPAD: tl.constexpr):
    # Packed int64 key: the fp32 bits made order-preserving as int32 (negative floats: flip the
    # magnitude bits) in the high word; NPAD-1-e in the low word, so that among equal values the
    # lowest expert id has the largest key. Keys are unique, so max/min never tie.
    bits = choice.to(tl.int32, bitcast=True)
    key32 = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (key32.to(tl.int64) << 32) | (NPAD - 1 - e)[None, :].to(tl.int64)


@triton.jit
def _routing_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, n_tok, n_experts, logits_stride, out_stride, topk,
                    softcap, scale, n_groups, topk_group,
                    SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                    GROUPED: tl.constexpr, C: tl.constexpr, NCHUNK: tl.constexpr, PAD: tl.constexpr,
                    KBLOCK: tl.constexpr, BLOCK_T: tl.constexpr, GBLOCK: tl.constexpr):
    # Expert e = i * C + col lives in chunk i (NCHUNK of them, C a power of two), so 384 experts are
    # 3 x 128 with no padding. Each column's NCHUNK keys are sorted once (top >= mid >= low); a
    # round then reduces only the C column tops and pops the winner's column (mid moves up).
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < n_tok
    col = tl.arange(0, C)
    e0 = col
    e1 = col + C
    e2 = col + 2 * C
    row_ptr = logits_ptr + rows[:, None] * logits_stride
    x0 = _load_x(row_ptr, rmask, e0, n_experts, softcap, PAD)
    if NCHUNK > 1:
        x1 = _load_x(row_ptr, rmask, e1, n_experts, softcap, PAD)
    if NCHUNK > 2:
        x2 = _load_x(row_ptr, rmask, e2, n_experts, softcap, PAD)
    row_max = tl.zeros([BLOCK_T], dtype=tl.float32)
    inv_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
    if SCORE == 0:
        # Softmax statistics over the valid experts of all chunks.
        if PAD:
            x0m = tl.where((e0 < n_experts)[None, :], x0, float("-inf"))
        else:
            x0m = x0
        row_max = tl.max(x0m, axis=1)
        if NCHUNK > 1:
            if PAD:
                x1m = tl.where((e1 < n_experts)[None, :], x1, float("-inf"))
            else:
                x1m = x1
            row_max = tl.maximum(row_max, tl.max(x1m, axis=1))
        if NCHUNK > 2:
            if PAD:
                x2m = tl.where((e2 < n_experts)[None, :], x2, float("-inf"))
            else:
                x2m = x2
            row_max = tl.maximum(row_max, tl.max(x2m, axis=1))
        total = tl.sum(tl.exp(x0m - row_max[:, None]), axis=1)
        if NCHUNK > 1:
            total += tl.sum(tl.exp(x1m - row_max[:, None]), axis=1)
        if NCHUNK > 2:
            total += tl.sum(tl.exp(x2m - row_max[:, None]), axis=1)
        inv_sum = 1.0 / total
    c0 = _choice(x0, row_max, inv_sum, bias_ptr, e0, n_experts, SCORE, HAS_BIAS, PAD)
    if NCHUNK > 1:
        c1 = _choice(x1, row_max, inv_sum, bias_ptr, e1, n_experts, SCORE, HAS_BIAS, PAD)
    if NCHUNK > 2:
        c2 = _choice(x2, row_max, inv_sum, bias_ptr, e2, n_experts, SCORE, HAS_BIAS, PAD)
    if GROUPED:
        # Group score = sum of the group's top-2 choice values; keep the best topk_group groups
        # (ties: lowest group index). Experts of a group are contiguous (per of them).
        per = n_experts // n_groups
        g0 = (e0 // per)[None, :]
        g1 = (e1 // per)[None, :]
        g2 = (e2 // per)[None, :]
        gi_idx = tl.arange(0, GBLOCK)
        gscore = tl.full([BLOCK_T, GBLOCK], float("-inf"), tl.float32)
        for gi in range(n_groups):
            m1 = _masked_max(c0, g0 == gi, tl.full([BLOCK_T], float("-inf"), tl.float32))
            if NCHUNK > 1:
                m1 = _masked_max(c1, g1 == gi, m1)
            if NCHUNK > 2:
                m1 = _masked_max(c2, g2 == gi, m1)
            a1 = _masked_argmin(c0, g0 == gi, m1, e0, tl.full([BLOCK_T], NCHUNK * C, tl.int32),
                                NCHUNK * C)
            if NCHUNK > 1:
                a1 = _masked_argmin(c1, g1 == gi, m1, e1, a1, NCHUNK * C)
            if NCHUNK > 2:
                a1 = _masked_argmin(c2, g2 == gi, m1, e2, a1, NCHUNK * C)
            m2 = _masked_max(c0, (g0 == gi) & (e0[None, :] != a1[:, None]), tl.full([BLOCK_T], float("-inf"),
                                                                                    tl.float32))
            if NCHUNK > 1:
                m2 = _masked_max(c1, (g1 == gi) & (e1[None, :] != a1[:, None]), m2)
            if NCHUNK > 2:
                m2 = _masked_max(c2, (g2 == gi) & (e2[None, :] != a1[:, None]), m2)
            gscore = tl.where(gi_idx[None, :] == gi, (m1 + m2)[:, None], gscore)
        gvalid = (gi_idx < n_groups)[None, :]
        gkeep = tl.zeros([BLOCK_T, GBLOCK], dtype=tl.int1)
        for _ in range(topk_group):
            cand = tl.where(gvalid & (~gkeep), gscore, float("-inf"))
            gm = tl.max(cand, axis=1)
            ga = tl.min(tl.where((cand == gm[:, None]) & gvalid & (~gkeep), gi_idx[None, :], GBLOCK), axis=1)
            gkeep = gkeep | (gi_idx[None, :] == ga[:, None])
        # A group's experts keep their value if the group is kept (-inf otherwise).
        for gi in range(n_groups):
            dropped = (tl.max(tl.where((gi_idx[None, :] == gi) & gkeep, 1, 0), axis=1) == 0)[:, None]
            c0 = tl.where((g0 == gi) & dropped, float("-inf"), c0)
            if NCHUNK > 1:
                c1 = tl.where((g1 == gi) & dropped, float("-inf"), c1)
            if NCHUNK > 2:
                c2 = tl.where((g2 == gi) & dropped, float("-inf"), c2)
    # Keys, then each column sorted (top >= mid >= low): NCHUNK - 1 to 3 compare-exchanges.
    top = _pack(c0, e0, NCHUNK * C)
    if NCHUNK == 2:
        k1 = _pack(c1, e1, NCHUNK * C)
        mid = tl.minimum(top, k1)
        top = tl.maximum(top, k1)
    if NCHUNK == 3:
        k1 = _pack(c1, e1, NCHUNK * C)
        k2 = _pack(c2, e2, NCHUNK * C)
        hi = tl.maximum(top, k1)
        lo = tl.minimum(top, k1)
        top = tl.maximum(hi, k2)
        t = tl.minimum(hi, k2)
        mid = tl.maximum(lo, t)
        low = tl.minimum(lo, t)
    k_idx = tl.arange(0, KBLOCK)
    out_i = tl.zeros([BLOCK_T, KBLOCK], dtype=tl.int32)
    for j in range(topk):
        best = tl.max(top, axis=1)
        a = (NCHUNK * C - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        out_i = tl.where(k_idx[None, :] == j, a[:, None], out_i)
        # Pop the winner's column: the next key of that column moves up.
        popped = col[None, :] == (a % C)[:, None]
        if NCHUNK == 1:
            top = tl.where(popped, _NEG_KEY, top)
        if NCHUNK == 2:
            top = tl.where(popped, mid, top)
            mid = tl.where(popped, _NEG_KEY, mid)
        if NCHUNK == 3:
            top = tl.where(popped, mid, top)
            mid = tl.where(popped, low, mid)
            low = tl.where(popped, _NEG_KEY, low)
    kmask = (k_idx < topk)[None, :] & rmask[:, None]
    # Weights: the unbiased score of each chosen expert, recomputed from its gathered logit.
    xg = tl.load(row_ptr + out_i, mask=kmask, other=0.0).to(tl.float32)
    if softcap > 0:
        xg = _softcap(xg, softcap)
    if SCORE == 0:
        out_w = tl.exp(xg - row_max[:, None]) * inv_sum[:, None]
    else:
        out_w = _elementwise_score(xg, SCORE)
    out_w = tl.where(kmask, out_w, 0.0)
    if RENORM:
        out_w = out_w / (tl.sum(out_w, axis=1) + 1e-20)[:, None]
    out_w = out_w * scale
    o_off = rows[:, None] * out_stride + k_idx[None, :]
    tl.store(w_ptr + o_off, out_w.to(w_ptr.dtype.element_ty), mask=kmask)
    tl.store(ids_ptr + o_off, out_i.to(ids_ptr.dtype.element_ty), mask=kmask)


def routing_layout(n_exp: int, nchunk: int | None = None) -> tuple[int, int]:
    """(C, NCHUNK): experts as NCHUNK (1-3) chunks of C (a power of two) with the least padding
    (384 -> 3 x 128, 256 -> 1 x 256, 96 -> 3 x 32); nchunk forces the chunk count (tests)."""
    options = [nchunk] if nchunk else [1, 2, 3]
    return min(((triton.next_power_of_2(triton.cdiv(n_exp, d)), d) for d in options),
               key=lambda cd: (cd[0] * cd[1], cd[1]))


def routing_block_t(n_tok: int, n_exp: int) -> int:
    """Default tokens per program (2 warps, from the H200 sweep of scripts/bench/ops.py --sweep): ~2048
    scores per program, fewer when the batch is small."""
    per = max(1, 2048 // triton.next_power_of_2(n_exp))
    return min(per, triton.next_power_of_2(max(n_tok, 1)))


def routing_triton(gating: torch.Tensor, bias: torch.Tensor | None, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, topk: int, score: str, renormalize: bool, scale: float = 1.0,
                   softcap: float = 0.0, n_groups: int = 0, topk_group: int = 0,
                   config: tuple[int, int] | tuple[int, int, int] | None = None) -> None:
    """Fill topk_weights / topk_ids ([T, >=topk], rows contiguous) for every token.

    config = (BLOCK_T tokens per program, num_warps[, NCHUNK]) overrides the default (benchmarks, tests)."""
    n_tok, n_exp = gating.shape
    if n_tok == 0:
        return
    if gating.stride(1) != 1 or topk_weights.stride(0) != topk_ids.stride(0):
        raise ValueError("routing_triton: gating needs unit stride over experts and topk_weights/topk_ids "
                         "the same row stride")
    if n_groups > 1 and n_exp % n_groups:
        raise ValueError(f"routing_triton: {n_exp} experts do not split into {n_groups} groups")
    if not 0 < topk <= n_exp:
        raise ValueError(f"routing_triton: topk={topk} must be in 1..{n_exp} (the number of experts)")
    cfg = config or (routing_block_t(n_tok, n_exp), 2)
    block_t, warps = cfg[0], cfg[1]
    c, nchunk = routing_layout(n_exp, cfg[2] if len(cfg) > 2 else None)
    _routing_kernel[(triton.cdiv(n_tok, block_t),)](
        gating, bias if bias is not None else gating, topk_weights, topk_ids, n_tok, n_exp, gating.stride(0),
        topk_weights.stride(0), topk, float(softcap), float(scale), max(n_groups, 1), topk_group,
        SCORE=SCORES.index(score), HAS_BIAS=bias is not None, RENORM=bool(renormalize), GROUPED=n_groups > 1,
        C=c, NCHUNK=nchunk, PAD=c * nchunk != n_exp, KBLOCK=triton.next_power_of_2(max(topk, 1)),
        BLOCK_T=block_t, GBLOCK=triton.next_power_of_2(max(n_groups, 1)), num_warps=warps)


def scores_ref(gating: torch.Tensor, score: str, softcap: float = 0.0) -> torch.Tensor:
    """fp32 routing scores."""
    x = gating.float()
    if softcap > 0:
        x = torch.tanh(x / softcap) * softcap
    if score == "softmax":
        return torch.softmax(x, dim=-1)
    if score == "sigmoid":
        return torch.sigmoid(x)
    return F.softplus(x).sqrt()


def routing_ref(gating: torch.Tensor, bias: torch.Tensor | None, topk: int, score: str, renormalize: bool,
                scale: float = 1.0, softcap: float = 0.0, n_groups: int = 0,
                topk_group: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """torch reference: (weights fp32 [T, topk], ids int32 [T, topk])."""
    s = scores_ref(gating, score, softcap)
    choice = s + bias.float() if bias is not None else s.clone()
    if n_groups > 1:
        t, n = choice.shape
        gs = choice.view(t, n_groups, -1).topk(2, dim=-1).values.sum(-1)
        gidx = gs.topk(topk_group, dim=-1).indices
        gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
        choice = choice.masked_fill(~gmask.repeat_interleave(n // n_groups, dim=1), float("-inf"))
    ids = choice.topk(topk, dim=-1).indices
    w = s.gather(1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + RENORM_EPS)
    return w * scale, ids.to(torch.int32)
