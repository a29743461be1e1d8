"""Vectorized numpy dequantizers for GGML tensor types, written from the block definitions.

Each ``_dq_<type>(blocks)`` takes uint8 [n_blocks, type_size] and returns float32
[n_blocks, block_size] in element order. Arithmetic follows ggml's reference (scalar) dequantizers:
the same float32 operations in the same order, so results match gguf-py bit for bit where gguf-py
does the same, and within float32 rounding elsewhere. Tests check every one against gguf-py or a
float64 reference written from the format definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kernels_triton.formats import E4M3FN_VALUES as _E4M3FN_VALUES
from kernels_triton.formats import E8M0_HALF_VALUES as _E8M0_HALF_VALUES
from kernels_triton.formats import E8M0_VALUES as _E8M0_VALUES
from kernels_triton.formats import GGML_KVALUES_MXFP4
from winport import envs

from .errors import GGUFError
from .types import GGML_TYPES, PLAIN_DTYPES

# Format tables from kernels_triton.formats (their one home), as float32 arrays for the gathers.
# E2M1 code -> value doubled (ggml's kvalues_mxfp4); MXFP4/NVFP4 halve it through their scales.
KVALUES_MXFP4 = np.array(GGML_KVALUES_MXFP4, dtype=np.float32)
# IQ4_NL / IQ4_XS non-linear 4-bit code book.
KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32
)
E4M3FN_VALUES = np.array(_E4M3FN_VALUES, dtype=np.float32)  # all 256 bytes; 0x7F and 0xFF are NaN
E8M0_VALUES = np.array(_E8M0_VALUES, dtype=np.float32)  # byte -> 2^(e-127); 255 is NaN (OCP MX)
E8M0_HALF_VALUES = np.array(_E8M0_HALF_VALUES, dtype=np.float32)  # ggml's MXFP4: 2^(e-128), every byte


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 from uint8 [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)[..., 0]


def _dq_q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _dq_q4_1(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    m = _f16(b[:, 2:4])[:, None]
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)
    return d * q + m


def _q5_high(qh_bytes: np.ndarray) -> np.ndarray:
    """uint8 [n, 4] little-endian u32 -> [n, 32] high bits (bit j -> element j)."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4")  # [n, 1]
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _dq_q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    hi = _q5_high(b[:, 2:6]) << 4
    qs = b[:, 6:22]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1) | hi
    return d * (q.astype(np.float32) - 16.0)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    m = _f16(b[:, 2:4])[:, None]
    hi = _q5_high(b[:, 4:8]) << 4
    qs = b[:, 8:24]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1) | hi
    return d * q.astype(np.float32) + m


def _dq_q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    return d * b[:, 2:34].view(np.int8).astype(np.float32)


