"""Every dequantizer against gguf-py's numpy reference, or a float64 reference from the format."""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch

from tests.gguf._helpers import random_blocks
from winport.gguf.dequant import E4M3FN_VALUES, dequantize, supported_types
from winport.gguf.types import GGML_QUANT_SIZES_EXCEPTIONS, GGML_TYPES, GGML_TYPES_BY_NAME

GGUF_PY_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                 "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4"]


@pytest.mark.parametrize("tname", GGUF_PY_TYPES)
def test_matches_gguf_py_exactly(tname: str, rng: np.random.Generator) -> None:
    info = GGML_TYPES_BY_NAME[tname]
    rows, blocks_per_row = 6, 3
    raw = random_blocks(rng, tname, rows * blocks_per_row)
    ref = gq.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[tname])
    out = dequantize(raw, info.id, (rows, blocks_per_row * info.block_size))
    assert ref.shape == out.shape
    assert np.isfinite(ref).all() and np.isfinite(out).all()
    # Both sides do the same float32 arithmetic: demand bit equality.
    np.testing.assert_array_equal(out, ref)


def test_quantized_by_gguf_py_roundtrip(rng: np.random.Generator) -> None:
    """Values gguf-py quantizes (Q8_0, MXFP4) dequantize to gguf-py's values."""
    x = rng.standard_normal((8, 256)).astype(np.float32)
    for tname in ("Q8_0", "MXFP4", "Q4_0", "Q5_1"):
        qt = gguf.GGMLQuantizationType[tname]
        q = gq.quantize(x, qt)
        out = dequantize(q, qt.value, x.shape)
        np.testing.assert_array_equal(out, gq.dequantize(q, qt))
        # Relative RMS quantization error of a normal sample: ~0.5% for 8 bits, <15% for 4 bits.
        rel = np.sqrt(np.mean((out - x) ** 2) / np.mean(x**2))
        assert rel < (0.01 if tname == "Q8_0" else 0.15), (tname, rel)


def _e4m3_ref(codes: np.ndarray) -> np.ndarray:
    # torch's float8_e4m3fn decode: an implementation independent of ours.
    return torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float64).numpy()


def test_e4m3_table_matches_torch() -> None:
    codes = np.arange(256, dtype=np.uint8)
    ref = _e4m3_ref(codes)
    np.testing.assert_array_equal(E4M3FN_VALUES.astype(np.float64), ref)
    assert np.isnan(E4M3FN_VALUES[0x7F]) and np.isnan(E4M3FN_VALUES[0xFF])


def test_f8_e4m3_b128_fork_type(rng: np.random.Generator) -> None:
    raw = random_blocks(rng, "F8_E4M3_B128", 10)
    out = dequantize(raw, 42, (5, 256))
    ref = _e4m3_ref(raw[:, 1:]) * (2.0 ** (raw[:, :1].astype(np.float64) - 127))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out.astype(np.float64), ref.reshape(5, 256))


def test_mxfp8_fork_type(rng: np.random.Generator) -> None:
    raw = random_blocks(rng, "MXFP8", 6)
    out = dequantize(raw, 43, (3, 512))
    ref = np.empty((6, 256))
    for b in range(6):  # element-wise float64 reference from the 264-byte layout
        for i in range(8):
            ref[b, 32 * i : 32 * i + 32] = _e4m3_ref(raw[b, 8 + 32 * i : 8 + 32 * i + 32]) * 2.0 ** (int(raw[b, i]) - 127)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out.astype(np.float64), ref.reshape(3, 512))


def test_plain_types(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(dequantize(x.view(np.uint8), 0, x.shape), x)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(dequantize(h.view(np.uint8), 1, x.shape), h.astype(np.float32))
    bf = torch.from_numpy(x).to(torch.bfloat16)
    bits = bf.view(torch.int16).numpy().view(np.uint8)
    np.testing.assert_array_equal(dequantize(bits, 30, x.shape), bf.to(torch.float32).numpy())


def test_type_table_matches_gguf_py() -> None:
    for t in gguf.GGMLQuantizationType:
        ours = GGML_TYPES[t.value]
        assert ours.name == t.name
        if t.name in GGML_QUANT_SIZES_EXCEPTIONS:
            continue
        assert (ours.block_size, ours.type_size) == gguf.GGML_QUANT_SIZES[t], t.name
    assert "MXFP8" in supported_types() and "F8_E4M3_B128" in supported_types()


def test_chunked_equals_unchunked(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    import winport.gguf.dequant as dq

    raw = random_blocks(rng, "Q6_K", 40)
    whole = dequantize(raw, 14, (4, 2560))
    monkeypatch.setattr(dq, "_CHUNK_VALUES", 512)
    np.testing.assert_array_equal(dequantize(raw, 14, (4, 2560)), whole)
