"""DeepSeek-V4 FP8 K cache (V4 layout, 584 B/token): quantize + store + gather vs independent references.

References: a float64 quantizer written from the layout's definition (this file), SGLang's own
byte writer `set_k_and_s_torch` and reader `dequantize_k_cache_paged_ref` (shipped in
sglang/test/kernels/deepseek_v4/k_cache_reference.py, imported, not copied).
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels_triton import dsv4_kv_layout as kvl
from tests.ops._helpers import PATHS

try:  # SGLang's shipped writer/reader; the GPU machine may not have sglang installed
    from sglang.kernels.ops.kvcache.dsv4_main_kv_store import NopeFp8RopeBf16Pack
    from sglang.test.kernels.deepseek_v4 import k_cache_reference as sgl_ref
except ImportError:  # pragma: no cover
    sgl_ref = NopeFp8RopeBf16Pack = None
needs_sglang = pytest.mark.skipif(sgl_ref is None, reason="sglang not installed")


def _k_rows(n: int, device: str = "cpu") -> torch.Tensor:
    # Per-row and per-tile magnitudes spread over many binades, so scales differ between tiles.
    k = torch.randn(n, 512, device=device) * torch.exp2(torch.randint(-12, 12, (n, 1), device=device).float())
    k[:, :448] *= torch.exp2(torch.randint(-3, 4, (n, 7), device=device).float()).repeat_interleave(64, 1)
    # tiny values next to a tile's max round to +-0: the sign of zero must match torch (0x80 for -0.0)
    k[:, 5] = k[:, 0].abs() * 1e-6
    k[:, 6] = -k[:, 0].abs() * 1e-6
    return k.bfloat16()


def _quantize_f64(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the definition: scale 2**ceil(log2(max(amax, 1e-8) / 448)) per 64, e4m3 RNE, bf16 rope."""
    x = k.double().cpu()
    tiles = x[:, :448].reshape(-1, 7, 64)
    amax = tiles.abs().amax(-1).clamp_min(1e-8)
    exp = torch.tensor([[math.ceil(math.log2(a / 448.0)) for a in row] for row in amax.tolist()], dtype=torch.float64)
    q = (tiles / torch.exp2(exp)[..., None]).clamp(-448, 448).reshape(-1, 448)
    return q.to(torch.float8_e4m3fn), x[:, 448:].to(torch.bfloat16), (exp + 127).to(torch.uint8)


def _store(path: str, k: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor, page_size: int) -> None:
    fn = kvl.store_k_v4_reference if path == "torch" else kvl.store_k_v4_triton
    fn(k, cache, loc, page_size)


@needs_sglang
def test_layout_constants_match_sglang() -> None:
    from sglang.kernels.ops.attention.dsv4 import dequant_k_cache as sgl
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    assert (kvl.DIM_NOPE, kvl.DIM_ROPE, kvl.TILE_SIZE, kvl.DATA_BYTES) == (
        sgl.DIM_NOPE, sgl.DIM_ROPE, sgl.TILE_SIZE, sgl.NOPE_ROPE_BYTES)
    assert kvl.BYTES_PER_TOKEN == KVLayout.V4.bytes_per_token == 584
    for p in (1, 16, 64, 256):
        assert kvl.page_bytes(p) == KVLayout.V4.page_bytes(p)


def test_quantize_matches_definition() -> None:
    k = _k_rows(64)
    nope, rope, scale = kvl.quantize_k_v4_reference(k)
    e_nope, e_rope, e_scale = _quantize_f64(k)
    assert torch.equal(scale, e_scale)
    assert torch.equal(nope.view(torch.uint8), e_nope.view(torch.uint8))
    assert torch.equal(rope, e_rope)