def _dq_q2_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scales = b[:, 0:16]
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    d = _f16(b[:, 80:82])[:, None, None]
    dmin = _f16(b[:, 82:84])[:, None, None]
    # [n, half(2), shift(4), 32]: each 128-value half uses one 32-byte group at 4 bit offsets.
    q = (qs >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3
    q = q.reshape(n, 16, 16).astype(np.float32)  # 16 sub-blocks of 16, in scale order
    dl = d * (scales & 0xF).astype(np.float32)[:, :, None]
    ml = dmin * (scales >> 4).astype(np.float32)[:, :, None]
    return (dl * q - ml).reshape(n, 256)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 packed bytes -> 16 signed 6-bit scales (low 4 bits from bytes 0-7, high 2 from 8-11)."""
    i = np.arange(16)
    low = np.where(i < 8, s[:, i % 8] & 0xF, s[:, i % 8] >> 4)
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def _dq_q3_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    sc = _q3_k_scales(b[:, 96:108]).astype(np.float32)
    d = _f16(b[:, 108:110])[:, None, None]
    shifts = (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)
    low = ((qs >> shifts) & 3).astype(np.int8)  # [n, 2, 4, 32]
    # The high bit of element (half h, shift j, l) is bit (4h + j) of hmask[l]; a clear bit
    # subtracts 4.
    bit = (np.arange(8, dtype=np.uint8)).reshape(1, 2, 4, 1)
    hbit = (hmask[:, None, None, :] >> bit) & 1
    q = low - np.where(hbit == 1, np.int8(0), np.int8(4)).astype(np.int8)
    q = q.reshape(n, 16, 16).astype(np.float32)
    return (d * sc[:, :, None] * q).reshape(n, 256)


def _k4_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins."""
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _dq_q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = _f16(b[:, 0:2])[:, None, None]
    dmin = _f16(b[:, 2:4])[:, None, None]
    sc, mn = _k4_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return (d * sc[:, :, None] * q - dmin * mn[:, :, None]).reshape(n, 256)


def _dq_q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = _f16(b[:, 0:2])[:, None, None]
    dmin = _f16(b[:, 2:4])[:, None, None]
    sc, mn = _k4_scale_min(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(n, 8, 32)
    hi = (qh[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # sub-block k -> bit k
    q = (q | (hi << 4)).astype(np.float32)
    return (d * sc[:, :, None] * q - dmin * mn[:, :, None]).reshape(n, 256)


def _dq_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # [half, first/second 32 bytes, l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 2, 8)
    d = _f16(b[:, 208:210])[:, None, None, None]
    # Within each 128-value half: out[0:32]=ql[0:32]&F, [32:64]=ql[32:64]&F, [64:96]=ql[0:32]>>4,
    # [96:128]=ql[32:64]>>4; high 2 bits from qh at shifts 0, 2, 4, 6 in that order.
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # [n, 2, 4, 32]
    high = (qh >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    # Scale index per 16 values: sc[half*8 + quarter*2 + l // 16].
    s = sc.reshape(n, 2, 4, 2, 1)
    y = d[..., None] * s * q.reshape(n, 2, 4, 2, 16).astype(np.float32)
    return y.reshape(n, 256)


def _dq_iq4_nl(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1)
    return d * KVALUES_IQ4NL[q]


def _dq_iq4_xs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = _f16(b[:, 0:2])[:, None, None]
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")[:, 0].astype(np.int32)
    sl = b[:, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
    dl = d * (ls - 32).astype(np.float32)[:, :, None]
    qs = b[:, 8:136].reshape(n, 8, 16)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2)
    return (dl * KVALUES_IQ4NL[q]).reshape(n, 256)


def _dq_mxfp4(b: np.ndarray) -> np.ndarray:
    e = E8M0_HALF_VALUES[b[:, 0]][:, None]
    qs = b[:, 1:17]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1)
    return KVALUES_MXFP4[q] * e


def _ue4m3_half(x: np.ndarray) -> np.ndarray:
    """NVFP4 sub-block scale: unsigned e4m3 (bias 7; 0x7F = 0; bit 7 ignored as ggml does) x 0.5."""
    exp = (x >> 3).astype(np.int32) & 0xF
    man = (x & 7).astype(np.float32)
    raw = np.where(exp == 0, man * np.float32(2.0**-9), (1.0 + man / 8.0) * np.exp2(exp.astype(np.float32) - 7))
    return np.where((x == 0) | (x == 0x7F), np.float32(0.0), raw.astype(np.float32) * np.float32(0.5))


def _dq_nvfp4(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = _ue4m3_half(b[:, 0:4])[:, :, None]
    qs = b[:, 4:36].reshape(n, 4, 8)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2)  # 16 values per sub-block
    return (d * KVALUES_MXFP4[q]).reshape(n, 64)


def _dq_f8_e4m3_b128(b: np.ndarray) -> np.ndarray:
    return E4M3FN_VALUES[b[:, 1:129]] * E8M0_VALUES[b[:, 0]][:, None]


def _dq_mxfp8(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    e = E8M0_VALUES[b[:, 0:8]][:, :, None]
    q = E4M3FN_VALUES[b[:, 8:264]].reshape(n, 8, 32)
    return (q * e).reshape(n, 256)


_BLOCK_DEQUANT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_0": _dq_q4_0,
    "Q4_1": _dq_q4_1,
    "Q5_0": _dq_q5_0,
    "Q5_1": _dq_q5_1,
    "Q8_0": _dq_q8_0,
    "Q2_K": _dq_q2_k,
    "Q3_K": _dq_q3_k,
    "Q4_K": _dq_q4_k,
    "Q5_K": _dq_q5_k,
    "Q6_K": _dq_q6_k,
    "IQ4_NL": _dq_iq4_nl,
    "IQ4_XS": _dq_iq4_xs,
    "MXFP4": _dq_mxfp4,
    "NVFP4": _dq_nvfp4,
    "F8_E4M3_B128": _dq_f8_e4m3_b128,
    "MXFP8": _dq_mxfp8,
}

# Blocks per numpy call: bounds the float32 temporaries to a few tens of MB whatever the tensor.
_CHUNK_VALUES: int = envs.WINPORT_GGUF_DEQUANT_CHUNK.get()


def supported_types() -> list[str]:
    """Type names this module dequantizes natively."""
    return sorted(set(_BLOCK_DEQUANT) | set(PLAIN_DTYPES))


def dequantize_blocks(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Dequantize raw bytes of whole blocks of ``type_name`` to a flat float32 array."""
    fn = _BLOCK_DEQUANT[type_name]
    info = next(t for t in GGML_TYPES.values() if t.name == type_name)
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, info.type_size)
    return fn(blocks).reshape(-1)


def dequantize(
    raw: np.ndarray,
    type_id: int,
    shape: tuple[int, ...],
    *,
    dtype: Any = np.float32,
    name: str = "<tensor>",
    path: Any = "<memory>",
) -> np.ndarray:
    """Dequantize the stored bytes of a tensor of GGML type ``type_id`` to ``dtype`` [shape].

    Works in chunks so the float32 temporaries stay small; the output is the only full-size
    allocation. Types without a native dequantizer fall back to gguf-py when it is installed.
    """
    info = GGML_TYPES.get(type_id)
    if info is None:
        raise GGUFError(f"{path}: tensor {name!r}: unknown GGML type id {type_id}")
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    n = 1
    for s in shape:
        n *= s
    if raw.size != n // info.block_size * info.type_size or (shape and shape[-1] % info.block_size):
        raise GGUFError(f"{path}: tensor {name!r}: {raw.size} bytes do not hold {info.name} {shape}")
    if info.name in PLAIN_DTYPES:
        arr = raw.view(PLAIN_DTYPES[info.name])
        if info.name == "BF16":
            out = np.empty(n, dtype=dtype)
            step = _CHUNK_VALUES
            for i in range(0, n, step):
                out[i : i + step] = (arr[i : i + step].astype(np.uint32) << 16).view(np.float32)
            return out.reshape(shape)
        return arr.astype(dtype).reshape(shape)
    fn = _BLOCK_DEQUANT.get(info.name)
    if fn is None:
        try:
            from gguf.quants import dequantize as _gguf_dequantize
        except ImportError:
            raise GGUFError(f"{path}: tensor {name!r}: no dequantizer for type {info.name}") from None
        try:
            return _gguf_dequantize(raw, info.id).astype(dtype).reshape(shape)
        except (NotImplementedError, ValueError, KeyError) as exc:
            raise GGUFError(f"{path}: tensor {name!r}: no dequantizer for type {info.name} ({exc})") from None
    blocks = raw.reshape(-1, info.type_size)
    out = np.empty(n, dtype=dtype)
    step = max(1, _CHUNK_VALUES // info.block_size)
    for i in range(0, blocks.shape[0], step):
        chunk = fn(blocks[i : i + step])
        out[i * info.block_size : i * info.block_size + chunk.size] = chunk.reshape(-1)
    return out.reshape(shape)
