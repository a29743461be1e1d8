"""scripts/bench/mxfp4_moe.py --gemv-baseline: another version of the decode GEMV module is imported from
a file, timed on the same inputs, and its output bits compared with this tree's (on CPU under
TRITON_INTERPRET=1, tiny shapes; on a GPU the same code times CUDA graphs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.bench._script import BENCH, load
from tests.ops._helpers import HAS_CUDA

GEMV_FILE = Path(__file__).resolve().parents[2] / "kernels_triton" / "mxfp4_moe_gemv.py"
# A "baseline" that is this tree's GEMV plus one ulp-scale change to its output: the comparison must see it.
PERTURBED = '''
from kernels_triton.mxfp4_moe_gemv import DEFAULT_GEMV_CONFIG, GemvMoeConfig  # noqa: F401
from kernels_triton import mxfp4_moe_gemv as _real


def mxfp4_moe_gemv(*args, **kwargs):
    out = _real.mxfp4_moe_gemv(*args, **kwargs)
    out[0, 0] = -out[0, 0] if out[0, 0] != 0 else 1.0
    return out
'''


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the script imports its sibling roofline.py, as when run from there
    return load("mxfp4_moe")


def _inputs(dev: str) -> tuple:
    e, h, i, k, t = 5, 64, 32, 2, 2
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, device=dev)
    s13 = torch.randint(118, 124, (e, 2 * i, h // 32), dtype=torch.uint8, device=dev)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, device=dev)
    s2 = torch.randint(118, 124, (e, h, i // 32), dtype=torch.uint8, device=dev)
    x = torch.randn(t, h, device=dev).bfloat16()
    draws = [(torch.tensor([[0, 3], [3, -1]], dtype=torch.int32, device=dev), torch.rand(t, k, device=dev)),
             (torch.tensor([[1, 2], [4, 1]], dtype=torch.int32, device=dev), torch.rand(t, k, device=dev))]
    out = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    return x, (w13, s13, w2, s2), draws, out


@pytest.mark.parametrize("perturbed", [False, True], ids=["same-module", "perturbed-module"])
def test_gemv_baseline_times_and_compares_bits(bench: ModuleType, tmp_path: Path, perturbed: bool) -> None:
    dev = "cuda" if HAS_CUDA else "cpu"
    path = GEMV_FILE
    if perturbed:
        path = tmp_path / "gemv_perturbed.py"
        path.write_text(PERTURBED)
    base = bench.load_gemv_module(str(path))
    assert base.__name__ == "mxfp4_moe_gemv_baseline" and base is not bench.gv
    x, experts, draws, out = _inputs(dev)
    row: dict = {}
    bench.gemv_baseline(row, base, x, experts, draws, 10.0, out, 1e6, 100.0, dev)
    assert row["baseline_identical"] is (not perturbed)
    assert row["baseline_ms"] > 0 and math.isfinite(row["baseline_pct_copy"]) and row["baseline_pct_copy"] > 0
