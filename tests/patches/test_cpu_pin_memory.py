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


def test_meta_device_still_builds_without_memory_after_the_patch() -> None:
    """The patch applied before torch's device context is first used: a module built under
    `with torch.device("meta")` stays on meta (36 GB of fp32 would not fit this machine)."""
    from tests.helpers import run_python_ok

    out = run_python_ok(
        "import torch\n"
        "from winport.patches import cpu_pin_memory\n"
        "assert cpu_pin_memory.apply()\n"
        "with torch.device('meta'):\n"
        "    m = torch.nn.Linear(100000, 90000)\n"
        "    z = torch.zeros(3)\n"
        "print(m.weight.device, z.device)\n")
    assert "meta meta" in out
