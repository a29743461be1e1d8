"""Helpers shared by the op tests (import as `from tests.ops._helpers import ...`)."""

from __future__ import annotations

import torch

HAS_CUDA = torch.cuda.is_available()

# Paths every CPU test runs: the shim's torch reference and the Triton kernel (interpreted).
PATHS = ["torch", "triton"]


def poisoned(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    """An output buffer filled with NaN (or -1 for integer dtypes) so unwritten elements fail."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)


def assert_no_nan_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> None:
    """assert_close that also refuses NaN anywhere in actual (NaN never passes)."""
    assert not torch.isnan(actual.float()).any(), "NaN in output"
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol)
