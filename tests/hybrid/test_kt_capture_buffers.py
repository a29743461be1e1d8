"""kt-kernel's staging buffers handed out during a CUDA graph capture are kept for good
(winport.hybrid.kt_capture_buffers). Runs on CPU-only torch: the capture is stood in for by the
module's `capturing` predicate; the live DSpark hybrid test on the GPU (tests/serve/test_dspark_live.py)
is where a freed buffer used to crash a verify graph's replay."""

from __future__ import annotations

import pytest
import torch

from winport.hybrid import kt_capture_buffers
from winport.hybrid.kt_experts import import_kt

HIDDEN, TOP_K = 64, 2


@pytest.fixture
def buffer_cls(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    import_kt()  # applies the wrapper (and, on CPU-only torch, the pin_memory stand-in)
    from kt_kernel.experts_base import KExpertsCPUBuffer

    monkeypatch.setattr(KExpertsCPUBuffer, "capture_bs", [])
    monkeypatch.setattr(KExpertsCPUBuffer, "capture_buffers", {})
    monkeypatch.setattr(KExpertsCPUBuffer, "temp_bs", 0)
    monkeypatch.setattr(KExpertsCPUBuffer, "temp_buffer", ())
    return KExpertsCPUBuffer


def _x(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, HIDDEN, dtype=torch.bfloat16)


def test_the_wrapper_is_installed_once() -> None:
    import_kt()
    kt_capture_buffers.apply()
    from kt_kernel.experts_base import KExpertsCPUBuffer

    assert KExpertsCPUBuffer.__dict__["get_buffer"].__func__._winport_keeps_captured
    assert KExpertsCPUBuffer.__dict__["get_buffer"].__func__.__wrapped__.__name__ == "get_buffer"
    assert not hasattr(KExpertsCPUBuffer.__dict__["get_buffer"].__func__.__wrapped__, "_winport_keeps_captured")


def test_a_size_seen_while_capturing_keeps_its_buffers(buffer_cls, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(kt_capture_buffers, "capturing", lambda x: True)
    captured = buffer_cls.get_buffer(_x(6), TOP_K)  # a verify block: a count not in capture_bs
    monkeypatch.setattr(kt_capture_buffers, "capturing", lambda x: False)
    buffer_cls.get_buffer(_x(21), TOP_K)  # a prefill after start-up: kt-kernel's temp set moves on
    again = buffer_cls.get_buffer(_x(6), TOP_K)
    assert again is captured, "the captured graph's buffers were replaced (their memory would be freed)"
    assert all(a is b for a, b in zip(again[0], captured[0], strict=True))
    assert set(buffer_cls.capture_buffers) == {6}


def test_sizes_outside_a_capture_stay_temporary(buffer_cls, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # The control: without a capture kt-kernel's own behaviour is unchanged (one temp set), so the
    # test above fails if the wrapper does nothing.
    monkeypatch.setattr(kt_capture_buffers, "capturing", lambda x: False)
    first = buffer_cls.get_buffer(_x(6), TOP_K)
    buffer_cls.get_buffer(_x(21), TOP_K)
    assert buffer_cls.get_buffer(_x(6), TOP_K) is not first
    assert buffer_cls.capture_buffers == {}


def test_cpu_tensors_are_never_capturing() -> None:
    assert kt_capture_buffers.capturing(_x(3)) is False
