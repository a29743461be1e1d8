"""GGUF / GGML format facts kept as tables: tensor type ids and metadata value type ids.

Sizes come from the format definitions (ggml-common.h as documented by gguf-py's constants, and
the forks named below). A tensor of type T with ``n`` values along its innermost axis occupies
``n / block_size * type_size`` bytes per row; ``n`` must be a multiple of ``block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

GGUF_MAGIC = b"GGUF"
GGUF_SUPPORTED_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4


@dataclass(frozen=True)
class GGMLTypeInfo:
    """One tensor type: id, name, values per block, bytes per block, where it comes from."""

    id: int
    name: str
    block_size: int
    type_size: int
    origin: str = "ggml"

    def row_bytes(self, n_values: int) -> int:
        """Bytes of ``n_values`` consecutive values (must be a multiple of the block size)."""
        return n_values // self.block_size * self.type_size


# id -> (name, block_size, type_size, origin). Ids 4/5 (Q4_2/Q4_3) and 31-33/36-38 were removed
# from ggml; files using them are rejected as unknown.
_TYPE_ROWS: tuple[tuple[int, str, int, int, str], ...] = (
    (0, "F32", 1, 4, "ggml"),
    (1, "F16", 1, 2, "ggml"),
    (2, "Q4_0", 32, 18, "ggml"),
    (3, "Q4_1", 32, 20, "ggml"),
    (6, "Q5_0", 32, 22, "ggml"),
    (7, "Q5_1", 32, 24, "ggml"),
    (8, "Q8_0", 32, 34, "ggml"),
    (9, "Q8_1", 32, 36, "ggml"),
    (10, "Q2_K", 256, 84, "ggml"),
    (11, "Q3_K", 256, 110, "ggml"),
    (12, "Q4_K", 256, 144, "ggml"),
    (13, "Q5_K", 256, 176, "ggml"),
    (14, "Q6_K", 256, 210, "ggml"),
    (15, "Q8_K", 256, 292, "ggml"),
    (16, "IQ2_XXS", 256, 66, "ggml"),
    (17, "IQ2_XS", 256, 74, "ggml"),
    (18, "IQ3_XXS", 256, 98, "ggml"),
    (19, "IQ1_S", 256, 50, "ggml"),
    (20, "IQ4_NL", 32, 18, "ggml"),
    (21, "IQ3_S", 256, 110, "ggml"),
    (22, "IQ2_S", 256, 82, "ggml"),
    (23, "IQ4_XS", 256, 136, "ggml"),
    (24, "I8", 1, 1, "ggml"),
    (25, "I16", 1, 2, "ggml"),
    (26, "I32", 1, 4, "ggml"),
    (27, "I64", 1, 8, "ggml"),
    (28, "F64", 1, 8, "ggml"),
    (29, "IQ1_M", 256, 56, "ggml"),
    (30, "BF16", 1, 2, "ggml"),
    (34, "TQ1_0", 256, 54, "ggml"),
    (35, "TQ2_0", 256, 66, "ggml"),
    (39, "MXFP4", 32, 17, "ggml"),
    (40, "NVFP4", 64, 36, "ggml"),
    (41, "Q1_0", 128, 18, "ggml"),
    # Fork ids (not in mainline ggml). 42: one E8M0 byte + 128 FP8 e4m3 bytes (DeepSeek-V4 fork).
    (42, "F8_E4M3_B128", 128, 129, "fork"),
    # 43: 8 E8M0 bytes (one per 32 values) then 256 FP8 e4m3 bytes (MXFP8 fork contract).
    (43, "MXFP8", 256, 264, "fork"),
)


class GGMLType(IntEnum):
    """Known tensor type ids (mainline ggml plus the fork ids the port reads)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    F8_E4M3_B128 = 42
    MXFP8 = 43


GGML_TYPES: dict[int, GGMLTypeInfo] = {
    tid: GGMLTypeInfo(tid, name, bs, ts, origin) for tid, name, bs, ts, origin in _TYPE_ROWS
}
GGML_TYPES_BY_NAME: dict[str, GGMLTypeInfo] = {t.name: t for t in GGML_TYPES.values()}

# Types stored as plain little-endian numbers: name -> numpy dtype string (BF16 read as uint16).
PLAIN_DTYPES: dict[str, str] = {
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "F64": "<f8",
    "I8": "i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
}


class GGUFValueType(IntEnum):
    """Metadata value type ids of the GGUF key/value section."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size scalar value types: id -> numpy dtype.
SCALAR_VALUE_DTYPES: dict[int, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}

# Where this table deliberately differs from gguf-py 0.19.0's GGML_QUANT_SIZES: gguf-py lists
# Q8_1 at 40 bytes (float d and s); ggml's block_q8_1 holds two halves, 36 bytes. Q8_1 is a
# runtime-only type that files do not contain.
GGML_QUANT_SIZES_EXCEPTIONS = frozenset({"Q8_1"})
