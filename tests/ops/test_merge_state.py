"""merge_state_v2 (natural-log LSE) and flashinfer.cascade.merge_state (base 2) vs a float reference
(upstream test_merge_state_v2.py: atol 1e-3; +inf LSE counts as an empty partial)."""

from __future__ import annotations

import flashinfer.cascade
import pytest
import sgl_kernel
import torch

from kernels_triton import merge_state
from tests.ops._helpers import PATHS, assert_no_nan_close, poisoned


def _ref(va: torch.Tensor, sa: torch.Tensor, vb: torch.Tensor, sb: torch.Tensor, base2: bool):
    sa = sa.masked_fill(sa == float("inf"), float("-inf")).double()
    sb = sb.masked_fill(sb == float("inf"), float("-inf")).double()
    lse = torch.logaddexp(sa * (0.6931471805599453 if base2 else 1), sb * (0.6931471805599453 if base2 else 1))
    wa, wb = torch.exp(sa * (0.6931471805599453 if base2 else 1) - lse), torch.exp(sb * (0.6931471805599453 if base2 else 1) - lse)
    v = va.double() * wa[..., None] + vb.double() * wb[..., None]
    return v, lse / (0.6931471805599453 if base2 else 1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_state_v2(path: str, dtype: torch.dtype) -> None:
    n, h, d = 9, 4, 128
    va, vb = torch.randn(n, h, d, dtype=dtype), torch.randn(n, h, d, dtype=dtype)
    sa, sb = torch.randn(n, h) * 3, torch.randn(n, h) * 3
    sa[0, 0] = float("inf")  # empty prefix partial
    vo, so = poisoned(n, h, d, dtype=dtype), poisoned(n, h)
    if path == "torch":
        ret = sgl_kernel.merge_state_v2(va, sa, vb, sb, vo, so)
        assert ret[0] is vo and ret[1] is so
    else:
        merge_state.merge_state_triton(va, sa, vb, sb, vo, so)
    v_ref, s_ref = _ref(va, sa, vb, sb, False)
    tol = 1e-3 if dtype == torch.float32 else 1e-2
    assert_no_nan_close(vo, v_ref, tol, tol)
    assert_no_nan_close(so, s_ref, 1e-3, 1e-3)


def test_flashinfer_merge_state_base2() -> None:
    va, vb = torch.randn(5, 2, 64), torch.randn(5, 2, 64)
    sa, sb = torch.randn(5, 2), torch.randn(5, 2)
    v, s = flashinfer.cascade.merge_state(va, sa, vb, sb)
    v_ref, s_ref = _ref(va, sa, vb, sb, True)
    assert_no_nan_close(v, v_ref, 1e-3, 1e-3)
    assert_no_nan_close(s, s_ref, 1e-3, 1e-3)


@pytest.mark.gpu
def test_merge_state_gpu() -> None:
    va, vb = (torch.randn(4096, 64, 512, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    sa, sb = torch.randn(4096, 64, device="cuda"), torch.randn(4096, 64, device="cuda")
    v, s = sgl_kernel.merge_state_v2(va, sa, vb, sb)
    v_ref, s_ref = _ref(va, sa, vb, sb, False)
    assert_no_nan_close(v, v_ref, 1e-2, 1e-2)
    assert_no_nan_close(s, s_ref, 1e-3, 1e-3)


@pytest.mark.gpu
def test_flashinfer_merge_state_gpu() -> None:
    """flashinfer.cascade.merge_state (base-2 LSE) at a decode-batch size on the GPU."""
    va, vb = (torch.randn(4096, 64, 512, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    sa, sb = torch.randn(4096, 64, device="cuda") * 3, torch.randn(4096, 64, device="cuda") * 3
    v, s = flashinfer.cascade.merge_state(va, sa, vb, sb)
    v_ref, s_ref = _ref(va, sa, vb, sb, True)
    assert_no_nan_close(v, v_ref, 1e-2, 1e-2)
    assert_no_nan_close(s, s_ref, 1e-3, 1e-3)
