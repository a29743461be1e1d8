"""Small helpers shared by the kernel modules: device dispatch and launch sizing."""

from __future__ import annotations

import torch

from kernels_triton import _env


def use_triton(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernel should run: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1.

    The shims call the torch reference on CPU; tests call the Triton entry points directly, so
    the interpreter case only matters when a caller forces it (WINPORT_TRITON_ON_CPU=1).
    """
    if all(t.is_cuda for t in tensors):
        return True
    return _env.interpreting() and bool(_env.WINPORT_TRITON_ON_CPU.get())


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
