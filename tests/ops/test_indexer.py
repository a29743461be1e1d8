"""Indexer logits (DeepGEMM fp8/fp8_fp4 [paged] MQA logits) and the top-k transforms.

References: float64 logits written from DeepGEMM's documented definition
(sum_h w_h * relu(q_h . k) over dequantized operands, masks per row) in this file; FP4 caches and
queries produced by SGLang's own quantizer/writer (`quantize_fp4_indexer_ref`,
`store_fp4_index_cache_ref`, sglang/test/kernels/deepseek_v4/common.py); SGLang's torch fallbacks
`fp8_paged_mqa_logits_torch` and `topk_transform_pytorch_vectorized` (imported, not copied). The
Triton top-k transform kernel is checked against its torch reference (`topk_transform_rows`).

Tolerance: every operand is exact in bf16/fp32 after dequantization (e4m3, e2m1 x 2**k), so the
only error is fp32 accumulation over D = 128 products and H heads: |err| <= (D + H) * 2**-24 *
sum_h |w_h| sum_d |q_d k_d| * scale. We use 4e-5 x that absolute sum (about 2x margin) + 1e-6.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernels_triton import indexer as ix
from tests.ops._helpers import PATHS

try:  # SGLang's FP4 quantizer/writer; the GPU machine may not have sglang installed
    from sglang.test.kernels.deepseek_v4 import common
except ImportError:  # pragma: no cover
    common = None
needs_sglang = pytest.mark.skipif(common is None, reason="sglang not installed")

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def _fp4_dequant_f64(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """From the format: element 2i = low nibble, 2i+1 = high; byte c of sf scales elements 32c..32c+31."""
    p = packed.view(torch.uint8).long().cpu()
    vals = torch.stack([E2M1[p & 15], E2M1[p >> 4]], -1).flatten(-2)
    e = torch.stack([(sf.long().cpu() >> (8 * c)) & 0xFF for c in range(4)], -1)
    return (vals.view(*vals.shape[:-1], 4, 32) * torch.exp2(e.double() - 127)[..., None]).flatten(-2).to(packed.device)


def _fp8_cache(pages: int, block: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM-style FP8 index-K cache (per-token fp32 scale amax/448) and its exact f64 keys."""
    k = torch.randn(pages, block, 128, device=device) * torch.rand(pages, block, 1, device=device) * 4
    sc = k.abs().amax(-1).clamp_min(1e-4) / 448
    vals = (k / sc[..., None]).to(torch.float8_e4m3fn)
    cache = torch.empty(pages, block * 132, dtype=torch.uint8, device=device)
    cache[:, : block * 128] = vals.view(torch.uint8).reshape(pages, -1)
    cache[:, block * 128:] = sc.contiguous().view(torch.uint8).reshape(pages, -1)
    return cache.view(pages, block, 1, 132), vals.double() * sc.double()[..., None]


