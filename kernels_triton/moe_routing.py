"""MoE routing: softmax / sigmoid / sqrtsoftplus scores, optional correction bias and expert groups,
top-k selection, renormalization and routed scaling (sgl_kernel topk_softmax, topk_sigmoid,
moe_fused_gate, biased_topk).

Selection uses score + bias; the returned weight is the unbiased score (DeepSeek noaux_tc). The
Triton kernel handles one token per program with the whole expert row in registers (384 experts
pad to 512) and picks the top-k by k rounds of argmax, which is exact and cheap for k <= 8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
RENORM_EPS = 1e-20  # SGLang's _RENORMALIZE_SUM_EPSILON


@triton.jit
def _routing_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, n_experts, logits_stride, out_stride, topk,
                    softcap, scale, n_groups, topk_group,
                    SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                    GROUPED: tl.constexpr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK)
    valid = e < n_experts
    x = tl.load(logits_ptr + row * logits_stride + e, mask=valid, other=0.0).to(tl.float32)
    if softcap > 0:
        y = x / softcap
        ey = tl.exp(-2.0 * tl.abs(y))
        t = (1.0 - ey) / (1.0 + ey)
        x = tl.where(y >= 0, t, -t) * softcap
    if SCORE == 0:
        xm = tl.where(valid, x, float("-inf"))
        p = tl.exp(xm - tl.max(xm, axis=0))
        s = p / tl.sum(p, axis=0)
    elif SCORE == 1:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        s = tl.sqrt(sp)
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    if GROUPED:
        # Group score = sum of the group's top-2 choice values; keep the best topk_group groups.
        per = n_experts // n_groups
        g = e // per
        keep = tl.zeros([BLOCK], dtype=tl.int1)
        gscore_taken = tl.zeros([BLOCK], dtype=tl.int1)
        for _ in range(topk_group):
            best = float("-inf")
            best_g = -1
            for gi in range(n_groups):
                in_g = (g == gi) & valid
                c = tl.where(in_g, choice, float("-inf"))
                m1 = tl.max(c, axis=0)
                a1 = tl.min(tl.where(c == m1, e, BLOCK), axis=0)
                m2 = tl.max(tl.where(e == a1, float("-inf"), c), axis=0)
                gs = m1 + m2
                taken = tl.max(tl.where(in_g & gscore_taken, 1, 0), axis=0) > 0
                better = (gs > best) & (~taken)
                best = tl.where(better, gs, best)
                best_g = tl.where(better, gi, best_g)
            sel = g == best_g
            keep = keep | sel
            gscore_taken = gscore_taken | sel
        choice = tl.where(keep, choice, float("-inf"))
    k_idx = tl.arange(0, KBLOCK)
    out_w = tl.zeros([KBLOCK], dtype=tl.float32)
    out_i = tl.zeros([KBLOCK], dtype=tl.int32)
    for j in range(topk):
        m = tl.max(choice, axis=0)
        a = tl.min(tl.where(choice == m, e, BLOCK), axis=0)
        wj = tl.sum(tl.where(e == a, s, 0.0), axis=0)
        out_w = tl.where(k_idx == j, wj, out_w)
        out_i = tl.where(k_idx == j, a, out_i)
        choice = tl.where(e == a, float("-inf"), choice)
    kmask = k_idx < topk
    if RENORM:
        out_w = out_w / (tl.sum(tl.where(kmask, out_w, 0.0), axis=0) + 1e-20)
    out_w = out_w * scale
    tl.store(w_ptr + row * out_stride + k_idx, out_w.to(w_ptr.dtype.element_ty), mask=kmask)
    tl.store(ids_ptr + row * out_stride + k_idx, out_i.to(ids_ptr.dtype.element_ty), mask=kmask)


def routing_triton(gating: torch.Tensor, bias: torch.Tensor | None, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, topk: int, score: str, renormalize: bool, scale: float = 1.0,
                   softcap: float = 0.0, n_groups: int = 0, topk_group: int = 0) -> None:
    """Fill topk_weights / topk_ids ([T, >=topk], rows contiguous) for every token."""
    n_tok, n_exp = gating.shape
    if n_tok == 0:
        return
    assert gating.stride(1) == 1 and topk_weights.stride(0) == topk_ids.stride(0)
    _routing_kernel[(n_tok,)](gating, bias if bias is not None else gating, topk_weights, topk_ids, n_exp,
                              gating.stride(0), topk_weights.stride(0), topk, float(softcap), float(scale),
                              max(n_groups, 1), topk_group, SCORE=SCORES.index(score),
                              HAS_BIAS=bias is not None, RENORM=bool(renormalize),
                              GROUPED=n_groups > 1, BLOCK=triton.next_power_of_2(n_exp),
                              KBLOCK=triton.next_power_of_2(max(topk, 1)))


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
