"""The interpreter's bounds check (tests/ops/triton_bounds.py) catches a kernel that reaches past its
tensors, and lets a correctly masked one through: the op suite's memory-safety claim can fail."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tests.ops import triton_bounds

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only (CPU)")


@triton.jit
def _copy(src, dst, n, extra: tl.constexpr, BLOCK: tl.constexpr) -> None:
    offs = tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n + extra, other=0.0)
    tl.store(dst + offs, x, mask=offs < n + extra)


@triton.jit
def _add_one(dst, n, extra: tl.constexpr, BLOCK: tl.constexpr) -> None:
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(dst + offs, 1.0, mask=offs < n + extra)


def test_masked_kernel_in_bounds_passes() -> None:
    src, dst = torch.randn(37), torch.full((37,), float("nan"))
    _copy[(1,)](src, dst, 37, extra=0, BLOCK=64)
    torch.testing.assert_close(dst, src)


@pytest.mark.parametrize("extra", [1, 20])
def test_store_one_past_the_end_fails_before_writing(extra: int) -> None:
    buf = torch.randn(4096)
    src, dst = buf[:37], torch.full((37,), float("nan"))
    with pytest.raises(Exception, match=r"_copy: create_masked_(load|store) of \d+ element\(s\) outside"):
        _copy[(1,)](src, dst, 37, extra=extra, BLOCK=64)


def test_store_past_a_view_inside_its_storage_is_allowed() -> None:
    # The check is per storage: a view's neighbours in the same storage belong to the launch.
    buf = torch.randn(64)
    _copy[(1,)](buf[:8], buf[32:40], 8, extra=0, BLOCK=8)
    torch.testing.assert_close(buf[32:40], buf[:8])


def test_atomic_outside_fails() -> None:
    dst = torch.zeros(10)
    with pytest.raises(Exception, match="create_atomic_rmw"):
        _add_one[(1,)](dst, 10, extra=3, BLOCK=16)
    assert torch.equal(dst, torch.zeros(10)), "the out-of-bounds launch must not have written anything"
    _add_one[(1,)](dst, 10, extra=0, BLOCK=16)
    assert torch.equal(dst, torch.ones(10))


def test_outside_helper() -> None:
    starts, ends = np.array([100, 1000], dtype=np.uint64), np.array([200, 1100], dtype=np.uint64)
    addrs = np.array([100, 196, 197, 99, 1000, 1096, 1097, 500], dtype=np.uint64)
    assert triton_bounds.outside(addrs, 4, starts, ends).tolist() == [197, 99, 1097, 500]
    assert triton_bounds.outside(addrs, 4, starts[:0], ends[:0]).size == addrs.size
