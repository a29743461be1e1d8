"""Number-format facts, written once for every layer: value tables, block layouts, byte layouts.

This package is the bottom layer: kernels, shims, patches and the GGUF loader all import their
format facts from here, and it imports nothing of theirs. This module needs neither torch nor
triton (the GGUF reader reads metadata without torch); the plain-torch reference codecs built on
these facts are in :mod:`kernels_triton.formats.codecs`. Triton kernels that build values from bits
inline (a table gather in registers is slow) are checked against these tables by
tests/ops/test_formats.py.

Formats (definitions: OCP Microscaling Formats v1.0; ggml-common.h as gguf-py documents it; the
DeepSeek-V4 cache layout of SGLang 0.5.23's kv_layout.py and FlashMLA's V4 format):

- E2M1 (FP4): a 4-bit code ``s ee m``: bit 3 the sign, bits 2..1 the exponent (bias 1), bit 0 the
  mantissa. Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
- E8M0: an unsigned byte ``e`` meaning 2^(e - 127) (OCP: 0 is 2^-127, 255 is NaN). "UE8M0" is the
  same byte as DeepSeek's kernels write it: the power-of-two scale 2^ceil(log2 x), read back by
  shifting the byte into an fp32 exponent (``e << 23``: 0 then reads as 0, not 2^-127).
- e4m3fn (FP8): bias 7, no infinities, S.1111.111 is NaN, largest finite value 448.
- MXFP4 in DeepSeek's checkpoint layout (also kt-kernel's): a weight [N, K] is packed codes
  uint8/int8 [N, K/2], the low nibble holding column 2j and the high nibble column 2j+1, plus E8M0
  scales [N, K/32], one per 32 consecutive columns.
- GGML MXFP4 block (17 bytes per 32 values): one E8M0 byte, then 16 bytes where value j is the low
  nibble of byte j and value j+16 the high nibble. ggml multiplies the doubled code values
  (0, 1, 2, 3, 4, 6, 8, 12) by 2^(e - 128), for every e (no NaN).
- GGML Q8_0 block (34 bytes per 32 values): little-endian float16 d, then 32 int8 q; value = d * q.
- Block FP8 (DeepSeek's dense weights): e4m3 [N, K] and one scale per [bn, bk] block, value =
  weight * scale; blocks are [128, 128] in V4 and [32, 32] in V4.1.
- The V4 FP8 paged K cache: see the ``V4_*`` constants below.
"""

from __future__ import annotations

import math
from enum import IntEnum

# ----------------------------------------------------------------------------------------------
# E2M1 (FP4)
# ----------------------------------------------------------------------------------------------

# code -> value (bit 3 = sign; code 8 is -0.0).
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E2M1_SIGN = 8  # the sign bit of a code
# Midpoints between neighbouring magnitudes: a magnitude above midpoint i rounds to code i + 1.
E2M1_MIDPOINTS: tuple[float, ...] = tuple((a + b) / 2 for a, b in zip(E2M1_VALUES[:7], E2M1_VALUES[1:8], strict=True))
# ggml's kvalues_mxfp4: the code values doubled (ggml halves them again through 2^(e - 128)).
GGML_KVALUES_MXFP4: tuple[int, ...] = tuple(int(2 * v) for v in E2M1_VALUES)

# ----------------------------------------------------------------------------------------------
# E8M0 / UE8M0
# ----------------------------------------------------------------------------------------------

E8M0_BIAS = 127
E8M0_NAN = 255
# byte -> 2^(e - 127), NaN at 255 (OCP MX).
E8M0_VALUES: tuple[float, ...] = tuple(math.ldexp(1.0, e - E8M0_BIAS) for e in range(255)) + (math.nan,)
# byte -> 2^(e - 128) for every byte (ggml's E8M0_TO_FP32_HALF, used with the doubled E2M1 values).
E8M0_HALF_VALUES: tuple[float, ...] = tuple(math.ldexp(1.0, e - E8M0_BIAS - 1) for e in range(256))

# ----------------------------------------------------------------------------------------------
# e4m3fn (FP8)
# ----------------------------------------------------------------------------------------------

E4M3_MAX = 448.0
E4M3_BIAS = 7


def _e4m3fn_value(code: int) -> float:
    """The value of one e4m3fn byte (subnormals 0.mmm x 2^-6; 0x7F and 0xFF are NaN)."""
    if code & 0x7F == 0x7F:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 7
    mag = math.ldexp(man / 8.0, 1 - E4M3_BIAS) if exp == 0 else math.ldexp(1.0 + man / 8.0, exp - E4M3_BIAS)
    return sign * mag


