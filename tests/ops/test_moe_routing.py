"""topk_softmax / topk_sigmoid / moe_fused_gate / biased_topk vs softmax(+bias)+topk (upstream
test_moe_topk_softmax.py: 1e-3, indices compared through the gathered values)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch
import torch.nn.functional as F

from kernels_triton import moe_routing
from tests.ops._helpers import PATHS, assert_no_nan_close, poisoned


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
@pytest.mark.parametrize("nchunk", [1, 2, 3])
def test_routing_triton_tiles(score: str, groups: int, nchunk: int) -> None:
    """Several tokens per program with a ragged last tile (11 tokens, tiles of 4), 96 experts as 1 x 128
    or 2 x 64 (padded) or 3 x 32 chunks, softcap, bias, optional groups; ties in the logits (quantized
    to 1/4) must pick the lowest expert, as the packed-key argmax promises."""
    t, e, k = 11, 96, 5
    g = (torch.randn(t, e) * 8).round() / 4
    bias = None if score == "softmax" else (torch.randn(e) * 0.1)
    w, ids = poisoned(t, k), poisoned(t, k, dtype=torch.int32)
    moe_routing.routing_triton(g, bias, w, ids, k, score, True, scale=2.0, softcap=3.0 if score == "softmax" else 0.0,
                               n_groups=groups, topk_group=2, config=(4, 4, nchunk))
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
@pytest.mark.parametrize("nchunk", [1, 2, 3])
def test_routing_triton_clustered(score: str, nchunk: int) -> None:
    """All top-k experts clustered (8 adjacent experts; for the second token the last 4 of 100 and 2
    just before; for the third the three experts of one column of the 3 x 64 layout, 5, 69, 133 - 100
    experts leave 133 as padding, so 5 and 69 and then column 6's): every round must skip the experts
    already picked, never repeat one, and match the reference ids exactly, in descending order."""
    g = torch.randn(4, 100)
    g[0, 16:24] += 10.0
    g[1, 96:100] += 10.0
    g[1, 88:90] += 9.0
    g[2, [5, 69]] += 12.0
    g[2, [6, 70]] += 11.0
    g[3, [0, 64, 32, 96]] += 10.0  # the first and last expert of each layout's first column
    w, ids = poisoned(4, 6), poisoned(4, 6, dtype=torch.int32)
    moe_routing.routing_triton(g, None, w, ids, 6, score, False, config=(2, 2, nchunk))
    rw, ri = moe_routing.routing_ref(g, None, 6, score, False)
    assert torch.equal(ids, ri)
    assert len(set(ids[0].tolist())) == 6 and set(ids[0].tolist()) <= set(range(16, 24))
    assert_no_nan_close(w, rw, 1e-3, 1e-3)


@pytest.mark.parametrize("nchunk", [1, 2, 3])
def test_routing_triton_whole_columns(nchunk: int) -> None:
    """96 experts as 3 x 32: the top 6 are two whole columns (5, 37, 69 and 6, 38, 70), so each column is
    popped down to its last key; then 7 after them. Descending order and exact ids vs the reference."""
    g = torch.randn(2, 96).clamp(-3, 3)
    g[:, [69, 5, 37, 6, 70, 38]] = torch.tensor([14.0, 13.0, 12.0, 11.0, 10.0, 9.0])
    g[1, 7] = 20.0
    w, ids = poisoned(2, 7), poisoned(2, 7, dtype=torch.int32)
    moe_routing.routing_triton(g, None, w, ids, 7, "sqrtsoftplus", True, config=(2, 2, nchunk))
    rw, ri = moe_routing.routing_ref(g, None, 7, "sqrtsoftplus", True)
    assert ids[0, :6].tolist() == [69, 5, 37, 6, 70, 38] and ids[1, :7].tolist() == [7, 69, 5, 37, 6, 70, 38]
    assert torch.equal(ids, ri)
    assert_no_nan_close(w, rw, 1e-6, 1e-6)


@pytest.mark.parametrize("nchunk", [1, 2, 3])
def test_routing_triton_all_equal_and_neg_inf(nchunk: int) -> None:
    """Degenerate rows: all logits -inf (sigmoid scores all 0: every expert ties, the k lowest ids
    win, weights 0 after the renorm epsilon), all logits equal (same), and a row with only 3 finite
    logits among -inf ones under softmax (those 3 first, then the lowest -inf ids with weight 0)."""
    g = torch.zeros(3, 96)
    g[0] = float("-inf")
    g[2] = float("-inf")
    g[2, [40, 7, 90]] = torch.tensor([1.0, 3.0, 2.0])
    w, ids = poisoned(3, 5), poisoned(3, 5, dtype=torch.int32)
    moe_routing.routing_triton(g[:2], None, w[:2], ids[:2], 5, "sigmoid", True, config=(4, 2, nchunk))
    moe_routing.routing_triton(g[2:], None, w[2:], ids[2:], 5, "softmax", False, config=(4, 2, nchunk))
    assert ids[:2].tolist() == [[0, 1, 2, 3, 4]] * 2
    assert ids[2].tolist() == [7, 90, 40, 0, 1]
    assert_no_nan_close(w[0], torch.zeros(5), 0, 0)
    assert_no_nan_close(w[1], torch.full((5,), 0.2), 1e-6, 1e-6)
    p = torch.softmax(torch.tensor([3.0, 2.0, 1.0]), -1)
    assert_no_nan_close(w[2], torch.cat([p, torch.zeros(2)]), 1e-6, 1e-6)


def test_routing_layout() -> None:
    """The chunk layout wastes no lanes at DeepSeek's expert counts."""
    assert moe_routing.routing_layout(384) == (128, 3)
    assert moe_routing.routing_layout(256) == (256, 1)
    assert moe_routing.routing_layout(96) == (32, 3)
    assert moe_routing.routing_layout(100) == (128, 1)
    g = torch.randn(5, 24)
    w, ids = poisoned(5, 12), poisoned(5, 12, dtype=torch.int32)
    moe_routing.routing_triton(g, None, w, ids, 12, "sigmoid", True, config=(2, 2, 3))  # 3 x 8, topk > C
    rw, ri = moe_routing.routing_ref(g, None, 12, "sigmoid", True)
    assert torch.equal(ids, ri)
    assert_no_nan_close(w, rw, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="topk=7"):
        moe_routing.routing_triton(torch.zeros(2, 6), None, poisoned(2, 7), poisoned(2, 7, dtype=torch.int32), 7,
                                   "sigmoid", True)


def test_fused_shared_expert_slot() -> None:
    w, ids = sgl_kernel.moe_fused_gate(torch.randn(3, 16), torch.zeros(16), 1, 1, 4, renormalize=True,
                                       num_fused_shared_experts=1, routed_scaling_factor=2.5)
    assert (ids[:, -1] == 16).all() and torch.allclose(w[:, -1], torch.full((3,), 1 / 2.5))
    assert torch.allclose(w[:, :-1].sum(-1), torch.ones(3), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, (1, 2, 1), (8, 4, 3), (16, 4, 3)])
