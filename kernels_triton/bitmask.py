"""apply_token_bitmask_inplace (sgl_kernel apply_token_bitmask_inplace_cuda, xgrammar's kernel).

bitmask is int32 [B, ceil(V/32)]; bit j of word w allows token 32*w + j, a cleared bit sets the
logit to -inf. `indices` optionally selects the rows to mask; as in xgrammar, row i of the logits
uses row i of the bitmask (both indexed by the selected row id). One program
per (row, vocab block): a streaming kernel over the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(logits_ptr, mask_ptr, idx_ptr, vocab, n_words, logits_stride, mask_stride,
                    HAS_IDX: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < vocab
    words = tl.load(mask_ptr + row * mask_stride + cols // 32, mask=m & (cols // 32 < n_words),
                    other=-1)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * logits_stride + cols, float("-inf"), mask=m & (~allowed))


def bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """In place on logits [B, V] (or [V])."""
    lg = logits.view(1, -1) if logits.dim() == 1 else logits
    bm = bitmask.view(1, -1) if bitmask.dim() == 1 else bitmask
    n_rows = indices.numel() if indices is not None else lg.shape[0]
    if n_rows == 0:
        return
    vocab = min(lg.shape[1], bm.shape[1] * 32)
    block = 1024
    _bitmask_kernel[(n_rows, triton.cdiv(vocab, block))](lg, bm, indices if indices is not None else bm,
                                                        vocab, bm.shape[1], lg.stride(0), bm.stride(0),
                                                        HAS_IDX=indices is not None, BLOCK=block)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 words -> bool [B, vocab] (True = allowed)."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.to(torch.int32)[..., None] >> bits) & 1).bool()
    return allowed.reshape(*bitmask.shape[:-1], -1)[..., :vocab]


def bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """torch reference, in place: logits = where(allowed, logits, -inf)."""
    lg = logits.view(1, -1) if logits.dim() == 1 else logits
    bm = bitmask.view(1, -1) if bitmask.dim() == 1 else bitmask
    vocab = min(lg.shape[1], bm.shape[1] * 32)
    rows = indices.long() if indices is not None else torch.arange(lg.shape[0], device=lg.device)
    allowed = unpack_bitmask(bm[rows], vocab)
    sub = lg[rows, :vocab]
    lg[rows, :vocab] = torch.where(allowed, sub, torch.full_like(sub, float("-inf")))
