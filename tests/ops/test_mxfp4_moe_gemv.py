"""Decode GEMV path of the MXFP4 MoE (kernels_triton/mxfp4_moe_gemv.py) against float64 references.

Same references and tolerances as test_mxfp4_moe.py (its module docstring says how the error bound is
built): every output within the elementwise float64 bound, and >= 99% of outputs bit-equal to the
rounding-faithful reference under the interpreter (relative Frobenius < 2^-8 on the GPU). Output
buffers and the kernels' own intermediates (act, y) are filled with NaN first, so an element no kernel
writes fails. The CPU tier uses 64-row tiles (the interpreter's cost grows with the number of
programs); one test runs the default tiles through mxfp4_moe's own dispatch so their specialization
is recorded and compiled for sm_90 / sm_120 (test_triton_compile.py).
"""

from __future__ import annotations

import pytest
import torch

from kernels_triton import mxfp4_moe as mm
from kernels_triton import mxfp4_moe_gemv as gv
from tests.ops.test_mxfp4_moe import (
    HAS_CUDA,
    assert_scale_255_is_nan,
    check,
    error_bound,
    make_experts,
    routing,
    run_both,
)

CPU_CFG = gv.GemvMoeConfig(gu_block_n=64, gu_block_k=64, gu_warps=1, dn_block_n=64, dn_block_k=64, dn_warps=1)


@pytest.fixture
def nan_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty returns NaN-filled float tensors while the GEMV launcher allocates act / y."""
    real = torch.empty

    def empty(*a: object, **k: object) -> torch.Tensor:
        t = real(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(gv.torch, "empty", empty)


def run_gemv(x: torch.Tensor, experts: tuple[torch.Tensor, ...], ids: torch.Tensor, tw: torch.Tensor,
             limit: float | None = 10.0, scale: float = 1.5, config: gv.GemvMoeConfig | None = CPU_CFG,
             faithful_share: float = 0.99) -> torch.Tensor:
    """GEMV output into a NaN-poisoned buffer, checked against the bound and the faithful reference."""
    return run_both(x, experts, ids, tw, limit, scale, config, faithful_share, what="GEMV vs float64")


def mixed_routing(t: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing with -1 (CPU-resident experts) and an out-of-range id mixed in, one all-(-1) token."""
    ids, tw = routing(t, e, k)
    ids[0, 1] = -1
    if t > 1:
        ids[1] = -1  # a token none of whose experts is on the GPU
    if t > 2:
        ids[2, 0] = e  # out of range: skipped like -1
        ids[t - 1, k - 1] = -1
    return ids, tw


@pytest.mark.parametrize("t", [1, 2, 5, 8])
def test_gemv_matches_reference(t: int, nan_workspace: None) -> None:
    """Batch 1, 2, DSpark's verify block of 5 and 8 at top-6 over 8 experts: most experts serve several
    tokens (one leader reads them once), ids of -1 mixed in, one token with no GPU expert."""
    e, k, h, i = 8, 6, 128, 64
    x = torch.randn(t, h).bfloat16()
    ids, tw = mixed_routing(t, e, k)
    out = run_gemv(x, make_experts(e, h, i), ids, tw)
    if t > 1:
        assert (out[1] == 0).all()


def test_gemv_no_limit_and_few_rows_per_leader(nan_workspace: None) -> None:
    """max_rows = 2 at 8 tokens on 3 experts: each expert's tokens are split over several leaders
    (weights read again per leader); no SwiGLU limit; H = 96 leaves a masked K tail (3 groups)."""
    t, e, k, h, i = 8, 3, 2, 96, 96
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    ids[3, 0] = -1
    cfg = gv.GemvMoeConfig(gu_block_n=64, gu_block_k=64, gu_warps=1, dn_block_n=64, dn_block_k=64, dn_warps=1,
                           max_rows=2)
    run_gemv(x, make_experts(e, h, i), ids, tw, limit=None, scale=1.0, config=cfg)


