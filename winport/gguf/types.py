"""GGUF / GGML format facts kept as tables: tensor type ids and metadata value type ids.

Sizes come from the format definitions (ggml-common.h as documented by gguf-py's constants, and
the forks named below). A tensor of type T with ``n`` values along its innermost axis occupies
``n / block_size * type_size`` bytes per row; ``n`` must be a multiple of ``block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kernels_triton.formats import FORK_TYPES, GGML_BLOCKS, GGMLType

__all__ = ["GGML_MAX_DIMS", "GGML_QUANT_SIZES_EXCEPTIONS", "GGML_TYPES", "GGML_TYPES_BY_NAME", "GGMLType",
           "GGMLTypeInfo", "GGUFValueType", "GGUF_DEFAULT_ALIGNMENT", "GGUF_MAGIC", "GGUF_SUPPORTED_VERSIONS",
           "PLAIN_DTYPES", "SCALAR_VALUE_DTYPES"]

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


# The type ids and their blocks are number-format facts shared with the kernels: kernels_triton.formats
# (GGMLType, GGML_BLOCKS) is their one home; this module adds names and origins for the reader.
GGML_TYPES: dict[int, GGMLTypeInfo] = {
    int(t): GGMLTypeInfo(int(t), t.name, bs, ts, "fork" if t in FORK_TYPES else "ggml")
    for t, (bs, ts) in GGML_BLOCKS.items()
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
