"""Tests of the DeepSeek-V4.1 additions to shims/sgl_kernel/dsv4_xpu.py (cache stores of ratio-1/2 latents).

Reference: an independent byte decoder of the V4 cache page (per token 448 e4m3 + 64 bf16 at
slot * 576, then 8 UE8M0 scale bytes per token after the page's data) and of the FP8 indexer page
(128 e4m3 at slot * 128, one fp32 scale after the data), with the scales and the quantization error
bounds derived in float64 from the definitions. Caches are poisoned; bytes outside the written slots
must stay untouched.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels_triton import dsv4_xpu_ops as XO
from shims.sgl_kernel import dsv4_xpu as X

PAGE = 256
POISON = 0xA5


def _v4_page_bytes(page_size: int) -> int:
    # 584 bytes per token, padded up to a multiple of 576 (FlashMLA's row stride)
    raw = page_size * 584
    return -(-raw // 576) * 576


def _decode_v4(cache: torch.Tensor, loc: int, page_size: int = PAGE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nope float64 [448], rope float64 [64], scale exponents int [7]) of the token at cache slot loc."""
    page, slot = divmod(loc, page_size)
    row = cache[page]
    data = row[slot * 576: slot * 576 + 576]
    nope = data[:448].view(torch.float8_e4m3fn).double()
    rope = data[448:576].view(torch.bfloat16).double()
    exps = row[page_size * 576 + slot * 8: page_size * 576 + slot * 8 + 7].to(torch.int64)
    scale = torch.pow(2.0, (exps - 127).double())
    return nope * scale.repeat_interleave(64), rope, exps


def _expected_exponent(tile: torch.Tensor) -> int:
    """UE8M0 exponent (biased) of the tile scale 2^ceil(log2(max(amax, 1e-4) / 448)), in float64."""
    amax = max(float(tile.abs().max()), 1e-4)
    return math.ceil(math.log2(amax / 448.0)) + 127


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_store_cache_v4_roundtrip(dtype: torch.dtype) -> None:
    n, pages = 37, 3
    # Magnitudes spread over 2^-12 .. 2^6 per tile, one all-tiny row (scale floor 1e-4 / 448).
    x = torch.randn(n, 512, dtype=torch.float64) * torch.exp2(torch.randint(-12, 7, (n, 8)).double()).repeat_interleave(64, 1)
    x[5] = 1e-7
    x = x.to(dtype)
    cache = torch.full((pages, _v4_page_bytes(PAGE)), POISON, dtype=torch.uint8)
    loc = torch.randperm(pages * PAGE)[:n]
    before = cache.clone()
    X.fused_store_cache_v4(x, cache, loc, PAGE)
    xd = x.double()
    for i in range(n):
        nope, rope, exps = _decode_v4(cache, int(loc[i]))
        want_e = torch.tensor([_expected_exponent(xd[i, 64 * t: 64 * t + 64]) for t in range(7)])
        assert torch.equal(exps, want_e), f"row {i}: scale exponents {exps.tolist()} != {want_e.tolist()}"
        # e4m3 keeps 3 mantissa bits: |q - x| <= 2^-4 |x| for normal values, and 2^-10 * scale absolute
        # below the normal range (subnormal spacing 2^-9 of the scale, halved by rounding).
        scale = torch.pow(2.0, (exps - 127).double()).repeat_interleave(64)
        err = (nope - xd[i, :448]).abs()
        bound = 2.0 ** -4 * xd[i, :448].abs() + 2.0 ** -10 * scale
        assert not torch.isnan(nope).any()
        assert (err <= bound).all(), f"row {i}: max excess {(err - bound).max().item()}"
        # the rope dims are stored as bf16: exact for bf16 input, round-to-nearest for fp32
        assert torch.equal(rope, xd[i, 448:].to(torch.bfloat16).double())
    # nothing else was written
    written = torch.zeros_like(cache, dtype=torch.bool)
    for i in range(n):
        page, slot = divmod(int(loc[i]), PAGE)
        written[page, slot * 576: slot * 576 + 576] = True
        written[page, PAGE * 576 + slot * 8: PAGE * 576 + slot * 8 + 7] = True
    assert torch.equal(cache[~written], before[~written])