def _fp4_cache(pages: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 index-K cache (64-token pages) written by SGLang's reference quantizer and writer."""
    if common is None:
        pytest.skip("sglang not installed")
    n = pages * 64
    x = torch.randn(n, 128, device=device) * torch.rand(n, 1, device=device) * 4
    packed, sf = common.quantize_fp4_indexer_ref(x)
    cache = common.store_fp4_index_cache_ref(packed, sf, torch.arange(n, device=device), pages)
    return cache.view(pages, 64, 1, 68), _fp4_dequant_f64(packed, sf).view(pages, 64, 128)


def _fp4_query(shape: tuple[int, ...], device: str = "cpu") -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    if common is None:
        pytest.skip("sglang not installed")
    x = torch.randn(*shape, 128, device=device)
    packed, sf = common.quantize_fp4_indexer_ref(x)
    packed = packed.view(torch.int8).view(*shape, 64)
    sf = sf.view(*shape)
    return (packed, sf), _fp4_dequant_f64(packed, sf)


def _paged_f64(qf, keys, w, lens, table, L, next_n):  # noqa: ANN001, ANN202
    """Definition: row r = b*next_n + j sees keys k <= len_b - next_n + j (1D) or k < len[b, j] (2D)."""
    b = qf.shape[0]
    block = keys.shape[1]
    k_seq = keys[table.long().clamp_min(0)].reshape(b, -1, 128)[:, :L]  # [B, L', 128]
    s = torch.einsum("bnhd,bld->bnhl", qf, k_seq)
    absb = torch.einsum("bnhd,bld->bnhl", qf.abs(), k_seq.abs())
    w3 = w.double().view(b, next_n, -1)
    lg = torch.einsum("bnhl,bnh->bnl", s.relu(), w3)
    bound = torch.einsum("bnhl,bnh->bnl", absb, w3.abs())
    pos = torch.arange(lg.shape[-1], device=qf.device)
    if lens.dim() == 2:
        lim = lens.long()
    else:
        lim = lens.long()[:, None] - next_n + 1 + torch.arange(next_n, device=qf.device)[None, :]
    lim = lim.clamp(max=table.shape[1] * block)
    valid = pos[None, None, :] < lim[..., None]
    out = torch.full((b, next_n, L), float("-inf"), dtype=torch.float64, device=qf.device)
    out[..., : lg.shape[-1]] = lg.masked_fill(~valid, float("-inf"))
    bnd = torch.zeros(b, next_n, L, dtype=torch.float64, device=qf.device)
    bnd[..., : lg.shape[-1]] = bound
    return out.view(b * next_n, L), bnd.view(b * next_n, L)


def _assert_logits(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert not got.isnan().any(), "NaN in logits"
    assert torch.equal(got.isneginf(), ref.isneginf()), "visible-column mask differs"
    fin = ref.isfinite()
    err = (got.double()[fin] - ref[fin]).abs()
    assert (err <= 4e-5 * bound[fin] + 1e-6).all(), f"max err {err.max()}"


def _paged(path: str, *args):  # noqa: ANN002, ANN202
    return (ix.paged_mqa_logits_reference if path == "torch" else ix.paged_mqa_logits_triton)(*args)


def _flat(path: str, *args):  # noqa: ANN002, ANN202
    return (ix.mqa_logits_reference if path == "torch" else ix.mqa_logits_triton)(*args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("next_n,lens_2d", [(1, False), (2, False), (1, True), (3, True)])
def test_fp8_paged_logits(path: str, next_n: int, lens_2d: bool) -> None:
    b, h, block, pages, L = 3, 8, 16, 14, 90
    cache, keys = _fp8_cache(pages, block)
    qf = torch.randn(b, next_n, h, 128)
    q = qf.to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, h)
    table = torch.randperm(pages)[:12].view(b, 4).int()
    lens = torch.tensor([5, 64, 17]).int()
    if lens_2d:
        lens = torch.randint(0, 70, (b, next_n)).int()
        lens[0, 0] = 0  # a row that sees nothing
    got = _paged(path, q, cache, w, lens, table, L)
    ref, bound = _paged_f64(q.double(), keys, w, lens, table, L, next_n)
    _assert_logits(got, ref, bound)


@needs_sglang
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("q_fp4", [False, True])
def test_fp4_paged_logits(path: str, q_fp4: bool) -> None:
    b, h, pages, L = 2, 16, 6, 200
    cache, keys = _fp4_cache(pages)
    if q_fp4:
        q, qf = _fp4_query((b, 1, h))
    else:
        q8 = torch.randn(b, 1, h, 128).to(torch.float8_e4m3fn)
        q, qf = (q8, None), q8.double()
    w = torch.randn(b, h)
    table = torch.tensor([[3, 1, 5], [0, 2, 4]]).int()
    lens = torch.tensor([[130], [64]]).int()  # the 2D [rows, 1] form SGLang passes
    got = _paged(path, q, cache, w, lens, table, L)
    ref, bound = _paged_f64(qf, keys, w, lens, table, L, 1)
    _assert_logits(got, ref, bound)


@needs_sglang
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["fp8", "fp4"])
@pytest.mark.parametrize("max_seqlen_k", [0, 48])
def test_flat_logits(path: str, kind: str, max_seqlen_k: int) -> None:
    m, h, n = 6, 8, 90
    ks = torch.tensor([0, 3, 10, 50, 0, 89]).int()
    ke = torch.tensor([0, 40, 58, 90, 90, 90]).int()
    w = torch.randn(m, h)
    if kind == "fp8":
        q8 = torch.randn(m, h, 128).to(torch.float8_e4m3fn)
        q, qf = q8, q8.double()
        k = torch.randn(n, 128).to(torch.float8_e4m3fn)
        ksc = torch.rand(n) + 0.25
        kv, kf = (k, ksc), k.double() * ksc.double()[:, None]
    else:
        q, qf = _fp4_query((m, h))
        packed, sf = common.quantize_fp4_indexer_ref(torch.randn(n, 128) * 3)
        kv, kf = (packed.view(torch.int8), sf), _fp4_dequant_f64(packed, sf)
    got = _flat(path, q, kv, w, ks, ke, max_seqlen_k)
    s = torch.einsum("mhd,nd->mhn", qf, kf).relu()
    full = torch.einsum("mhn,mh->mn", s, w.double())
    absb = torch.einsum("mhn,mh->mn", torch.einsum("mhd,nd->mhn", qf.abs(), kf.abs()), w.double().abs())
    cols = max_seqlen_k or n
    key = (ks.long()[:, None] + torch.arange(cols)[None, :]) if max_seqlen_k else torch.arange(cols)[None, :].expand(m, -1)
    valid = (key >= ks.long()[:, None]) & (key < ke.long()[:, None]) & (key < n)
    ref = torch.gather(full, 1, key.clamp(max=n - 1)).masked_fill(~valid, float("-inf"))
    bound = torch.gather(absb, 1, key.clamp(max=n - 1))
    _assert_logits(got, ref, bound)


def test_matches_sglang_torch_fallback() -> None:
    """Same logits as SGLang's own torch fallback on the rows it defines (next_n 1, 64-token pages)."""
    sgl_ix = pytest.importorskip("sglang.srt.layers.attention.dsv4.indexer")
    b, h, pages, L = 3, 16, 8, 256
    cache, _ = _fp8_cache(pages, 64)
    q = torch.randn(b, 1, h, 128).to(torch.float8_e4m3fn)
    w = torch.randn(b, h)
    table = torch.randperm(pages)[:8].view(2, 4).repeat(2, 1)[:b].int()
    lens = torch.tensor([1, 200, 256]).int()
    theirs = sgl_ix.fp8_paged_mqa_logits_torch(q, cache, w, lens, table, None, L, clean_logits=False)
    ours = ix.paged_mqa_logits_reference(q, cache, w, lens, table, L)
    vis = torch.arange(L)[None, :] < lens[:, None]
    # theirs multiplies in bf16 (their matmul inputs) -> bf16-level agreement only
    torch.testing.assert_close(ours[vis], theirs[vis].float(), rtol=2e-2, atol=2e-2 * float(theirs.abs().max()))


@needs_sglang
def test_deep_gemm_shim_names() -> None:
    import deep_gemm

    b, h, pages, L = 2, 8, 6, 130
    cache, _ = _fp8_cache(pages, 64)
    q = torch.randn(b, 1, h, 128).to(torch.float8_e4m3fn)
    w = torch.randn(b, h)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]]).int()
    lens = torch.tensor([[100], [130]]).int()
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, deep_gemm.get_num_sms())
    assert meta.dtype == torch.int32 and meta.shape == (deep_gemm.get_num_sms() + 1, 2)
    got = deep_gemm.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, L, False)
    assert torch.equal(got, ix.paged_mqa_logits(q, cache, w, lens, table, L))
    c4, _ = _fp4_cache(pages)
    (qp, qs), _ = _fp4_query((b, 1, h))
    got4 = deep_gemm.fp8_fp4_paged_mqa_logits((qp, qs), c4, w, lens, table, meta, L, clean_logits=False,
                                              logits_dtype=torch.bfloat16)
    assert got4.dtype == torch.bfloat16
    k = torch.randn(20, 128).to(torch.float8_e4m3fn)
    flat = deep_gemm.fp8_mqa_logits(q[:, 0], (k, torch.ones(20)), w, torch.zeros(2).int(), torch.full((2,), 20).int(),
                                    clean_logits=False, max_seqlen_k=20)
    assert flat.shape == (2, 20) and flat.isfinite().all()
    assert isinstance(deep_gemm.get_num_sms(), int) and deep_gemm.get_num_sms() > 0