# byte -> value, all 256 bytes.
E4M3FN_VALUES: tuple[float, ...] = tuple(_e4m3fn_value(c) for c in range(256))

# ----------------------------------------------------------------------------------------------
# Block sizes of DeepSeek's quantized weights
# ----------------------------------------------------------------------------------------------

FP8_BLOCK_V4 = (128, 128)  # DeepSeek-V4 dense FP8 weights: one scale per [128, 128]
FP8_BLOCK_V41 = (32, 32)  # DeepSeek-V4.1 (SGLang's _dequant_fp8: "V4 128x128, V4.1 32x32")
MXFP4_GROUP = 32  # values per E8M0 scale of an MXFP4 row

# ----------------------------------------------------------------------------------------------
# DeepSeek-V4 FP8 paged K cache ("V4" layout) and the indexer caches
# ----------------------------------------------------------------------------------------------
# One token: 448 "nope" values as e4m3 (7 tiles of 64, one UE8M0 scale per tile) + 64 RoPE values
# in bf16 = 576 data bytes, then 7 UE8M0 scale bytes + 1 pad byte = 8 scale bytes: 584 bytes.
# One page of P tokens = [P x 576 data bytes][P x 8 scale bytes], padded up to a multiple of 576
# bytes (FlashMLA's TMA row stride), so a page is not P x 584 bytes: v4_page_bytes(256) = 149,760.
# A token index is page * P + slot.

V4_DIM_NOPE = 448
V4_DIM_ROPE = 64
V4_HEAD_DIM = V4_DIM_NOPE + V4_DIM_ROPE  # 512
V4_TILE = 64
V4_NUM_TILES = V4_DIM_NOPE // V4_TILE  # 7
V4_DATA_BYTES = V4_DIM_NOPE + 2 * V4_DIM_ROPE  # 576: e4m3 nope + bf16 rope
V4_SCALE_BYTES = V4_NUM_TILES + 1  # 8: 7 UE8M0 scales + 1 pad byte
V4_BYTES_PER_TOKEN = V4_DATA_BYTES + V4_SCALE_BYTES  # 584
V4_PAGE_ALIGN = 576

# Indexer caches (per token, in a page of P tokens: P rows of payload, then P rows of scales).
INDEXER_DIM = 128
INDEXER_FP8_BYTES = 132  # 128 e4m3 + one fp32 scale
INDEXER_FP4_BYTES = 68  # 64 bytes of E2M1 pairs (element 2j in the low nibble) + 4 UE8M0 scales


def v4_page_bytes(page_size: int) -> int:
    """Bytes of one V4 cache page of `page_size` tokens: page_size x 584, padded to a multiple of 576."""
    return -(-page_size * V4_BYTES_PER_TOKEN // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


# ----------------------------------------------------------------------------------------------
# GGML tensor types and their blocks
# ----------------------------------------------------------------------------------------------


class GGMLType(IntEnum):
    """GGML tensor type ids: mainline ggml (as gguf-py 0.19.0 numbers them) plus two fork ids.

    Ids 4/5 (Q4_2/Q4_3) and 31-33/36-38 were removed from ggml; files using them are unknown types.
    """

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
    # Fork ids (not in mainline ggml). 42: one E8M0 byte + 128 e4m3 bytes (DeepSeek-V4 fork).
    F8_E4M3_B128 = 42
    # 43: 8 E8M0 bytes (one per 32 values) then 256 e4m3 bytes (MXFP8 fork contract).
    MXFP8 = 43


FORK_TYPES = frozenset({GGMLType.F8_E4M3_B128, GGMLType.MXFP8})

# type -> (values per block, bytes per block). A row of n values (n a multiple of the block size)
# takes n / block_size * type_size bytes. Q8_1 is ggml's block_q8_1 (two halves, 36 bytes; gguf-py
# 0.19.0 lists 40, see winport.gguf.types.GGML_QUANT_SIZES_EXCEPTIONS).
GGML_BLOCKS: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66), GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50), GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82), GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8), GGMLType.IQ1_M: (256, 56),
    GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54), GGMLType.TQ2_0: (256, 66),
    GGMLType.MXFP4: (32, 17), GGMLType.NVFP4: (64, 36), GGMLType.Q1_0: (128, 18),
    GGMLType.F8_E4M3_B128: (128, 129), GGMLType.MXFP8: (256, 264),
}


def ggml_row_bytes(qtype: int, n_values: int) -> int:
    """Bytes of `n_values` consecutive values of GGML type `qtype` (a multiple of its block size)."""
    block, size = GGML_BLOCKS[GGMLType(qtype)]
    if n_values % block:
        raise ValueError(f"{GGMLType(qtype).name}: {n_values} values are not whole blocks of {block}")
    return n_values // block * size