def test_gemv_repeated_expert_in_one_token(nan_workspace: None) -> None:
    """The same expert twice in one token's slots: two rows of one leader, each with its router weight."""
    x = torch.randn(3, 64).bfloat16()
    ids = torch.tensor([[1, 1, 0], [2, 1, -1], [1, 0, 1]], dtype=torch.int64)
    run_gemv(x, make_experts(3, 64, 32), ids, torch.rand(3, 3) + 0.1)


def test_gemv_zero_and_extreme_scales(nan_workspace: None) -> None:
    """Expert 0 all-zero codes, expert 1 all E8M0 0 (2^-127), expert 2 scales 2^-27 (100) on gate/up and
    2^13 (140) on down, expert 3 the reverse: exact power-of-two scaling through the split factors."""
    t, e, k, h, i = 5, 4, 4, 64, 64
    w13, s13, w2, s2 = make_experts(e, h, i)
    w13[0].zero_()
    w2[0].zero_()
    s13[1].zero_()
    s13[2].fill_(100)
    s2[2].fill_(140)
    s13[3].fill_(140)
    s2[3].fill_(100)
    x = torch.randn(t, h).bfloat16()
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(torch.int32)
    out = run_gemv(x, (w13, s13, w2, s2), ids, torch.rand(t, k) + 0.1, limit=None, scale=1.0)
    assert torch.isfinite(out).all() and out.abs().max() > 0


def test_gemv_scale_255_is_nan() -> None:
    """E8M0 255 is NaN on this path too: tokens routed to that expert get NaN, others not."""
    assert_scale_255_is_nan(CPU_CFG)


def test_gemv_scale_dtypes_agree() -> None:
    """float8_e8m0fnu views and float32 scale values give identical bits to E8M0 bytes."""
    t, e, k, h, i = 3, 4, 2, 64, 64
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    w13, s13, w2, s2 = make_experts(e, h, i)
    base = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0, config=CPU_CFG)
    e8 = mm.mxfp4_moe(x, w13.view(torch.int8), s13.view(torch.float8_e8m0fnu), w2.view(torch.int8),
                      s2.view(torch.float8_e8m0fnu), ids, tw, 10.0, config=CPU_CFG)
    f32 = mm.mxfp4_moe(x, w13, torch.exp2(s13.float() - 127), w2, torch.exp2(s2.float() - 127), ids, tw, 10.0,
                       config=CPU_CFG)
    assert not torch.isnan(base).any()
    assert torch.equal(base, e8) and torch.equal(base, f32)


def test_gemv_default_dispatch(nan_workspace: None) -> None:
    """config=None at T * top_k <= GEMV_MAX_SLOTS takes the GEMV with its default tiles (checked by the
    kernel launched) and matches the reference; above the threshold the tl.dot kernels run."""
    launched: list[str] = []
    real_gemv = gv.mxfp4_moe_gemv

    def spy(*a: object, **k: object) -> torch.Tensor:
        launched.append("gemv")
        return real_gemv(*a, **k)

    x = torch.randn(2, 64).bfloat16()
    ids, tw = mixed_routing(2, 4, 2)
    experts = make_experts(4, 64, 32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gv, "mxfp4_moe_gemv", spy)
        run_gemv(x, experts, ids, tw, config=None)
        assert launched == ["gemv"]
        big = gv.GEMV_MAX_SLOTS // 2 + 1
        xb = torch.randn(big, 64).bfloat16()
        idb, twb = routing(big, 4, 2)
        mm.mxfp4_moe(xb, *experts, idb, twb, 10.0)
        assert launched == ["gemv"], "T * top_k above GEMV_MAX_SLOTS must take the tl.dot kernels"


def test_gemv_bad_config() -> None:
    w13, s13, w2, s2 = make_experts(2, 64, 32)
    ids, tw = routing(1, 2, 1)
    with pytest.raises(ValueError, match="gu_block_k"):
        mm.mxfp4_moe(torch.randn(1, 64).bfloat16(), w13, s13, w2, s2, ids, tw,
                     config=gv.GemvMoeConfig(gu_block_k=48))