# ---------------------------------------------------------------------------- top-k transforms


def _rand_scores(rows: int, width: int, device: str = "cpu") -> torch.Tensor:
    return torch.randperm(rows * width, device=device).view(rows, width).float() / 7.0  # no ties


def test_topk_transform_paged_vs_sglang_torch() -> None:
    sgl_ix = pytest.importorskip("sglang.srt.layers.attention.dsv4.indexer")
    rows, width, k, ps = 5, 300, 32, 16
    scores = _rand_scores(rows, width)
    lens = torch.tensor([0, 5, 32, 33, 300]).int()
    table = torch.stack([torch.randperm(64)[:19] for _ in range(rows)]).int()
    ours, ours_raw = torch.full((rows, k), -7, dtype=torch.int32), torch.full((rows, k), -7, dtype=torch.int32)
    ix.topk_transform_paged(scores, lens, table, ours, ps, ours_raw)
    theirs, theirs_raw = torch.empty_like(ours), torch.empty_like(ours)
    sgl_ix.topk_transform_pytorch_vectorized(scores, lens, table, theirs, ps, theirs_raw)
    assert torch.equal(ours.sort(1).values, theirs.sort(1).values)
    assert torch.equal(ours_raw.sort(1).values, theirs_raw.sort(1).values)
    # definition: short rows list 0..len-1 in order; long rows the top-k of the visible prefix
    assert (ours[0] == -1).all() and torch.equal(ours_raw[1, :5], torch.arange(5, dtype=torch.int32))
    top = scores[4].topk(k).indices
    assert torch.equal(ours_raw[4].sort().values, top.sort().values.int())
    exp_pages = table[4].long()[top // ps] * ps + top % ps
    assert torch.equal(ours[4].sort().values, exp_pages.sort().values.int())


def test_topk_v2_and_ragged() -> None:
    rows, width, k = 4, 100, 16
    scores = _rand_scores(rows, width)
    lens = torch.tensor([3, 16, 40, 100]).int()
    plan = ix.plan_topk_v2(lens)
    assert plan.shape == (rows + 1, 2) and plan.dtype == torch.int32
    raw = torch.empty(rows, k, dtype=torch.int32)
    ix.topk_transform_paged_v2(scores, lens, None, raw, 64, plan)
    v1 = torch.empty_like(raw)
    ix.topk_transform_paged(scores, lens, torch.arange(2).repeat(rows, 1).int(), v1, 64)
    assert torch.equal(raw.sort(1).values, v1.sort(1).values)  # identity page table
    starts = torch.tensor([0, 10, 50, 0]).int()
    rl = torch.tensor([3, 16, 40, 100]).int().clamp(max=width - starts)
    out = torch.empty(rows, k, dtype=torch.int32)
    ix.topk_transform_ragged_v2(scores, rl, out_offsets=starts, out_indices=out, row_starts=starts)
    for r in range(rows):
        s, n = int(starts[r]), int(rl[r])
        exp = torch.arange(s, s + n) if n <= k else scores[r, s:s + n].topk(k).indices + s
        got = out[r][out[r] >= 0]
        assert torch.equal(got.sort().values, exp.sort().values.int())
        assert (out[r][got.numel():] == -1).all()


# ------------------------------------------------------- top-k kernel (Triton) vs its torch reference
#
# `topk_transform_rows` is the one transform behind every public one; `use_triton` picks the kernel or
# the torch reference. On a CPU-only machine the kernel runs under the interpreter (the `topk_kernel`
# fixture sets WINPORT_TRITON_ON_CPU=1, kernels_triton._dispatch's switch); tiles are made small so
# that the test sizes run every loop of the kernel several times (chunks of the full-row pass, blocks
# of the others, rows per program) and reach both outcomes of the pivot step. Outputs start as
# POISON, so an unwritten slot fails.

TOPK_DEV = "cuda" if torch.cuda.is_available() else "cpu"
POISON = -(2**30)  # no transform writes it: positions are >= -1, page ids and offsets are small here
_SMALL_TILES = {"chunk": 64, "compact": 32, "block": 32, "bits": 4, "groups_per_k": 2, "max_groups": 256,
                "cpu_programs": 2}
_TOPK_MODES = ("paged_raw", "paged", "raw", "ragged", "ragged_starts")


def _route_to_kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Send top-k transforms to the kernel (CPU tensors: interpreted) and count its launches."""
    if TOPK_DEV == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the kernel runs on CPU tensors only under TRITON_INTERPRET=1")
        monkeypatch.setenv("WINPORT_TRITON_ON_CPU", "1")
    calls: list[int] = []
    launch = ix.topk_transform_triton

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return launch(*args, **kwargs)

    monkeypatch.setattr(ix, "topk_transform_triton", counted)
    return calls


@pytest.fixture
def topk_kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The kernel at small tiles; returns the list of its launches."""
    calls = _route_to_kernel(monkeypatch)
    for name, value in _SMALL_TILES.items():
        monkeypatch.setitem(ix.TOPK_TUNING, name, value)
    return calls


@pytest.fixture
def topk_kernel_default(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The kernel at its shipped tiles (the ones a GPU runs)."""
    return _route_to_kernel(monkeypatch)


def _topk_scores(kind: str, rows: int, width: int) -> torch.Tensor:
    if kind == "distinct":  # no two equal
        return (torch.randperm(rows * width).view(rows, width).float() - rows * width / 2) / 8
    if kind == "ties":  # a dozen values, -0.0 and +0.0 among them
        return (torch.randn(rows, width) * 2).round()
    if kind == "equal":  # row 0 all equal; the others three values (two of them equal: -0.0, +0.0)
        s = torch.full((rows, width), 0.75)
        s[1:] = torch.tensor([0.0, -0.0, 2.5])[torch.randint(0, 3, (rows - 1, width))]
        return s
    assert kind == "special"  # -inf, +inf and NaN (both signs) among normal scores
    s = torch.randn(rows, width)
    s[torch.rand(rows, width) < 0.3] = float("-inf")
    s[torch.rand(rows, width) < 0.01] = float("inf")
    s[torch.rand(rows, width) < 0.01] = float("nan")
    s[torch.rand(rows, width) < 0.01] = -torch.tensor(float("nan"))  # sign bit set
    return s


def _topk_case(kind: str, rows: int, width: int, k: int, page_size: int = 16) -> dict:
    """Scores, lengths (random, with the edge lengths 0, k, k + 1, width, past width and negative
    mixed in), row starts (windows inside their rows but one), offsets and a page table of
    distinct pages covering every position a row can write."""
    edge = torch.tensor([0, k, k + 1, width, width + 37, -3])
    lens = torch.randint(0, width + 40, (rows,))
    pick = torch.rand(rows) < 0.5
    lens[pick] = edge[torch.randint(0, len(edge), (int(pick.sum()),))]
    n = lens.clamp(0, width)
    starts = (torch.rand(rows) * (width - n + 1)).long()
    starts[-1] = width - n[-1] // 2  # a window past its row's end (reads the last score again)
    cols = -(-max(width + 40, k) // page_size)
    table = torch.stack([torch.randperm(3 * cols)[:cols] for _ in range(rows)]).int()
    return {"scores": _topk_scores(kind, rows, width).to(TOPK_DEV), "lens": lens.int().to(TOPK_DEV),
            "starts": starts.int().to(TOPK_DEV), "offsets": torch.randint(0, 1000, (rows,)).to(TOPK_DEV),
            "table": table.to(TOPK_DEV), "page_size": page_size}


def _pages_of(pos: torch.Tensor, table: torch.Tensor, page_size: int) -> torch.Tensor:
    t = table.long().cpu()
    p = pos.clamp(min=0)
    return torch.where(pos >= 0, t.gather(1, p // page_size) * page_size + p % page_size, -1)


def _positions_of(out: torch.Tensor, table: torch.Tensor, page_size: int) -> torch.Tensor:
    """Invert _pages_of for a table whose rows hold distinct pages."""
    t = table.long().cpu()
    inv = torch.full((t.shape[0], int(t.max()) + 1), -1, dtype=torch.long)
    inv.scatter_(1, t, torch.arange(t.shape[1]).expand_as(t).contiguous())
    o = out.clamp(min=0)
    col = inv.gather(1, o // page_size)
    assert bool((col[out >= 0] >= 0).all()), "a page index outside the table"
    return torch.where(out >= 0, col * page_size + o % page_size, -1)


def _topk_run(mode: str, case: dict, k: int, use_triton: bool, neg_inf_pad: bool) -> torch.Tensor:
    """One transform through topk_transform_rows: the window positions it picked ([rows, k], CPU),
    after checking that it wrote every slot and mapped each position as its mode says."""
    lens = case["lens"]
    out = torch.full((lens.shape[0], k), POISON, dtype=torch.int32, device=lens.device)
    raw = torch.full_like(out, POISON) if mode == "paged_raw" else None
    kw: dict = {}
    if mode.startswith("paged"):
        kw = {"page_table": case["table"], "page_size": case["page_size"], "out_raw": raw}
    elif mode.startswith("ragged"):
        kw = {"offsets": case["offsets"], "row_starts": case["starts"] if mode == "ragged_starts" else None}
    ix.topk_transform_rows(case["scores"], lens, out, neg_inf_pad=neg_inf_pad, use_triton=use_triton, **kw)
    assert not bool((out == POISON).any()), "a slot was left unwritten"
    got = out.long().cpu()
    if mode == "paged_raw":
        assert not bool((raw == POISON).any()), "a raw slot was left unwritten"
        pos = raw.long().cpu()
        assert torch.equal(got, _pages_of(pos, case["table"], case["page_size"])), "page mapping"
        return pos
    if mode == "paged":
        return _positions_of(got, case["table"], case["page_size"])
    if mode == "raw":
        return got
    return torch.where(got >= 0, got - case["offsets"].long().cpu()[:, None], -1)


def _window_keys(scores: torch.Tensor, r: int, n: int, start: int) -> torch.Tensor:
    """Order keys of row r's window positions 0..n-1 (a position past the row reads its last score)."""
    width = scores.shape[1]
    idx = (torch.arange(n) + start).clamp(0, max(width - 1, 0))
    return ix.topk_order_key(scores[r].cpu()[idx])


def _assert_topk_same(case: dict, k: int, got: torch.Tensor, ref: torch.Tensor, use_starts: bool,
                      exact: bool) -> None:
    """Kernel picks `got` and reference picks `ref` agree: short rows exactly (0..len-1, then -1);
    long rows as sets of positions (exact) or as multisets of picked scores (ties), with distinct
    picks inside the window and as many -1 as the reference."""
    scores, lens = case["scores"], case["lens"]
    width = scores.shape[1]
    for r in range(lens.shape[0]):
        length = int(lens[r])
        g, e = got[r], ref[r]
        if length <= k:
            assert torch.equal(g, e), f"row {r} (len {length} <= k): {g.tolist()} != {e.tolist()}"
            continue
        n = min(length, width)
        gs, es = g[g >= 0], e[e >= 0]
        assert gs.numel() == es.numel(), f"row {r}: {gs.numel()} picks, the reference {es.numel()}"
        assert gs.unique().numel() == gs.numel(), f"row {r}: a position picked twice"
        assert bool(((gs >= 0) & (gs < n)).all()), f"row {r}: a pick outside the window"
        if exact:
            assert torch.equal(gs.sort().values, es.sort().values), f"row {r}: other positions picked"
        else:
            keys = _window_keys(scores, r, n, int(case["starts"][r]) if use_starts else 0)
            assert torch.equal(keys[gs].sort().values, keys[es].sort().values), f"row {r}: other scores picked"


@pytest.mark.parametrize("kind", ["distinct", "ties", "equal", "special"])
@pytest.mark.parametrize("mode", _TOPK_MODES)
def test_topk_kernel_vs_reference(topk_kernel: list[int], mode: str, kind: str) -> None:
    """Random rows (1-5 rows, widths up to 3000, k 16-512): the kernel picks what the reference picks,
    with and without neg_inf_pad; distinct scores: the same positions; ties: the same scores."""
    for trial in range(2):
        rows = int(torch.randint(1, 6, ()))
        width = int(torch.randint(2, 3000, ()))
        k = (16, 33, 64, 200, 512)[int(torch.randint(0, 5, ()))]
        case = _topk_case(kind, rows, width, k)
        got = _topk_run(mode, case, k, True, neg_inf_pad=trial == 1)
        ref = _topk_run(mode, case, k, False, neg_inf_pad=trial == 1)
        _assert_topk_same(case, k, got, ref, mode == "ragged_starts",
                          exact=kind == "distinct" and mode != "ragged_starts")
    assert topk_kernel, "the kernel did not run"


@pytest.mark.parametrize("neg_inf_pad", [False, True])
def test_topk_kernel_edge_rows(topk_kernel: list[int], neg_inf_pad: bool) -> None:
    """Lengths 0, 1, k - 1, k (all in order), k + 1 (the smallest selecting row), width, past width,
    negative; a row narrower than k; against explicit expectations, not only the reference."""
    for width, k in ((100, 16), (10, 16)):
        lens = [0, 1, k - 1, k, k + 1, width, width + 30, -4, width // 2 + k]
        case = _topk_case("distinct", len(lens), width, k)
        case["lens"] = torch.tensor(lens, dtype=torch.int32, device=TOPK_DEV)
        pos = _topk_run("paged_raw", case, k, True, neg_inf_pad)
        for r, length in enumerate(lens):
            if length <= k:
                exp = [j if j < length else -1 for j in range(k)]
                assert pos[r].tolist() == exp, f"row {r} (len {length})"
                continue
            n = min(length, width)
            top = case["scores"][r, :n].cpu().topk(min(k, n)).indices
            picks = pos[r][pos[r] >= 0]
            assert torch.equal(picks.sort().values, top.sort().values), f"row {r} (len {length})"
            assert picks.numel() == min(k, n) and bool((pos[r][picks.numel():] == -1).all())
    assert topk_kernel


def test_topk_kernel_pivot_paths(topk_kernel: list[int]) -> None:
    """Rows built for each outcome of the pivot step (the kth largest group maximum, groups of GS):
    one high score per group (k - 1 candidates above the pivot: the pivot's ties fill up), the top
    scores packed into a few groups (many candidates: a second radix select), every group maximum
    equal (more than k ties of the pivot, none above), ties of the k-th score straddling the pivot,
    fewer groups than k (no pivot: every score is a candidate); and a row of zeros of both signs."""
    width, k = 2048, 32
    gs = ix._topk_group_size(width, k)
    assert gs == 32 and width // gs >= 2 * k  # the rows below are built for these groups
    groups = width // gs
    s = torch.rand(6, width)
    s[0].view(groups, gs)[torch.arange(groups), torch.randint(0, gs, (groups,))] = 100 + torch.randperm(groups).float()
    s[1, : 4 * gs] += 100  # 128 top scores in 4 groups
    s[2] = 0.0
    s[2].view(groups, gs)[torch.arange(groups), torch.randint(0, gs, (groups,))] = 5.0
    s[3] = (s[3] * 8).floor()  # 8 values: the k-th ties with many, in many groups
    s[4, 100:110] = 7.0  # fewer groups than k: its length is 200 (7 groups)
    s[5].view(groups, gs)[:, 0] = 50.0  # every group's maximum 50, a few above it
    s[5, [7, 300, 301, 1500]] = 60.0
    case = _topk_case("distinct", 6, width, k)
    case["scores"] = s.to(TOPK_DEV)
    case["lens"] = torch.tensor([width, width, width, width, 200, width], dtype=torch.int32, device=TOPK_DEV)
    got = _topk_run("raw", case, k, True, False)
    ref = _topk_run("raw", case, k, False, False)
    _assert_topk_same(case, k, got, ref, False, exact=False)
    _assert_topk_same({**case, "lens": case["lens"][:2]}, k, got[:2], ref[:2], False, exact=True)
    assert set(range(100, 110)) <= set(got[4].tolist())
    assert {7, 300, 301, 1500} <= set(got[5].tolist())
    # Zeros of both signs tie: no group maximum may read as below +0.0, whichever zero a max returns
    # (the interpreter's returns this -0.0). Alone in its launch: candidates overflowing the workspace
    # would read past the tensor, which the interpreter's bounds check (conftest) reports.
    zeros = torch.zeros(1, width)
    zeros.view(groups, gs)[:, -1] = -0.0
    case = {**case, "scores": zeros.to(TOPK_DEV), "lens": case["lens"][:1]}
    got, ref = _topk_run("raw", case, k, True, False), _topk_run("raw", case, k, False, False)
    _assert_topk_same(case, k, got, ref, False, exact=False)
    assert topk_kernel


@pytest.mark.parametrize("path", PATHS)
def test_topk_nan_and_neg_inf(topk_kernel: list[int], path: str) -> None:
    """Defined semantics, kernel and torch alike: NaN (either sign) ranks above every number, +inf
    included, so a window's NaNs are always picked. -inf ranks below every number: the sgl_kernel
    ops pick it like any score when too few others are left; with neg_inf_pad (SGLang's dsv4.topk
    functions) such a pick is written as -1."""
    k, width = 8, 50
    s = torch.randn(3, width)
    s[0, [3, 17, 40]] = float("nan")
    s[0, 5] = -torch.tensor(float("nan"))
    s[1] = float("-inf")
    s[1, [2, 9, 30, 44, 47]] = torch.randn(5)
    s[2, 10] = float("inf")
    s[2, 11] = float("nan")
    s[2, 12] = float("-inf")
    case = _topk_case("distinct", 3, width, k)
    case["scores"] = s.to(TOPK_DEV)
    case["lens"] = torch.full((3,), width, dtype=torch.int32, device=TOPK_DEV)
    for neg_inf_pad in (False, True):
        pos = _topk_run("raw", case, k, path == "triton", neg_inf_pad)
        picks = [set(p for p in row if p >= 0) for row in pos.tolist()]
        finite = s[0].clone()
        finite[[3, 5, 17, 40]] = float("-inf")
        assert picks[0] == {3, 5, 17, 40} | set(finite.topk(4).indices.tolist())
        if neg_inf_pad:
            assert picks[1] == {2, 9, 30, 44, 47} and pos[1].tolist().count(-1) == 3
        else:
            assert {2, 9, 30, 44, 47} < picks[1] and len(picks[1]) == k
        assert {10, 11} <= picks[2] and 12 not in picks[2]
    assert topk_kernel or path == "torch"


def test_topk_public_functions_use_the_kernel(topk_kernel: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's dsv4.topk functions here and the torch.ops.sgl_kernel ones (shims/sgl_kernel/dsv4_xpu.py)
    launch the kernel, and write what the torch path writes (distinct scores: the same sets)."""
    from shims.sgl_kernel import dsv4_xpu  # noqa: F401  (registers torch.ops.sgl_kernel.topk_transform*)

    rows, width, k, ps = 4, 700, 32, 16
    case = _topk_case("distinct", rows, width, k, ps)
    sc, table, off, starts = case["scores"], case["table"], case["offsets"], case["starts"]
    lens = torch.tensor([5, 32, 33, 700], dtype=torch.int32, device=TOPK_DEV)
    ragged_lens = torch.minimum(lens, width - starts)
    ops = torch.ops.sgl_kernel
    calls = {
        "topk_transform_paged": lambda o, w: ix.topk_transform_paged(sc, lens, table, o, ps, w),
        "topk_transform_paged_v2": lambda o, w: ix.topk_transform_paged_v2(sc, lens, table, o, ps, None, w),
        "topk_transform_paged_v2[raw]": lambda o, w: ix.topk_transform_paged_v2(sc, lens, None, o, ps, None),
        "topk_transform_ragged_v2": lambda o, w: ix.topk_transform_ragged_v2(
            sc, ragged_lens, out_offsets=off, out_indices=o, row_starts=starts),
        "sgl_kernel.topk_transform": lambda o, w: ops.topk_transform(sc, lens, table, o, ps, w),
        "sgl_kernel.topk_transform_paged": lambda o, w: ops.topk_transform_paged(sc, lens, table, o, ps, None),
        "sgl_kernel.topk_transform_ragged": lambda o, w: ops.topk_transform_ragged(sc, ragged_lens, o, off, starts),
    }
    for name, call in calls.items():
        outs = []
        for route in ("kernel", "torch"):
            before = len(topk_kernel)
            with monkeypatch.context() as m:
                if route == "torch":
                    m.setattr(ix._dispatch, "use_triton", lambda *tensors: False)
                o = torch.full((rows, k), POISON, dtype=torch.int32, device=TOPK_DEV)
                w = torch.full_like(o, POISON)
                call(o, w)
            assert (len(topk_kernel) > before) == (route == "kernel"), f"{name}: {route} route not taken"
            assert not bool((o == POISON).any()), f"{name}: a slot left unwritten"
            outs.append((o.cpu().sort(1).values, w.cpu().sort(1).values))
        assert torch.equal(outs[0][0], outs[1][0]), name
        assert torch.equal(outs[0][1], outs[1][1]), f"{name}: raw indices"


def _topk_at_scale(rows: int, width: int, k: int, page_size: int = 64) -> None:
    """The kernel (as the caller's routing sends it) against the torch reference at decode sizes:
    SGLang's paged transform with raw indices, lengths from k + 1 to width plus a short row, random
    scores (compared as picked scores: randn can repeat a value), and replayed in a CUDA graph on GPU."""
    dev = TOPK_DEV
    g = torch.Generator().manual_seed(1000 * rows + k)
    scores = torch.randn(rows, width, generator=g).to(dev)
    lens = torch.randint(k + 1, width + 1, (rows,), generator=g)
    lens[0] = width
    if rows > 1:
        lens[-1] = k // 2
    pages = -(-width // page_size)
    table = torch.stack([torch.randperm(4 * pages, generator=g)[:pages] for _ in range(rows)]).int()
    case = {"scores": scores, "lens": lens.int().to(dev), "table": table.to(dev), "page_size": page_size,
            "starts": None, "offsets": None}
    out = torch.full((rows, k), POISON, dtype=torch.int32, device=dev)
    raw = torch.full_like(out, POISON)
    ix.topk_transform_paged(scores, case["lens"], case["table"], out, page_size, raw)
    assert not bool((out == POISON).any()) and not bool((raw == POISON).any()), "a slot left unwritten"
    got = raw.long().cpu()
    assert torch.equal(out.long().cpu(), _pages_of(got, table, page_size))
    ref = _topk_run("paged_raw", case, k, False, neg_inf_pad=True)
    _assert_topk_same(case, k, got, ref, False, exact=False)
    if dev == "cuda":  # capture and replay with new scores: the launch reads nothing on the host
        graph = torch.cuda.CUDAGraph()
        ix.topk_transform_paged(scores, case["lens"], case["table"], out, page_size, raw)  # warm-up
        with torch.cuda.graph(graph):
            ix.topk_transform_paged(scores, case["lens"], case["table"], out, page_size, raw)
        scores.copy_(torch.randn(rows, width, generator=g).to(dev))
        out.fill_(POISON)
        raw.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        ref = _topk_run("paged_raw", case, k, False, neg_inf_pad=True)
        _assert_topk_same(case, k, raw.long().cpu(), ref, False, exact=False)
        assert torch.equal(out.long().cpu(), _pages_of(raw.long().cpu(), table, page_size))


@pytest.mark.parametrize("k", [512, 1024])
def test_topk_kernel_at_reduced_scale(topk_kernel_default: list[int], k: int) -> None:
    """The GPU test's body at 2 rows of 65536 scores with the shipped tiles (interpreted on CPU)."""
    _topk_at_scale(2, 65536, k)
    assert topk_kernel_default


# ------------------------------------------------------------------- GPU at V4.1-Flash sizes


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fp8", "fp4"])
def test_gpu_paged_logits_v41_flash(kind: str) -> None:
    dev, b, h, L = "cuda", 4, 32, 16384  # 32 indexer heads, 64K context / c4 = 16K positions
    pages = L // 64 * b
    if kind == "fp8":
        cache, keys = _fp8_cache(pages, 64, dev)
        q8 = torch.randn(b, 1, h, 128, device=dev).to(torch.float8_e4m3fn)
        q, qf = q8, q8.double()
    else:
        cache, keys = _fp4_cache(pages, dev)
        q, qf = _fp4_query((b, 1, h), dev)
    w = torch.randn(b, h, device=dev)
    table = torch.randperm(pages, device=dev).view(b, -1).int()
    lens = torch.randint(1, L + 1, (b, 1), device=dev).int()
    got = ix.paged_mqa_logits_triton(q, cache, w, lens, table, L)
    ref, bound = _paged_f64(qf, keys, w, lens, table, L, 1)
    _assert_logits(got, ref, bound)


@pytest.mark.gpu
def test_gpu_topk_transform() -> None:
    sgl_ix = pytest.importorskip("sglang.srt.layers.attention.dsv4.indexer")
    rows, width, k = 8, 16384, 512
    scores = _rand_scores(rows, width, "cuda")
    lens = torch.randint(0, width + 1, (rows,), device="cuda").int()
    table = torch.randint(0, 10000, (rows, width // 64), device="cuda").int()
    ours, theirs = (torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in range(2))
    ix.topk_transform_paged(scores, lens, table, ours, 64)
    sgl_ix.topk_transform_pytorch_vectorized(scores, lens, table, theirs, 64)
    assert torch.equal(ours.sort(1).values, theirs.sort(1).values)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("rows", [1, 4, 64])
def test_gpu_topk_kernel_at_scale(rows: int, k: int) -> None:
    """The kernel at decode sizes (65536 scores, 64-token pages) vs the torch reference, eager and in a
    CUDA graph (the body of test_topk_kernel_at_reduced_scale)."""
    _topk_at_scale(rows, 65536, k)
