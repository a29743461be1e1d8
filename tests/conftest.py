"""Shared test configuration: tiers (markers) and helpers for running code in a fresh interpreter."""

from __future__ import annotations

import pytest

from tests.helpers import run_python


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests are skipped (and reported as skipped, never as passed) without CUDA."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu/run_all.sh on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def python_in_fresh_process():
    """The run_python helper as a fixture."""
    return run_python