def test_fused_store_cache_v4_rejects_bad_shapes() -> None:
    cache = torch.zeros(1, _v4_page_bytes(PAGE), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\[N, 512\]"):
        X.fused_store_cache_v4(torch.zeros(2, 448), cache, torch.zeros(2, dtype=torch.int64), PAGE)
    with pytest.raises(ValueError, match="indices for"):
        X.fused_store_cache_v4(torch.zeros(2, 512), cache, torch.zeros(3, dtype=torch.int64), PAGE)
    with pytest.raises(ValueError, match="stride"):
        X.fused_store_cache_v4(torch.zeros(2, 512), torch.zeros(1, 100, dtype=torch.uint8),
                               torch.zeros(2, dtype=torch.int64), PAGE)


def test_fused_store_cache_indexer_roundtrip() -> None:
    n, page_size, pages = 19, 64, 2
    x = torch.randn(n, 128, dtype=torch.float64) * torch.exp2(torch.randint(-8, 5, (n, 1)).double())
    cache = torch.full((pages, page_size * 132), POISON, dtype=torch.uint8)
    loc = torch.randperm(pages * page_size)[:n]
    X.fused_store_cache_indexer(x.to(torch.bfloat16), cache, loc, page_size)
    xb = x.to(torch.bfloat16).double()
    for i in range(n):
        page, slot = divmod(int(loc[i]), page_size)
        q = cache[page, slot * 128: slot * 128 + 128].view(torch.float8_e4m3fn).double()
        scale = float(cache[page, page_size * 128 + slot * 4: page_size * 128 + slot * 4 + 4].view(torch.float32))
        want = max(float(xb[i].abs().max()), 1e-4) / 448.0
        assert scale == pytest.approx(want, rel=1e-6)
        err = (q * scale - xb[i]).abs()
        assert (err <= 2.0 ** -4 * xb[i].abs() + 2.0 ** -10 * scale).all()


def test_v4_store_matches_the_compress_store_on_normalized_rows() -> None:
    # Cross-check with the existing V4 compress store: for rows that are already normalized and
    # carry no rope (identity frequencies), both must write the same bytes, except that the compress
    # store rounds the nope dims to bf16 first, so feed bf16-exact rows.
    n = 8
    x = torch.randn(n, 512).to(torch.bfloat16).float()
    a = torch.full((1, _v4_page_bytes(PAGE)), POISON, dtype=torch.uint8)
    b = a.clone()
    loc = torch.arange(n) * 3
    X.fused_store_cache_v4(x, a, loc, PAGE)
    identity = torch.zeros(n, 64)
    identity[:, 0::2] = 1.0  # (cos, sin) = (1, 0)
    XO._store_v4(b, loc, PAGE, x, identity, round_nope_bf16=True)
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------
# FP4 index-K store (V4.1 ratio-1/2 index keys)
# ------------------------------------------------------------------------------------------------
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _decode_index_k(cache: torch.Tensor, loc: int, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [128], biased exponents [4]) of the index key at slot loc."""
    page, slot = divmod(loc, page_size)
    payload = cache[page, slot * 64: slot * 64 + 64].to(torch.int64)
    codes = torch.stack([payload & 0xF, payload >> 4], dim=-1).flatten()
    mag = E2M1[codes & 7] * torch.where(codes & 8 != 0, -1.0, 1.0).double()
    exps = cache[page, page_size * 64 + slot * 4: page_size * 64 + slot * 4 + 4].to(torch.int64)
    return mag * torch.pow(2.0, (exps - 127).double()).repeat_interleave(32), exps


@pytest.mark.parametrize("rne", [False, True])
def test_store_fp4_index_k_cache_vs_definition(rne: bool) -> None:
    n, page_size, pages = 41, 64, 2
    x = torch.randn(n, 128, dtype=torch.float64) * torch.exp2(torch.randint(-10, 6, (n, 4)).double()).repeat_interleave(32, 1)
    x[3] = 0.0  # scale floor 1e-4
    # exact ties on the e2m1 grid after scaling (block amax 6 -> scale 1): 0.25, 0.75, 2.5, 5.0
    x[7, :32] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4, dtype=torch.float64)
    xb = x.to(torch.bfloat16)
    cache = torch.full((pages, page_size * 68), POISON, dtype=torch.uint8)
    loc = torch.randperm(pages * page_size)[:n]
    X.store_fp4_index_k_cache(xb, cache, loc, page_size, rne)
    xd = xb.double()
    for i in range(n):
        got, exps = _decode_index_k(cache, int(loc[i]), page_size)
        for g in range(4):
            block = xd[i, 32 * g: 32 * g + 32]
            want_e = min(max(math.ceil(math.log2(max(float(block.abs().max()) / 6.0, 1e-4))) + 127, 1), 254)
            assert int(exps[g]) == want_e, f"row {i} group {g}"
            scale = 2.0 ** (want_e - 127)
            y = (block / scale).clamp(-6, 6)
            d = (y.abs().unsqueeze(-1) - E2M1).abs()
            best = d.min(-1).values
            chosen = (got[32 * g: 32 * g + 32].abs() / scale)
            # the chosen magnitude is a nearest grid point
            assert torch.allclose((y.abs() - chosen).abs(), best, atol=0, rtol=0), f"row {i} group {g}"
            assert ((got[32 * g: 32 * g + 32] == 0) | (torch.sign(got[32 * g: 32 * g + 32]) == torch.sign(y))).all()
    ties = _decode_index_k(cache, int(loc[7]), page_size)[0][1:8]
    # 0.25 -> 0 either way; 0.75 -> 0.5 (down) or 1.0 (even); 1.25 -> 1.0 both; 1.75 -> 1.5 / 2.0;
    # 2.5 -> 2.0 both; 3.5 -> 3.0 / 4.0; 5.0 -> 4.0 both
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0] if rne else [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert ties.tolist() == want


@pytest.mark.parametrize("rne", [False, True])
def test_store_fp4_index_k_cache_bytes_match_sglang_triton(rne: bool) -> None:
    # The upstream kernel this replaces, run in Triton's interpreter: the same bytes everywhere.
    from sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache import store_fp4_index_k_cache as upstream

    n, page_size = 9, 64
    x = (torch.randn(n, 128) * 3).to(torch.bfloat16)
    loc = torch.randperm(2 * page_size)[:n]
    a = torch.full((2, page_size * 68), POISON, dtype=torch.uint8)
    b = a.clone()
    X.store_fp4_index_k_cache(x, a, loc, page_size, rne)
    upstream(x, b, loc, page_size=page_size, rne=rne)
    assert torch.equal(a, b)
