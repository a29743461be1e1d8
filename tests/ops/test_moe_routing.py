"""topk_softmax / topk_sigmoid / moe_fused_gate / biased_topk vs softmax(+bias)+topk (upstream
test_moe_topk_softmax.py: 1e-3, indices compared through the gathered values)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch
import torch.nn.functional as F

from kernels_triton import moe_routing
from tests.ops.conftest import PATHS, assert_no_nan_close, poisoned


def _check(w: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor, choice: torch.Tensor, topk: int,
           renorm: bool, scale: float = 1.0) -> None:
    ref_vals, _ = choice.topk(topk, dim=-1)
    got_vals = choice.gather(1, ids.long())
    assert_no_nan_close(got_vals.sort(-1).values, ref_vals.sort(-1).values, 1e-3, 1e-3)
    ref_w = scores.gather(1, ids.long())
    if renorm:
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    assert_no_nan_close(w, ref_w * scale, 1e-3, 1e-3)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("renorm", [False, True])
@pytest.mark.parametrize("experts,topk", [(8, 2), (384, 6)])
def test_topk_softmax(path: str, renorm: bool, experts: int, topk: int) -> None:
    g = torch.randn(5, experts, dtype=torch.bfloat16)
    w, ids = poisoned(5, topk), poisoned(5, topk, dtype=torch.int32)
    if path == "torch":
        sgl_kernel.topk_softmax(w, ids, g, renorm)
    else:
        moe_routing.routing_triton(g, None, w, ids, topk, "softmax", renorm)
    s = torch.softmax(g.float(), -1)
    _check(w, ids, s, s, topk, renorm)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("score", ["sigmoid", "sqrtsoftplus"])
def test_biased_topk(path: str, score: str) -> None:
    g = torch.randn(4, 384, dtype=torch.float32)
    bias = torch.randn(384) * 0.1
    w, ids = poisoned(4, 6), poisoned(4, 6, dtype=torch.int32)
    if path == "torch":
        sgl_kernel.biased_topk(g, bias, w, ids, 6, score, 0, True, routed_scaling_factor=1.5,
                               apply_routed_scaling_factor_on_output=True)
    else:
        moe_routing.routing_triton(g, bias, w, ids, 6, score, True, scale=1.5)
    s = torch.sigmoid(g) if score == "sigmoid" else F.softplus(g).sqrt()
    _check(w, ids, s, s + bias, 6, True, 1.5)


@pytest.mark.parametrize("path", PATHS)
def test_moe_fused_gate_grouped(path: str) -> None:
    t, e, groups, tg, k = 6, 64, 8, 4, 6
    g = torch.randn(t, e)
    bias = torch.randn(e) * 0.1
    if path == "torch":
        w, ids = sgl_kernel.moe_fused_gate(g, bias, groups, tg, k, renormalize=True)
    else:
        w, ids = poisoned(t, k), poisoned(t, k, dtype=torch.int32)
        moe_routing.routing_triton(g, bias, w, ids, k, "sigmoid", True, n_groups=groups, topk_group=tg)
    s = torch.sigmoid(g)
    choice = s + bias
    gs = choice.view(t, groups, -1).topk(2, -1).values.sum(-1)
    keep = torch.zeros(t, groups, dtype=torch.bool).scatter_(1, gs.topk(tg, -1).indices, True)
    masked = choice.masked_fill(~keep.repeat_interleave(e // groups, 1), float("-inf"))
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    _check(w, ids, s, masked, k, True)


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("groups", [0, 4])
def test_routing_triton_tiles(score: str, groups: int) -> None:
    """Several tokens per program with a ragged last tile (11 tokens, tiles of 4), 96 experts (pad to
    128), softcap, bias, optional groups; ties in the logits (quantized to 1/4) must pick the lowest
    expert, as the packed-key argmax promises."""
    t, e, k = 11, 96, 5
    g = (torch.randn(t, e) * 8).round() / 4
    bias = None if score == "softmax" else (torch.randn(e) * 0.1)
    w, ids = poisoned(t, k), poisoned(t, k, dtype=torch.int32)
    moe_routing.routing_triton(g, bias, w, ids, k, score, True, scale=2.0, softcap=3.0 if score == "softmax" else 0.0,
                               n_groups=groups, topk_group=2, config=(4, 4))
    rw, _ = moe_routing.routing_ref(g, bias, k, score, True, 2.0, 3.0 if score == "softmax" else 0.0, groups, 2)
    s = moe_routing.scores_ref(g, score, 3.0 if score == "softmax" else 0.0)
    choice = s + bias if bias is not None else s
    if groups:
        gs = choice.view(t, groups, -1).topk(2, -1).values.sum(-1)
        keep = torch.zeros(t, groups, dtype=torch.bool).scatter_(1, gs.topk(2, -1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // groups, 1), float("-inf"))
    _check(w, ids, s, choice, k, True, 2.0)
    assert_no_nan_close(w.sort(-1).values, rw.sort(-1).values, 1e-3, 1e-3)
    # Among equal choice values the lower expert id wins: the chosen ids of each equal-value run are
    # the smallest ones of that run.
    for r in range(t):
        for v in choice[r, ids[r].long()].unique():
            tied = (choice[r] == v).nonzero().view(-1)
            got = ids[r][choice[r, ids[r].long()] == v].long().sort().values
            assert torch.equal(got, tied[: got.numel()])


@pytest.mark.parametrize("score", ["softmax", "sqrtsoftplus"])
def test_routing_triton_clustered(score: str) -> None:
    """All top-k experts clustered (8 adjacent experts; for the second token the last 4 of 100 and 2
    just before): every round must skip the experts already picked, never repeat one, and match
    the reference ids exactly."""
    g = torch.randn(3, 100)
    g[0, 16:24] += 10.0
    g[1, 96:100] += 10.0
    g[1, 88:90] += 9.0
    w, ids = poisoned(3, 6), poisoned(3, 6, dtype=torch.int32)
    moe_routing.routing_triton(g, None, w, ids, 6, score, False, config=(2, 2))
    rw, ri = moe_routing.routing_ref(g, None, 6, score, False)
    assert torch.equal(ids.sort(-1).values, ri.sort(-1).values)
    assert len(set(ids[0].tolist())) == 6 and set(ids[0].tolist()) <= set(range(16, 24))
    assert_no_nan_close(w.sort(-1).values, rw.sort(-1).values, 1e-3, 1e-3)


def test_fused_shared_expert_slot() -> None:
    w, ids = sgl_kernel.moe_fused_gate(torch.randn(3, 16), torch.zeros(16), 1, 1, 4, renormalize=True,
                                       num_fused_shared_experts=1, routed_scaling_factor=2.5)
    assert (ids[:, -1] == 16).all() and torch.allclose(w[:, -1], torch.full((3,), 1 / 2.5))
    assert torch.allclose(w[:, :-1].sum(-1), torch.ones(3), atol=1e-5)


@pytest.mark.gpu
def test_routing_gpu() -> None:
    g = torch.randn(4096, 384, device="cuda")
    bias = torch.randn(384, device="cuda") * 0.1
    w = torch.full((4096, 6), float("nan"), device="cuda")
    ids = torch.full((4096, 6), -1, dtype=torch.int32, device="cuda")
    sgl_kernel.biased_topk(g, bias, w, ids, 6, "sqrtsoftplus", 0, True, 1.5, True)
    s = F.softplus(g).sqrt()
    _check(w, ids, s, s + bias, 6, True, 1.5)
