"""Indexer logits (DeepGEMM fp8/fp8_fp4 [paged] MQA logits) and the top-k transforms.

References: float64 logits written from DeepGEMM's documented definition
(sum_h w_h * relu(q_h . k) over dequantized operands, masks per row) in this file; FP4 caches and
queries produced by SGLang's own quantizer/writer (`quantize_fp4_indexer_ref`,
`store_fp4_index_cache_ref`, sglang/test/kernels/deepseek_v4/common.py); SGLang's torch fallbacks
`fp8_paged_mqa_logits_torch` and `topk_transform_pytorch_vectorized` (imported, not copied).

Tolerance: every operand is exact in bf16/fp32 after dequantization (e4m3, e2m1 x 2**k), so the
only error is fp32 accumulation over D = 128 products and H heads: |err| <= (D + H) * 2**-24 *
sum_h |w_h| sum_d |q_d k_d| * scale. We use 4e-5 x that absolute sum (about 2x margin) + 1e-6.
"""

from __future__ import annotations

import pytest
import torch

from kernels_triton import indexer as ix
from tests.ops.conftest import PATHS

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
