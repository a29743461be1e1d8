"""Sampling vs upstream test_sampling.py semantics: renorm probs 1e-3 against sort/cumsum
references; samples stay inside the top-k / top-p / min-p support; logits and probs entry points
give identical tokens with the same generator state; softmax with temperature."""

from __future__ import annotations

import flashinfer.sampling as fs
import pytest
import sgl_kernel
import torch

from kernels_triton import sampling
from tests.ops._helpers import assert_no_nan_close, poisoned


@pytest.fixture(autouse=True)
def _topk_route_at_test_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests use a few rows; on CUDA the shipped threshold would send them all to the sort route,
    so the topk route is opened to any batch here (test_small_batches_sort_without_host_reads checks
    the threshold itself)."""
    monkeypatch.setattr(sampling, "TOPK_CANDIDATES_MIN_ROWS", {})


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


def test_small_batches_sort_without_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch under its device's TOPK_CANDIDATES_MIN_ROWS takes the full sort before any value is
    read back to the host; from it on, the topk candidates; both filter as the reference does. Shipped:
    16 rows on CUDA (host reads are stream syncs there), none on the CPU (checked here with a CPU
    threshold put in for the test)."""
    monkeypatch.undo()
    assert sampling.TOPK_CANDIDATES_MIN_ROWS.get("cuda", 1) > 1 and "cpu" not in sampling.TOPK_CANDIDATES_MIN_ROWS
    rows = sampling.TOPK_CANDIDATES_MIN_ROWS["cuda"]
    monkeypatch.setattr(sampling, "TOPK_CANDIDATES_MIN_ROWS", {"cpu": rows})
    torch.manual_seed(4)
    for b, whole in ((rows - 1, True), (rows, False)):
        probs = torch.softmax(torch.randn(b, 5000) * 3, -1)
        k = torch.full((b,), 40)
        reads: list[int] = []
        real_tolist = torch.Tensor.tolist
        with monkeypatch.context() as spy:
            spy.setattr(torch.Tensor, "tolist", lambda t, reads=reads, f=real_tolist: reads.append(1) or f(t))
            assert sampling._descending_candidates(probs, k)[2] == whole
        assert bool(reads) != whole
        q, idx = sampling.top_k_top_p_candidates(probs, k, 0.9, "joint")
        got = _on_vocab(q, idx, 5000)
        ref = sampling.filter_top_k_top_p(probs, k, 0.9, "joint")
        assert torch.equal(got > 0, ref > 0)


def _on_vocab(q: torch.Tensor, idx: torch.Tensor, v: int) -> torch.Tensor:
    return torch.zeros(q.shape[0], v).scatter_(1, idx, q)


@pytest.mark.parametrize("order", ["joint", "top_k_first"])
@pytest.mark.parametrize("k,whole", [(7, False), (300, False), (0, True), (5000, True)])
def test_top_k_top_p_candidates_equal_the_reference_filter(order: str, k: int, whole: bool) -> None:
    """The sampler's filtered distribution, mapped back onto the vocabulary, is the reference filter's
    (filter_top_k_top_p) on both routes: torch.topk candidates for small k, one sort otherwise."""
    torch.manual_seed(k)
    b, v = 6, 8000
    probs = torch.softmax(torch.randn(b, v) * 3, -1)
    top_p = torch.tensor([0.3, 0.5, 0.8, 0.9, 0.95, 1.0])
    assert sampling._descending_candidates(probs, torch.full((b,), k))[2] == whole
    q, idx = sampling.top_k_top_p_candidates(probs, k, top_p, order)
    got = _on_vocab(q, idx, v)
    ref = sampling.filter_top_k_top_p(probs, k, top_p, order)
    assert not got.isnan().any()
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got / got.sum(-1, keepdim=True), ref / ref.sum(-1, keepdim=True), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("order", ["joint", "top_k_first"])
def test_top_k_top_p_candidates_with_ties(order: str) -> None:
    """Ties (bf16 logits give many): top-k keeps every token tied with the k-th (so does the
    reference); ties running past the topk candidates send the row to the full sort. Which of several
    tied tokens top-p keeps at its boundary depends on sort order in both, so the kept values are
    compared as multisets."""
    torch.manual_seed(3)
    b, v, k = 4, 3000, 20
    probs = torch.softmax((torch.randn(b, v) * 2).to(torch.bfloat16).float(), -1)
    probs[0, :] = 1.0 / v  # every token tied: top-k keeps all of them, past any candidate count
    kk = torch.full((b,), k)
    assert sampling._descending_candidates(probs, kk)[2]  # row 0's ties force the full sort
    assert not sampling._descending_candidates(probs[1:], kk[1:])[2]
    for rows in (slice(None), slice(1, None)):
        p = probs[rows]
        q, idx = sampling.top_k_top_p_candidates(p, k, 0.7, order)
        got = _on_vocab(q, idx, v)
        ref = sampling.filter_top_k_top_p(p, k, 0.7, order)
        torch.testing.assert_close(got.sort(-1).values, ref.sort(-1).values, rtol=1e-5, atol=1e-8)
    q, _ = sampling.top_k_top_p_candidates(probs, k, 1.0, order)
    assert int((q[0] > 0).sum()) == v  # the tie at the k-th value is kept whole: all 3000 tokens


