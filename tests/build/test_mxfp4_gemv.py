"""MXFP4 x bf16 GEMV in the C++ check, fed from a GGUF-layout MXFP4 tensor through the loader's repack.

gguf-py quantizes to GGUF MXFP4 blocks; winport.gguf.mxfp4_repack turns them into kt-kernel's
layout; the C++ check (native, and Windows under Wine) multiplies by a bf16 vector. The reference is
float64, computed from gguf-py's own dequantization of the GGUF bytes (independent of the repack).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from winport.gguf.mxfp4_repack import dequant_kt_mxfp4, gguf_mxfp4_to_kt  # noqa: E402

N, K = 48, 256


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


@pytest.fixture(scope="module")
def operands(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray, tuple]:
    """Operand files for the check, plus the GGUF bytes, dequantized weights and x (float64)."""
    rng = np.random.default_rng(7)
    # Rows with very different magnitudes exercise the E8M0 scales.
    w = rng.standard_normal((N, K)).astype(np.float32) * np.logspace(-3, 2, N, dtype=np.float32)[:, None]
    try:
        raw = np.asarray(quantize(w, GGMLQuantizationType.MXFP4), dtype=np.uint8)
    except NotImplementedError:
        pytest.skip("this gguf-py cannot quantize MXFP4")
    packed, scales = gguf_mxfp4_to_kt(raw, N, K)
    w_ref = dequantize(raw, GGMLQuantizationType.MXFP4).astype(np.float64).reshape(N, K)
    x_bits = to_bf16_bits(rng.standard_normal(K).astype(np.float32))
    x = (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    d = tmp_path_factory.mktemp("gemv")
    (d / "meta.txt").write_text(f"{N} {K}\n")
    packed.tofile(d / "packed.bin")
    scales.tofile(d / "scales.bin")
    x_bits.tofile(d / "x.bin")
    return d, packed, scales, (w_ref, x)


def reference(operands) -> tuple[np.ndarray, np.ndarray]:
    """float64 y = W x and the per-row scale sum |W||x| used for the tolerance."""
    _, _, _, (w_ref, x) = operands
    return w_ref @ x, np.abs(w_ref) @ np.abs(x)


def test_repack_matches_gguf_dequant(operands) -> None:
    """The repacked kt layout dequantizes to exactly gguf-py's values for the GGUF bytes."""
    _, packed, scales, (w_ref, _) = operands
    np.testing.assert_array_equal(dequant_kt_mxfp4(packed, scales), w_ref)


def _run_gemv(cmd: list[str], d: Path, env: dict | None = None) -> np.ndarray:
    (d / "y.bin").unlink(missing_ok=True)
    proc = subprocess.run([*cmd, "gemv", str(d)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gemv.live_after=0" in proc.stdout.replace("\r", "")
    return np.fromfile(d / "y.bin", dtype=np.float32)


def test_gemv_native_vs_float64(operands, native_checks: Path) -> None:
    """Native C++ GEMV against the float64 reference, within fp32 accumulation error."""
    y_ref, mag = reference(operands)
    y = _run_gemv([str(native_checks)], operands[0])
    assert y.shape == (N,)
    np.testing.assert_array_less(np.abs(y - y_ref), 1e-5 * mag + 1e-30)


@pytest.mark.wine
def test_gemv_windows_under_wine_matches_native(operands, native_checks: Path, windows_checks: Path,
                                                wine_env: dict) -> None:
    """The Windows build under Wine gives the same float32 results as the native build."""
    y_ref, mag = reference(operands)
    y_native = _run_gemv([str(native_checks)], operands[0])
    y_win = _run_gemv([wine_env["WINE_BIN"], str(windows_checks)], operands[0], wine_env)
    np.testing.assert_array_less(np.abs(y_win - y_ref), 1e-5 * mag + 1e-30)
    np.testing.assert_array_equal(y_win, y_native)
