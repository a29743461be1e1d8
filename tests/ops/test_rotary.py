"""apply_rope_with_cos_sin_cache_inplace vs an fp32 native rotary (upstream: NeoX and GPT-J styles,
partial rotary, 1e-2 for bf16)."""

from __future__ import annotations

import flashinfer.rope
import pytest
import sgl_kernel
import torch

from kernels_triton import rotary


def _cache(max_pos: int, rot: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], dim=-1)


def _native(pos: torch.Tensor, x: torch.Tensor, hs: int, cache: torch.Tensor, neox: bool) -> torch.Tensor:
    x3 = x.float().view(x.shape[0], -1, hs)
    rot = cache.shape[1]
    cos, sin = cache[pos].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    r, rest = x3[..., :rot], x3[..., rot:]
    if neox:
        a, b = r.chunk(2, dim=-1)
        r = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        r = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([r, rest], dim=-1).view(x.shape)


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("hs,rot", [(64, 64), (128, 64)])
def test_rope(path: str, neox: bool, hs: int, rot: int) -> None:
    n, hq, hk = 7, 4, 1
    pos = torch.randint(0, 100, (n,))
    cache = _cache(128, rot)
    q = torch.randn(n, hq * hs, dtype=torch.bfloat16)
    k = torch.randn(n, hk * hs, dtype=torch.bfloat16)
    q_exp, k_exp = _native(pos, q, hs, cache, neox), _native(pos, k, hs, cache, neox)
    if path == "torch":
        sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, q, k, hs, cache, is_neox=neox)
    else:
        rotary.rope_triton(pos, q, k, hs, cache, neox)
    torch.testing.assert_close(q.float(), q_exp, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), k_exp, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("config", [(2, 4, 4), (1, 2, 1)])
def test_rope_triton_tiles(neox: bool, config: tuple[int, int, int]) -> None:
    """Several tokens and heads per program with ragged edges: 5 tokens, 5 q + 2 k heads (tiles of 2x4
    and 1x2), partial rotary (48 of 80 dims: half 24 pads to 32), and key=None."""
    n, hq, hk, hs, rot = 5, 5, 2, 80, 48
    pos = torch.randint(0, 60, (n,))
    cache = _cache(64, rot)
    q = torch.randn(n, hq * hs, dtype=torch.bfloat16)
    k = torch.randn(n, hk * hs, dtype=torch.bfloat16)
    q_exp, k_exp = _native(pos, q, hs, cache, neox), _native(pos, k, hs, cache, neox)
    q2 = q.clone()
    rotary.rope_triton(pos, q, k, hs, cache, neox, config=config)
    torch.testing.assert_close(q.float(), q_exp, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), k_exp, rtol=1e-2, atol=1e-2)
    rotary.rope_triton(pos, q2, None, hs, cache, neox, config=config)
    torch.testing.assert_close(q2, q)


def test_rope_flashinfer_alias_and_errors() -> None:
    assert flashinfer.rope.apply_rope_with_cos_sin_cache_inplace is sgl_kernel.apply_rope_with_cos_sin_cache_inplace
    with pytest.raises(ValueError):
        sgl_kernel.apply_rope_with_cos_sin_cache_inplace(torch.zeros(1, dtype=torch.long), torch.randn(1, 64),
                                                         torch.randn(1, 64), 64, _cache(4, 64).half())


@pytest.mark.gpu
def test_rope_gpu() -> None:
    n, hs = 4096, 64
    pos = torch.randint(0, 65536, (n,), device="cuda")
    cache = _cache(65536, 64).cuda()
    q = torch.randn(n, 64 * 512, dtype=torch.bfloat16, device="cuda")[:, : 64 * hs]
    q = q.contiguous()
    k = torch.randn(n, hs, dtype=torch.bfloat16, device="cuda")
    qe, ke = _native(pos, q, hs, cache, False), _native(pos, k, hs, cache, False)
    sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, q, k, hs, cache, is_neox=False)
    torch.testing.assert_close(q.float(), qe, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), ke, rtol=1e-2, atol=1e-2)
