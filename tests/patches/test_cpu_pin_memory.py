"""winport.patches.cpu_pin_memory: pin_memory is a no-op without CUDA."""

from __future__ import annotations

import pytest


def test_pin_memory_is_a_no_op_without_cuda() -> None:
    import torch

    from winport.patches import cpu_pin_memory

    if torch.cuda.is_available():
        pytest.skip("only meaningful without CUDA")
    assert cpu_pin_memory.apply() is True
    t = torch.empty(4, pin_memory=True)
    assert t.shape == (4,) and not t.is_pinned()
    assert torch.zeros(2, pin_memory=True).pin_memory() is not None
