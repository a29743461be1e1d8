"""Op-suite configuration: without CUDA, Triton kernels run under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before any kernels_triton module is imported (triton.jit reads it when a
kernel is decorated), so it is set here, at collection time, and only when no GPU is present.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.ops._helpers import HAS_CUDA

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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
