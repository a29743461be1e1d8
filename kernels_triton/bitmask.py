"""apply_token_bitmask_inplace (sgl_kernel apply_token_bitmask_inplace_cuda, xgrammar's kernel).

bitmask is int32 [B, ceil(V/32)]; bit j of word w allows token 32*w + j, a cleared bit sets the
logit to -inf. `indices` optionally selects the rows to mask; as in xgrammar, row i of the logits
uses row i of the bitmask (both indexed by the selected row id).

One program per (row, WORDS mask words = 32*WORDS logits): each mask word is loaded once and
expanded to a [WORDS, 32] tile of bits in registers. MODE picks how the logits are touched (all
exact):
  0: only store -inf where a bit is clear (no logit read, but per-element predicated stores that
     leave partial sectors, which HBM with ECC must read-modify-write);
  1: read the whole tile and write it back (vector loads and stores);
  2: per mask word: all clear (0) -> store 32 x -inf without reading, all set (-1) -> touch nothing,
     mixed -> read and write back. Grammar masks are mostly whole words of one kind (a structural
     position allows few tokens, a string body allows nearly all), so this skips most reads; on a
     random mask it does what MODE 1 does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Defaults chosen from the H200 sweep (scripts/bench/ops.py --sweep; RESULTS.md "MoE routing, softmax,
# token bitmask reworked", 2026-11-29, 79bef39):
# (WORDS, MODE, num_warps). MODE 2: on a grammar-like mask 9.2 us warm / 16.1 us cold L2
# against MODE 1's 11.0 / 23.5; on a random mask (every word mixed) 13.2 / 23.5 against 10.8 / 23.2.
BITMASK_CONFIG = (128, 2, 8)


@triton.jit
def _bitmask_kernel(logits_ptr, mask_ptr, idx_ptr, vocab, n_words, logits_stride, mask_stride,
                    HAS_IDX: tl.constexpr, WORDS: tl.constexpr, MODE: tl.constexpr):
    r = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    w = tl.program_id(1) * WORDS + tl.arange(0, WORDS)
    words = tl.load(mask_ptr + row * mask_stride + w, mask=w < n_words, other=-1)
    b = tl.arange(0, 32)
    cols = w[:, None] * 32 + b[None, :]
    m = cols < vocab  # vocab <= 32 * n_words, so every column in range has its word
    allowed = ((words[:, None] >> b[None, :]) & 1) != 0
    ptr = logits_ptr + row * logits_stride + cols
    if MODE == 1:
        x = tl.load(ptr, mask=m, other=0.0)
        # Through fp32 (exact for fp16/bf16 logits): the interpreter has no bf16 constants.
        tl.store(ptr, tl.where(allowed, x.to(tl.float32), float("-inf")).to(x.dtype), mask=m)
    elif MODE == 2:
        # Words with all bits clear need no read (every logit becomes -inf); all-set words no access.
        mixed = ((words != 0) & (words != -1))[:, None]
        x = tl.load(ptr, mask=m & mixed, other=0.0)
        tl.store(ptr, tl.where(allowed, x.to(tl.float32), float("-inf")).to(x.dtype),
                 mask=m & (words != -1)[:, None])
    else:
        tl.store(ptr, float("-inf"), mask=m & (~allowed))

def bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None,
                   config: tuple[int, bool, int] | None = None) -> None:
    """In place on logits [B, V] (or [V]).

    config = (WORDS mask words per program, MODE (see the module docstring), num_warps) overrides
    BITMASK_CONFIG (benchmarks, tests)."""
    lg = logits.view(1, -1) if logits.dim() == 1 else logits
    bm = bitmask.view(1, -1) if bitmask.dim() == 1 else bitmask
    if lg.stride(-1) != 1 or bm.stride(-1) != 1:
        raise ValueError("bitmask_triton: logits and bitmask need unit stride over the vocab")
    n_rows = indices.numel() if indices is not None else lg.shape[0]
    if n_rows == 0:
        return
    vocab = min(lg.shape[1], bm.shape[1] * 32)
    words, mode, warps = config or BITMASK_CONFIG
    _bitmask_kernel[(n_rows, triton.cdiv(triton.cdiv(vocab, 32), words))](
        lg, bm, indices if indices is not None else bm, vocab, bm.shape[1], lg.stride(0), bm.stride(0),
        HAS_IDX=indices is not None, WORDS=words, MODE=int(mode), num_warps=warps)


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
