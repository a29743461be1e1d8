"""Small helpers shared by the kernel modules: device dispatch and launch sizing."""

from __future__ import annotations

import functools
import importlib.util

import torch

from kernels_triton import _env


def use_triton(*tensors: torch.Tensor) -> bool:
    """The one rule that picks a kernel's Triton path over its torch reference.

    Triton for CUDA tensors; the torch reference for anything else, unless Triton's interpreter is on
    (TRITON_INTERPRET=1) and WINPORT_TRITON_ON_CPU=1 asks for the Triton code on CPU tensors (how
    tests exercise it without a GPU). TRITON_INTERPRET=1 alone does not: `winport serve` sets it on
    a CPU for SGLang's own Triton kernels, and the references are the fast CPU path. Every
    Triton-or-torch choice in kernels_triton and shims goes through here; entry points named
    `*_triton` always launch their kernel.
    """
    if not _triton_importable():
        return False
    if all(t.is_cuda for t in tensors):
        return True
    return _env.interpreting() and bool(_env.WINPORT_TRITON_ON_CPU.get())


@functools.cache
def _triton_importable() -> bool:
    """Whether Triton is installed (it is optional where only the torch references run)."""
    return importlib.util.find_spec("triton") is not None


def first_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """Rows 0..n-1 of `t` (n fixed by a shape, so no sync); rows past its end repeat the last row.

    The repeated rows belong to masked-out rows only: a kept row past the end was an IndexError before.
    """
    if t.shape[0] >= n:
        return t[:n]
    return t[torch.arange(n, device=t.device).clamp(max=t.shape[0] - 1)]


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
