"""winport.patches.cpu_mhc_combine: mHC's stream combine on CPU in torch (V4.1's sublayer input)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_python_ok
from winport.patches import cpu_mhc_combine as patch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_vs_float64(dtype: torch.dtype) -> None:
    m, hc, h = 37, 4, 256
    x = torch.randn(m, hc * h).to(dtype)
    pre = torch.rand(m, hc) * 2 - 0.5
    y = patch.combine_torch(x, pre, hc, dtype)
    ref = (pre.double().unsqueeze(-1) * x.double().view(m, hc, h)).sum(1)
    assert y.dtype == dtype and not torch.isnan(y.float()).any()
    # fp32 accumulation of 4 products (relative 4 x 2^-24 of the magnitudes) + one rounding to dtype
    mag = (pre.double().abs().unsqueeze(-1) * x.double().abs().view(m, hc, h)).sum(1)
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -23
    assert ((y.double() - ref).abs() <= ulp * ref.abs() + 4 * 2.0 ** -24 * mag + 1e-30).all()
    # Control: the streams in another order give another result.
    assert not torch.equal(patch.combine_torch(x, pre.flip(-1), hc, dtype), y)


def test_combine_accumulates_like_sglang_triton(tmp_path: Path) -> None:
    # The fp32 accumulation is bit-identical to the upstream kernel (run in Triton's interpreter).
    # Only fp32 output is compared: the interpreter's fp32 -> bf16 store truncates, while the GPU
    # kernel (and torch) round to nearest even. The kernel runs in a fresh interpreter: TRITON_INTERPRET
    # only takes effect before Triton picks its driver, which an earlier test in this process may have done.
    torch.manual_seed(7)
    x = torch.randn(5, 4 * 256).to(torch.bfloat16)
    pre = torch.rand(5, 4)
    torch.save({"x": x, "pre": pre}, tmp_path / "in.pt")
    run_python_ok(
        "import torch\n"
        "from sglang.kernels.ops.layernorm.mhc import mhc_combine\n"
        "upstream = getattr(mhc_combine, '__wrapped__', mhc_combine)\n"
        f"d = torch.load({str(tmp_path / 'in.pt')!r})\n"
        f"torch.save(upstream(d['x'], d['pre'], 4, torch.float32), {str(tmp_path / 'out.pt')!r})\n",
        env={"TRITON_INTERPRET": "1"})
    upstream_out = torch.load(tmp_path / "out.pt")
    assert torch.equal(patch.combine_torch(x, pre, 4, torch.float32), upstream_out)


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="not a multiple of hc=4"):
        patch.combine_torch(torch.zeros(2, 10), torch.zeros(2, 4), 4, torch.float32)
    with pytest.raises(ValueError, match="does not match 2 rows x 4 streams"):
        patch.combine_torch(torch.zeros(2, 16), torch.zeros(3, 4), 4, torch.float32)


def test_patch_applies_and_routes_cpu_to_torch() -> None:
    out = run_python_ok(
        "from winport.patches import cpu_mhc_combine as p; p.register_patch(); p.apply()\n"
        "import sglang.kernels.ops.layernorm.mhc as m, torch\n"
        "f = m.mhc_combine; assert f.__wrapped__ is not None and not hasattr(f.__wrapped__, '__wrapped__')\n"
        "x, pre = torch.randn(3, 8), torch.rand(3, 2)\n"
        "assert torch.equal(f(x, pre, 2, torch.float32), p.combine_torch(x, pre, 2, torch.float32))\n"
        "print('ok')")
    assert out.strip().endswith("ok")
