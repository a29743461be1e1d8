"""apply_token_bitmask_inplace_cuda vs torch.where on the unpacked mask (upstream
test_apply_token_bitmask_inplace.py), with and without row indices."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch

from kernels_triton import bitmask


def _expected(logits: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    v = logits.shape[1]
    bits = ((mask[..., None] >> torch.arange(32, dtype=torch.int32)) & 1).bool().view(mask.shape[0], -1)[:, :v]
    exp = logits.clone()
    for r in rows:
        exp[r] = torch.where(bits[r], logits[r], torch.tensor(float("-inf"), dtype=logits.dtype))
    return exp


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("vocab", [100, 1000])
@pytest.mark.parametrize("use_idx", [False, True])
def test_bitmask(path: str, vocab: int, use_idx: bool) -> None:
    b = 3
    logits = torch.randn(b, vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (b, (vocab + 31) // 32), dtype=torch.int32)
    idx = torch.tensor([0, 2], dtype=torch.int32) if use_idx else None
    exp = _expected(logits, mask, [0, 2] if use_idx else list(range(b)))
    if path == "torch":
        sgl_kernel.apply_token_bitmask_inplace_cuda(logits, mask, idx)
    else:
        bitmask.bitmask_triton(logits, mask, idx)
    torch.testing.assert_close(logits, exp)
    assert torch.isinf(logits).any() and not torch.isinf(logits).all()


@pytest.mark.parametrize("config", [(4, True, 1), (4, False, 1), (16, True, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_triton_tiles(config: tuple[int, bool, int], dtype: torch.dtype) -> None:
    """Both store variants, tiles of 4 or 16 words with a ragged last tile (1000 tokens = 31.25
    words), bf16 logits, and a mask wider than the logits (extra words are ignored)."""
    b, vocab = 3, 1000
    logits = torch.randn(b, vocab).to(dtype)
    mask = torch.randint(-(2**31), 2**31 - 1, (b, 33), dtype=torch.int32)
    exp = _expected(logits.float(), mask, list(range(b))).to(dtype)
    bitmask.bitmask_triton(logits, mask, None, config=config)
    torch.testing.assert_close(logits, exp)
    assert torch.isinf(logits).any() and not torch.isinf(logits).all()


@pytest.mark.gpu
def test_bitmask_gpu() -> None:
    logits = torch.randn(64, 129280, device="cuda")
    mask = torch.randint(-(2**31), 2**31 - 1, (64, 4040), dtype=torch.int32, device="cuda")
    exp = _expected(logits.cpu(), mask.cpu(), list(range(64)))
    sgl_kernel.apply_token_bitmask_inplace_cuda(logits, mask)
    torch.testing.assert_close(logits.cpu(), exp)