@needs_sglang
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("page_size", [16, 64])
def test_store_bytes_match_sglang_writer(path: str, page_size: int) -> None:
    """Our store writes exactly the bytes SGLang's reference writer puts for the same pack."""
    n, pages = 40, 5
    k = _k_rows(n)
    loc = torch.randperm(pages * page_size)[:n]
    nope, rope, scale = _quantize_f64(k)
    expected = torch.zeros(pages, kvl.page_bytes(page_size), dtype=torch.uint8)
    sgl_ref.set_k_and_s_torch(expected, loc, NopeFp8RopeBf16Pack(nope, rope.contiguous(), scale.contiguous()),
                              page_size)
    cache = torch.full((pages, kvl.page_bytes(page_size)), 0xAB, dtype=torch.uint8)
    untouched = cache.clone()
    _store(path, k, kvl.paged_view(cache, page_size), loc, page_size)
    written = torch.zeros_like(cache, dtype=torch.bool)
    pages_i, slots = loc // page_size, loc % page_size
    for p, s in zip(pages_i.tolist(), slots.tolist(), strict=True):
        written[p, s * 576:(s + 1) * 576] = True
        written[p, page_size * 576 + s * 8: page_size * 576 + s * 8 + 7] = True  # pad byte: unspecified
    assert torch.equal(cache[written], expected[written])
    pad = torch.zeros_like(written)
    for p, s in zip(pages_i.tolist(), slots.tolist(), strict=True):
        pad[p, page_size * 576 + s * 8 + 7] = True
    assert torch.equal(cache[~written & ~pad], untouched[~written & ~pad]), "wrote outside the stored tokens"


@needs_sglang
@pytest.mark.parametrize("path", PATHS)
def test_gather_matches_sglang_reader(path: str) -> None:
    page_size, pages, n = 32, 4, 100
    cache = torch.zeros(pages, kvl.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(pages * page_size)[:n]
    kvl.store_k_v4_reference(_k_rows(n), cache, loc, page_size)
    ids = loc[torch.randint(0, n, (77,))]
    expected = sgl_ref.dequantize_k_cache_paged_ref(cache, ids, page_size)[:, 0]
    if path == "torch":
        got = kvl.gather_k_v4_reference(cache, ids, page_size, torch.bfloat16)
    else:
        out = torch.full((77, 512), float("nan"), dtype=torch.bfloat16)
        got = kvl.gather_k_v4_triton(kvl.paged_view(cache, page_size), ids, out=out)
        assert got is out
    assert not got.isnan().any()
    assert torch.equal(got, expected)
    # the shim-facing entry point (SGLang's dequantize_k_cache_paged_dsv4 signature)
    res = kvl.dequantize_k_cache_paged_v4(cache, ids, page_size)
    assert res.shape == (77, 1, 512) and torch.equal(res[:, 0], expected)


def test_roundtrip_error_is_fp8_bounded() -> None:
    """Dequantized nope within e4m3's half-ulp (2**-4 relative) or its subnormal step; rope exact."""
    k = _k_rows(50)
    cache = kvl.alloc_k_cache(2, 32)
    kvl.store_k_v4(k, cache, torch.arange(50), 32)
    back = kvl.gather_k_v4_reference(cache, torch.arange(50), 32)
    x = k.float()
    scale = torch.exp2(kvl.quantize_k_v4_reference(k)[2].float() - 127).repeat_interleave(64, 1)
    bound = torch.maximum(x[:, :448].abs() * 2.0 ** -4, scale * 2.0 ** -10)
    assert ((back[:, :448] - x[:, :448]).abs() <= bound).all()
    assert torch.equal(back[:, 448:], x[:, 448:])


@pytest.mark.gpu
def test_gpu_store_and_gather_at_pool_size() -> None:
    page_size, pages, n = 256, 64, 8192
    k = _k_rows(n, "cuda")
    loc = torch.randperm(pages * page_size, device="cuda")[:n]
    ref = kvl.alloc_k_cache(pages, page_size, "cuda")
    kvl.store_k_v4_reference(k, ref, loc, page_size)
    tri = kvl.alloc_k_cache(pages, page_size, "cuda")
    kvl.store_k_v4_triton(k, kvl.paged_view(tri, page_size), loc)
    assert torch.equal(ref, tri)
    ids = loc[torch.randint(0, n, (4096,), device="cuda")]
    expected = kvl.gather_k_v4_reference(ref, ids, page_size, torch.bfloat16)  # tested vs SGLang's on CPU
    assert torch.equal(kvl.gather_k_v4_triton(ref, ids, page_size), expected)