def test_top_k_top_p_sampling_frequencies_match_the_filtered_distribution() -> None:
    torch.manual_seed(5)
    b, v, n = 3, 40, 20000
    probs = torch.softmax(torch.randn(b, v), -1)
    ref = sampling.filter_top_k_top_p(probs, 12, 0.8, "top_k_first")
    ref = ref / ref.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(11)
    draws = torch.stack([fs.top_k_top_p_sampling_from_probs(probs, 12, 0.8, generator=g) for _ in range(n)], 1)
    freq = torch.stack([torch.bincount(draws[r].long(), minlength=v).float() / n for r in range(b)])
    assert (freq[ref == 0] == 0).all()
    torch.testing.assert_close(freq, ref, rtol=0, atol=0.012)  # 4 standard deviations of a share at n=20000


def test_top_k_top_p_sampling_keeps_the_top_token_when_top_p_is_tiny() -> None:
    probs = _probs(5, 700)
    for order in ("joint", "top_k_first"):
        s = fs.top_k_top_p_sampling_from_probs(probs, 30, 1e-9, filter_apply_order=order)
        assert torch.equal(s.long(), probs.argmax(-1))


@pytest.mark.gpu
def test_renorm_min_p_and_both_sampling_routes_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the vocabulary size on the GPU: top-k / top-p renorm against the sort references (upstream's
    1e-3), min-p samples inside their support, and top-k/top-p sampling inside the top-k support on
    both candidate routes (the shipped threshold: 4 rows sort, 64 rows take torch.topk)."""
    monkeypatch.undo()  # the shipped TOPK_CANDIDATES_MIN_ROWS
    torch.manual_seed(7)
    p = torch.softmax(torch.randn(64, 129280, device="cuda") * 3, -1)
    ref = torch.where(_top_k_mask(p, 50), p, 0.0)
    assert_no_nan_close(sgl_kernel.top_k_renorm_prob(p, 50), ref / ref.sum(-1, keepdim=True), 1e-3, 1e-3)
    ref = torch.where(_top_p_mask(p, 0.9), p, 0.0)
    assert_no_nan_close(sgl_kernel.top_p_renorm_prob(p, 0.9), ref / ref.sum(-1, keepdim=True), 1e-3, 1e-3)
    s = fs.min_p_sampling_from_probs(p, 0.1)
    rows = torch.arange(64, device="cuda")
    assert (p[rows, s.long()] >= 0.1 * p.max(-1).values).all()
    for b in (4, 64):
        whole = sampling._descending_candidates(p[:b], torch.full((b,), 50, device="cuda"))[2]
        assert whole == (b < sampling.TOPK_CANDIDATES_MIN_ROWS["cuda"])
        for order in ("joint", "top_k_first"):
            s = fs.top_k_top_p_sampling_from_probs(p[:b], 50, 0.9, filter_apply_order=order)
            assert s.dtype == torch.int32 and _top_k_mask(p[:b], 50)[rows[:b], s.long()].all()
