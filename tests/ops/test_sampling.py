"""Sampling vs upstream test_sampling.py semantics: renorm probs 1e-3 against sort/cumsum
references; samples stay inside the top-k / top-p / min-p support; logits and probs entry points
give identical tokens with the same generator state; softmax with temperature."""

from __future__ import annotations

import flashinfer.sampling as fs
import pytest
import sgl_kernel
import torch

from kernels_triton import sampling
from tests.ops.conftest import assert_no_nan_close, poisoned


def _probs(b: int, v: int) -> torch.Tensor:
    p = torch.rand(b, v)
    return p / p.sum(-1, keepdim=True)


def _top_p_mask(p: torch.Tensor, top_p: float, eps: float = 0.0) -> torch.Tensor:
    srt, idx = p.sort(-1)
    keep = (srt.cumsum(-1) > (1 - top_p) - eps) if eps else (srt.cumsum(-1) >= (1 - top_p))
    return torch.zeros_like(p, dtype=torch.int32).scatter_add_(1, idx, keep.int()).bool()


def _top_k_mask(p: torch.Tensor, k: int) -> torch.Tensor:
    return p >= p.sort(-1, descending=True).values[:, k - 1:k]


@pytest.mark.parametrize("v,k", [(111, 10), (3000, 100)])
def test_top_k_renorm(v: int, k: int) -> None:
    p = _probs(4, v)
    ref = torch.where(_top_k_mask(p, k), p, 0.0)
    assert_no_nan_close(sgl_kernel.top_k_renorm_prob(p, k), ref / ref.sum(-1, keepdim=True), 1e-3, 1e-3)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9])
def test_top_p_renorm(top_p: float) -> None:
    p = _probs(4, 3000)
    ref = torch.where(_top_p_mask(p, top_p), p, 0.0)
    assert_no_nan_close(sgl_kernel.top_p_renorm_prob(p, top_p), ref / ref.sum(-1, keepdim=True), 1e-3, 1e-3)


@pytest.mark.parametrize("order", ["joint", "top_k_first"])
def test_top_k_top_p_sampling_support_and_alignment(order: str) -> None:
    b, v, k, p_ = 8, 2000, 200, 0.5
    p = _probs(b, v)
    mask = _top_k_mask(p, k) & _top_p_mask(p, p_, eps=1e-4) if order == "joint" else None
    for _ in range(50):
        s = fs.top_k_top_p_sampling_from_probs(p, torch.full((b,), k), torch.full((b,), p_), filter_apply_order=order)
        assert s.dtype == torch.int32 and ((s >= 0) & (s < v)).all()
        if mask is not None:
            assert mask[torch.arange(b), s.long()].all()
    logits = torch.randn(b, v) * 5
    g1 = torch.Generator().manual_seed(7)
    g2 = torch.Generator().manual_seed(7)
    a = fs.top_k_top_p_sampling_from_logits(logits, k, 0.5, filter_apply_order=order, generator=g1)
    c = fs.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), k, 0.5, filter_apply_order=order, generator=g2)
    assert torch.equal(a, c)


@pytest.mark.parametrize("min_p", [0.05, 0.7, 1.0])
def test_min_p_sampling(min_p: float) -> None:
    p = _probs(6, 500)
    mask = p >= min_p * p.amax(-1, keepdim=True)
    for _ in range(50):
        s = fs.min_p_sampling_from_probs(p, torch.full((6,), min_p))
        assert mask[torch.arange(6), s.long()].all()


def test_sampling_distribution() -> None:
    p = torch.tensor([[0.1, 0.2, 0.7]])
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.cat([fs.sampling_from_probs(p, generator=g) for _ in range(3000)]).long(),
                            minlength=3).float() / 3000
    assert torch.allclose(counts, p[0], atol=0.03)


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_softmax_temperature(path: str) -> None:
    x = torch.randn(3, 5000) * 4
    t = torch.tensor([0.5, 1.0, 2.0])
    ref = torch.softmax(x / t[:, None], -1)
    if path == "torch":
        out = fs.softmax(x, t)
    else:
        out = poisoned(3, 5000)
        sampling.softmax_triton(x, t, out)
    assert_no_nan_close(out, ref, 1e-3, 1e-6)
    assert_no_nan_close(fs.softmax(x, 2.0), torch.softmax(x / 2.0, -1), 1e-3, 1e-6)


@pytest.mark.parametrize("config", [(3, 256, 4, True), (8, 64, 1, False), (3, 256, 4, True, 2), (2, 512, 2, False, 3)])
def test_softmax_triton_split_rows(config: tuple) -> None:
    """Rows split over several programs (3 splits of 1792 with a ragged last one; 8 splits of 640),
    with and without the L2 eviction hints, all rows at once or in groups of rows (2 groups: 2 rows
    then 1; 3 groups of 1 row),
    per-row and scalar temperature, and a row whose first split is all -inf (masked tokens, as after
    a grammar bitmask): that split's sum is 0 and must not turn into NaN."""
    x = torch.randn(3, 5000) * 4
    x[1, :2000] = float("-inf")
    x[2, 4990:] = float("-inf")
    t = torch.tensor([0.5, 1.0, 2.0])
    out = poisoned(3, 5000)
    sampling.softmax_triton(x, t, out, config=config)
    assert_no_nan_close(out, torch.softmax(x / t[:, None], -1), 1e-3, 1e-6)
    out = poisoned(3, 5000)
    sampling.softmax_triton(x, 0.7, out, config=config)
    assert_no_nan_close(out, torch.softmax(x / 0.7, -1), 1e-3, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, (33, 2048, 4, True), (17, 4096, 8, True), (66, 1024, 4, False),
                                    (132, 1024, 4, True, 4)])
def test_sampling_gpu(config: tuple[int, int, int, bool] | None) -> None:
    """Softmax at 64 x 129280 through the shim (default) and the swept configs (with and without the L2
    eviction hints, all rows at once or 4 groups of 16 rows), a quarter of the rows with their first 40000 logits -inf; top-k/top-p support."""
    x = torch.randn(64, 129280, device="cuda") * 3
    x[::4, :40000] = float("-inf")
    t = torch.rand(64, device="cuda") + 0.5
    if config is None:
        out = fs.softmax(x, t)
    else:
        out = torch.full_like(x, float("nan"))
        sampling.softmax_triton(x, t, out, config=config)
    assert_no_nan_close(out, torch.softmax(x / t[:, None], -1), 1e-3, 1e-6)
    p = torch.softmax(x, -1)
    s = fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint")
    assert _top_k_mask(p, 50)[torch.arange(64, device="cuda"), s.long()].all()