def test_routing_gpu(config: tuple[int, int, int] | None) -> None:
    """Real sizes: 8192 tokens x 384 experts top-6 (the shim's default tiles and the swept ones, 1 or 3
    chunks), exact ids vs the reference (random fp32 logits have no ties), and the grouped sigmoid path
    (256 experts, 8 groups, 4 kept, top-8)."""
    g = torch.randn(8192, 384, device="cuda")
    bias = torch.randn(384, device="cuda") * 0.1
    w = torch.full((8192, 6), float("nan"), device="cuda")
    ids = torch.full((8192, 6), -1, dtype=torch.int32, device="cuda")
    if config is None:
        sgl_kernel.biased_topk(g, bias, w, ids, 6, "sqrtsoftplus", 0, True, 1.5, True)
    else:
        moe_routing.routing_triton(g, bias, w, ids, 6, "sqrtsoftplus", True, 1.5, config=config)
    s = F.softplus(g).sqrt()
    _check(w, ids, s, s + bias, 6, True, 1.5)
    rw, ri = moe_routing.routing_ref(g, bias, 6, "sqrtsoftplus", True, 1.5)
    assert torch.equal(ids, ri)
    g2 = torch.randn(4096, 256, device="cuda")
    b2 = torch.randn(256, device="cuda") * 0.1
    w2, i2 = sgl_kernel.moe_fused_gate(g2, b2, 8, 4, 8, renormalize=True)
    rw2, ri2 = moe_routing.routing_ref(g2, b2, 8, "sigmoid", True, 1.0, 0.0, 8, 4)
    assert torch.equal(i2.sort(-1).values, ri2.sort(-1).values)
    assert_no_nan_close(w2.sort(-1).values, rw2.sort(-1).values, 1e-5, 1e-5)


@pytest.mark.gpu
def test_routing_shims_gpu() -> None:
    """topk_softmax (with softcap and renorm) and topk_sigmoid (with a correction bias) through the shims at
    8192 x 384 top-6. Slot by slot, the chosen expert's choice value equals the reference's within 1e-6
    (the kernel's exp/division are not torch's bit for bit; with one bias vector for every token, two
    experts whose scores saturate near 1 differ only by their biases, so a few of 8192 tokens have
    near-ties below 1e-6 whose order may swap), ids distinct, weights within 1e-5 of the reference
    scores of the chosen experts."""
    g = torch.randn(8192, 384, device="cuda") * 3
    bias = torch.randn(384, device="cuda") * 0.1
    for score in ("softmax", "sigmoid"):
        w = torch.full((8192, 6), float("nan"), device="cuda")
        ids = torch.full((8192, 6), -1, dtype=torch.int32, device="cuda")
        if score == "softmax":
            sgl_kernel.topk_softmax(w, ids, g, True, moe_softcapping=30.0)
            s = torch.softmax(torch.tanh(g / 30.0) * 30.0, -1)
            choice = s
        else:
            sgl_kernel.topk_sigmoid(w, ids, g, False, correction_bias=bias)
            s = torch.sigmoid(g)
            choice = s + bias
        _, ri = moe_routing.routing_ref(g, bias if score == "sigmoid" else None, 6, score, score == "softmax",
                                        softcap=30.0 if score == "softmax" else 0.0)
        assert (ids >= 0).all() and (ids.sort(-1).values.diff(dim=-1) > 0).all()
        assert_no_nan_close(choice.gather(1, ids.long()), choice.gather(1, ri.long()), 0, 1e-6)
        ref_w = s.gather(1, ids.long())
        if score == "softmax":
            ref_w = ref_w / ref_w.sum(-1, keepdim=True)
        assert_no_nan_close(w, ref_w, 1e-5, 1e-5)
