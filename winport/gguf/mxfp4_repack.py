"""GGUF MXFP4 blocks -> kt-kernel's MXFP4 expert layout, without dequantizing.

GGUF (ggml) MXFP4 stores 32 values per 17-byte block: one E8M0 exponent byte, then 16 bytes of
nibbles where element j is the low nibble of byte j and element j+16 the high nibble of byte j.
kt-kernel's MXFP4 MoE wants, per weight matrix [N, K], nibbles [N, K/2] with the low nibble holding
column 2j and the high nibble column 2j+1, plus the E8M0 exponents as a separate [N, K/32] byte
array. Both use the same E2M1 code points, so converting is a nibble shuffle and a byte copy.
"""

from __future__ import annotations

import numpy as np

MXFP4_BLOCK_VALUES = 32
MXFP4_BLOCK_BYTES = 17

# E2M1 code -> value. ggml stores the table doubled (kvalues_mxfp4 = 0,1,2,3,4,6,8,12 ...) and
# halves through the exponent; the plain values are used here so value = E2M1[code] * 2^(e-127).
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float64,
)


def split_gguf_mxfp4(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Split raw GGUF MXFP4 bytes of a [rows, cols] matrix into (exponents, nibble bytes).

    Returns exponents as uint8 [rows, cols/32] and the block payloads as uint8 [rows, cols/32, 16].
    """
    if cols % MXFP4_BLOCK_VALUES:
        raise ValueError(f"MXFP4 row length {cols} is not a multiple of {MXFP4_BLOCK_VALUES}")
    nblk = cols // MXFP4_BLOCK_VALUES
    expected = rows * nblk * MXFP4_BLOCK_BYTES
    flat = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size != expected:
        raise ValueError(
            f"MXFP4 [{rows}, {cols}] needs {expected} bytes, got {flat.size}"
        )
    blocks = flat.reshape(rows, nblk, MXFP4_BLOCK_BYTES)
    return blocks[:, :, 0].copy(), blocks[:, :, 1:]


def gguf_mxfp4_to_kt(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Repack GGUF MXFP4 [rows, cols] into kt-kernel's (nibbles [rows, cols/2], scales [rows, cols/32]).

    No value is dequantized: codes and exponents are moved, so the result is bit-exact.
    """
    scales, payload = split_gguf_mxfp4(raw, rows, cols)
    lo = payload & 0x0F  # elements 0..15 of each block
    hi = payload >> 4  # elements 16..31 of each block
    codes = np.concatenate([lo, hi], axis=-1)  # [rows, nblk, 32] in element order
    codes = codes.reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales)


def dequant_kt_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Float64 reference dequantization of kt-kernel's MXFP4 layout (for tests and checks)."""
    rows, half = packed.shape
    codes = np.empty((rows, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    scale = np.ldexp(1.0, scales.astype(np.int32) - 127)
    return E2M1_VALUES[codes] * np.repeat(scale, MXFP4_BLOCK_VALUES, axis=1)
