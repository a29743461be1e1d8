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


@pytest.mark.parametrize("config", [(4, 1, 1), (4, 0, 1), (16, 1, 4), (4, 2, 1), (16, 2, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_triton_tiles(config: tuple[int, int, int], dtype: torch.dtype) -> None:
    """Every store variant (0 predicated -inf stores, 1 read + write back, 2 per-word: skip the read of
    all-clear words and all access to all-set words), tiles of 4 or 16 words with a ragged last tile
    (1000 tokens = 31.25 words), bf16 logits, -inf logits already present, a mask wider than the logits
    (extra words are ignored), and a mask of runs as grammars make them: all-clear words, all-set
    words, mixed words, a whole row blocked and a whole row allowed."""
    b, vocab = 4, 1000
    logits = torch.randn(b, vocab).to(dtype)
    logits[0, 100:140] = float("-inf")
    mask = torch.randint(-(2**31), 2**31 - 1, (b, 33), dtype=torch.int32)
    mask[0, 3:20] = 0
    mask[0, 25:29] = -1
    mask[1, ::2] = 0
    mask[1, 1::4] = -1
    mask[2] = 0
    mask[3] = -1
    exp = _expected(logits.float(), mask, list(range(b))).to(dtype)
    bitmask.bitmask_triton(logits, mask, None, config=config)
    torch.testing.assert_close(logits, exp)
    assert torch.isinf(logits[2]).all() and not torch.isinf(logits[3]).any()
    assert torch.isinf(logits[:2]).any() and not torch.isinf(logits[:2]).all()


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_bitmask_triton_indices_modes(mode: int) -> None:
    """Row indices (rows 3 and 1 of 5, out of order) with each variant: the other rows stay untouched."""
    logits = torch.randn(5, 300)
    mask = torch.randint(-(2**31), 2**31 - 1, (5, 10), dtype=torch.int32)
    mask[3, :4] = 0
    mask[1, 5:] = -1
    exp = _expected(logits, mask, [3, 1])
    bitmask.bitmask_triton(logits, mask, torch.tensor([3, 1], dtype=torch.int32), config=(4, mode, 2))
    torch.testing.assert_close(logits, exp)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, 0, 1, 2])
def test_bitmask_gpu(mode: int | None) -> None:
    """The shim (shipped default) and each variant at the real size, random and run-structured rows."""
    logits = torch.randn(64, 129280, device="cuda")
    mask = torch.randint(-(2**31), 2**31 - 1, (64, 4040), dtype=torch.int32, device="cuda")
    mask[:32, 100:3000] = 0
    mask[16:48, 2000:3900] = -1
    exp = _expected(logits.cpu(), mask.cpu(), list(range(64)))
    if mode is None:
        sgl_kernel.apply_token_bitmask_inplace_cuda(logits, mask)
    else:
        bitmask.bitmask_triton(logits, mask, None, config=(128, mode, 4))
    torch.testing.assert_close(logits.cpu(), exp)