# ------------------------------------------------------------------ GPU, DeepSeek-V4.1-Flash sizes
V41 = dict(h=5120, i=2304, e=384, k=6)


@pytest.fixture(scope="module")
def v41_experts() -> tuple[torch.Tensor, ...]:
    """384 experts at V4.1-Flash size (7.2 GB of MXFP4 on the GPU); scales as in quantized weights."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    return make_experts(V41["e"], V41["h"], V41["i"], 117, 124, device="cuda", gen=gen)


def _gpu_check(out: torch.Tensor, x: torch.Tensor, experts: tuple[torch.Tensor, ...], ids: torch.Tensor,
               tw: torch.Tensor, what: str) -> None:
    """test_mxfp4_moe_gpu_v41's checks: float32 bound x 1.1 (NaN / gross errors) and relative Frobenius
    < 2^-8 against the rounding-faithful reference (its docstring says why)."""
    exact, bound = error_bound(x, *experts, ids, tw, 10.0, 1.5, dtype=torch.float32)
    check(out, exact, bound * 1.1, f"{what} GEMV vs float32", loosest=None)
    faithful = mm.mxfp4_moe_ref(x, *experts, ids, tw, 10.0, 1.5, dtype=torch.float32, round_like_kernel=True)
    rel = float((out.float() - faithful).norm() / faithful.norm())
    assert rel < 2.0 ** -8, f"{what}: relative Frobenius error {rel:.3e} vs the rounding-faithful reference"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 2, 5, 8])
def test_gemv_gpu_v41(t: int, v41_experts: tuple[torch.Tensor, ...]) -> None:
    """Default dispatch (the GEMV) at V4.1-Flash sizes, -1 ids mixed in; float32 scales give the same bits."""
    w13, s13, w2, s2 = v41_experts
    torch.manual_seed(t)
    x = torch.randn(t, V41["h"], device="cuda").bfloat16()
    ids, tw = routing(t, V41["e"], V41["k"], device="cuda")
    ids[0, 2] = -1
    if t > 1:
        ids[1] = -1
    out = torch.full((t, V41["h"]), float("nan"), dtype=torch.bfloat16, device="cuda")
    mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, swiglu_limit=10.0, routed_scaling_factor=1.5, out=out)
    torch.cuda.synchronize()
    _gpu_check(out, x, v41_experts, ids, tw, f"T={t}")
    if t > 1:
        assert (out[1] == 0).all()
    f32 = mm.mxfp4_moe(x, w13, torch.exp2(s13.float() - 127), w2, torch.exp2(s2.float() - 127), ids, tw,
                       swiglu_limit=10.0, routed_scaling_factor=1.5)
    assert torch.equal(out, f32), "float32 scales (SGLang's CUDA dtype) must give the same bits"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 5, 8])
def test_gemv_gpu_cuda_graph_replay(t: int, v41_experts: tuple[torch.Tensor, ...]) -> None:
    """Captured once, replayed on new hidden states and new routings (a shared expert, -1 ids): each
    replay matches the eager result bit for bit and the reference."""
    w13, s13, w2, s2 = v41_experts
    x = torch.randn(t, V41["h"], device="cuda").bfloat16()
    ids, tw = routing(t, V41["e"], V41["k"], device="cuda")
    out = torch.full((t, V41["h"]), float("nan"), dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles) off the capture
        mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0, 1.5, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0, 1.5, out=out)
    for rep in range(3):
        x.copy_(torch.randn_like(x, dtype=torch.float32).bfloat16())
        new_ids, new_tw = routing(t, V41["e"], V41["k"], device="cuda")
        if t > 1:
            new_ids[t - 1, 0] = new_ids[0, 0]  # two tokens on one expert: one leader serves both
        new_ids[0, 5] = -1
        ids.copy_(new_ids)
        tw.copy_(new_tw)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        eager = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0, 1.5)
        assert torch.equal(out, eager), f"replay {rep}: graph and eager results differ"
        _gpu_check(out, x, v41_experts, ids, tw, f"T={t} replay {rep}")
