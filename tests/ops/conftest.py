"""Op-suite configuration: without CUDA, Triton kernels run under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before any kernels_triton module is imported (triton.jit reads it when a
kernel is decorated), so it is set here, at collection time, and only when no GPU is present.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    # Interpreted kernels address host memory directly: fail any access outside their tensors
    # (tests/ops/triton_bounds.py) instead of corrupting the heap in silence.
    from tests.ops.triton_bounds import install as _install_bounds_check

    _install_bounds_check()

# WINPORT_RECORD_TRITON=1: record the specializations of every kernels_triton launch and write
# tests/ops/triton_specializations.json at the end of the session (see tests/ops/README.md).
if os.environ.get("WINPORT_RECORD_TRITON"):
    from tests.ops.triton_specializations import pytest_sessionfinish, start_recording  # noqa: F401

    start_recording()

# Paths every CPU test runs: the shim's torch reference and the Triton kernel (interpreted).
PATHS = ["torch", "triton"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def poisoned(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    """An output buffer filled with NaN (or -1 for integer dtypes) so unwritten elements fail."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)


def assert_no_nan_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> None:
    """assert_close that also refuses NaN anywhere in actual (NaN never passes)."""
    assert not torch.isnan(actual.float()).any(), "NaN in output"
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol)
