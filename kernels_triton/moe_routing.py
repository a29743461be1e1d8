"""MoE routing: softmax / sigmoid / sqrtsoftplus scores, optional correction bias and expert groups,
top-k selection, renormalization and routed scaling (sgl_kernel topk_softmax, topk_sigmoid,
moe_fused_gate, biased_topk).

Selection uses score + bias; the returned weight is the unbiased score (DeepSeek noaux_tc). The
Triton kernel handles BLOCK_T tokens per program with their whole expert rows in registers (384
experts pad to 512). Top-k is k rounds of one max-reduction each over a packed int64 key (the
order-preserving integer image of the fp32 choice value in the high word, the reversed expert
index in the low word), so one reduction yields the best value and, among ties, the lowest index:
exact, and cheap for k <= 8. The weights are then recomputed from the k gathered logits instead of
being extracted from the row (no extra reductions).
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


@triton.jit
def _routing_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, n_tok, n_experts, logits_stride, out_stride, topk,
                    softcap, scale, n_groups, topk_group,
                    SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                    GROUPED: tl.constexpr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr,
                    BLOCK_T: tl.constexpr, GBLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < n_tok
    e = tl.arange(0, BLOCK)
    valid = e < n_experts
    row_ptr = logits_ptr + rows[:, None] * logits_stride
    x = tl.load(row_ptr + e[None, :], mask=rmask[:, None] & valid[None, :], other=0.0).to(tl.float32)
    if softcap > 0:
        x = _softcap(x, softcap)
    if SCORE == 0:
        xm = tl.where(valid[None, :], x, float("-inf"))
        row_max = tl.max(xm, axis=1)
        p = tl.exp(xm - row_max[:, None])
        inv_sum = 1.0 / tl.sum(p, axis=1)
        s = p * inv_sum[:, None]
    else:
        s = _elementwise_score(x, SCORE)
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)[None, :]
    choice = tl.where(valid[None, :], choice, float("-inf"))
    if GROUPED:
        # Group score = sum of the group's top-2 choice values; keep the best topk_group groups
        # (ties: lowest group index). Computed once per group into a [BLOCK_T, GBLOCK] tile.
        per = n_experts // n_groups
        g = e // per
        gi_idx = tl.arange(0, GBLOCK)
        gscore = tl.full([BLOCK_T, GBLOCK], float("-inf"), tl.float32)
        for gi in range(n_groups):
            in_g = ((g == gi) & valid)[None, :]
            c = tl.where(in_g, choice, float("-inf"))
            m1 = tl.max(c, axis=1)
            a1 = tl.min(tl.where(c == m1[:, None], e[None, :], BLOCK), axis=1)
            m2 = tl.max(tl.where(e[None, :] == a1[:, None], float("-inf"), c), axis=1)
            gscore = tl.where(gi_idx[None, :] == gi, (m1 + m2)[:, None], gscore)
        gvalid = (gi_idx < n_groups)[None, :]
        gkeep = tl.zeros([BLOCK_T, GBLOCK], dtype=tl.int1)
        for _ in range(topk_group):
            cand = tl.where(gvalid & (~gkeep), gscore, float("-inf"))
            gm = tl.max(cand, axis=1)
            ga = tl.min(tl.where((cand == gm[:, None]) & gvalid & (~gkeep), gi_idx[None, :], GBLOCK), axis=1)
            gkeep = gkeep | (gi_idx[None, :] == ga[:, None])
        keep = tl.zeros([BLOCK_T, BLOCK], dtype=tl.int1)
        for gi in range(n_groups):
            kept = tl.max(tl.where((gi_idx[None, :] == gi) & gkeep, 1, 0), axis=1) > 0
            keep = keep | ((g == gi)[None, :] & kept[:, None])
        choice = tl.where(keep, choice, float("-inf"))
    # Packed key: fp32 bits made order-preserving as int32 (negative floats: flip the magnitude bits),
    # shifted to the high word; low word BLOCK-1-e so that equal values prefer the lowest expert.
    bits = choice.to(tl.int32, bitcast=True)
    key32 = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (key32.to(tl.int64) << 32) | (BLOCK - 1 - e)[None, :].to(tl.int64)
    k_idx = tl.arange(0, KBLOCK)
    out_i = tl.zeros([BLOCK_T, KBLOCK], dtype=tl.int32)
    for j in range(topk):
        best = tl.max(key, axis=1)
        a = (BLOCK - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        out_i = tl.where(k_idx[None, :] == j, a[:, None], out_i)
        key = tl.where(e[None, :] == a[:, None], -9223372036854775807 - 1, key)
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


def routing_block_t(n_tok: int, n_exp: int) -> int:
    """Default tokens per program (2 warps, from the H200 sweep of scripts/bench/ops.py --sweep): ~2048
    scores per program, fewer when the batch is small."""
    per = max(1, 2048 // triton.next_power_of_2(n_exp))
    return min(per, triton.next_power_of_2(max(n_tok, 1)))


def routing_triton(gating: torch.Tensor, bias: torch.Tensor | None, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, topk: int, score: str, renormalize: bool, scale: float = 1.0,
                   softcap: float = 0.0, n_groups: int = 0, topk_group: int = 0,
                   config: tuple[int, int] | None = None) -> None:
    """Fill topk_weights / topk_ids ([T, >=topk], rows contiguous) for every token.

    config = (BLOCK_T tokens per program, num_warps) overrides the default (benchmarks)."""
    n_tok, n_exp = gating.shape
    if n_tok == 0:
        return
    if gating.stride(1) != 1 or topk_weights.stride(0) != topk_ids.stride(0):
        raise ValueError("routing_triton: gating needs unit stride over experts and topk_weights/topk_ids "
                         "the same row stride")
    if n_groups > 1 and n_exp % n_groups:
        raise ValueError(f"routing_triton: {n_exp} experts do not split into {n_groups} groups")
    block_t, warps = config or (routing_block_t(n_tok, n_exp), 2)
    _routing_kernel[(triton.cdiv(n_tok, block_t),)](
        gating, bias if bias is not None else gating, topk_weights, topk_ids, n_tok, n_exp, gating.stride(0),
        topk_weights.stride(0), topk, float(softcap), float(scale), max(n_groups, 1), topk_group,
        SCORE=SCORES.index(score), HAS_BIAS=bias is not None, RENORM=bool(renormalize), GROUPED=n_groups > 1,
        BLOCK=triton.next_power_of_2(n_exp), KBLOCK=triton.next_power_of_2(max(topk, 1)), BLOCK_T=block_t,
        GBLOCK=triton.next_power_of_2(max(n_groups, 1)), num_warps=warps)


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
