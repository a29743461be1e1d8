"""Plain-torch reference codecs of the formats in :mod:`kernels_triton.formats`.

Every function runs on the inputs' device with no host copy of a table (so CUDA graphs can capture
the ones that the decode path calls) and is the reference the faster paths are tested against:
E2M1/E8M0/e4m3 element codecs, block FP8, MXFP4 (DeepSeek's checkpoint layout and GGML's block)
and GGML Q8_0. tests/ops/test_formats.py checks them against gguf-py and float64 definitions.
"""

from __future__ import annotations

import torch

from kernels_triton.formats import (
    E2M1_MAX,
    E2M1_MIDPOINTS,
    E2M1_SIGN,
    E4M3_MAX,
    E8M0_BIAS,
    E8M0_NAN,
    FP8_BLOCK_V4,
    GGML_BLOCKS,
    MXFP4_GROUP,
    GGMLType,
)

E4M3_DTYPE = torch.float8_e4m3fn
E8M0_DTYPE: torch.dtype | None = getattr(torch, "float8_e8m0fnu", None)  # absent in old torch builds

# ----------------------------------------------------------------------------------------------
# Element codecs
# ----------------------------------------------------------------------------------------------


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (integer tensor, bit 3 = sign) -> float32 values, computed from the bits.

    The same exact values as a gather from E2M1_VALUES, without moving the table to the device.
    """
    code = code.to(torch.int32)
    e = (code >> 1) & 3
    m = (code & 1).to(torch.float32)
    mag = torch.where(e == 0, m * 0.5, (1.0 + m * 0.5) * torch.exp2((e - 1).to(torch.float32)))
    return torch.where((code & E2M1_SIGN) != 0, -mag, mag)


def e2m1_encode(x: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """float values (already divided by their scale) -> E2M1 codes int32 0..15, nearest value.

    ``ties="even"``: a magnitude halfway between two codes takes the even code (round to nearest
    even, the OCP MX and gguf-py rule); ``ties="down"``: it takes the smaller magnitude (threshold
    rounding, what SGLang's FP4 indexer store does). Magnitudes above 6 saturate to 6. A value that
    rounds to zero gets code 0 (never -0), NaN gives code 0.
    """
    if ties not in ("even", "down"):
        raise ValueError(f"ties must be 'even' or 'down', got {ties!r}")
    ax = x.abs().clamp(max=E2M1_MAX)
    idx = torch.zeros_like(ax, dtype=torch.int32)
    if ties == "down":
        for t in E2M1_MIDPOINTS:
            idx += (ax > t).to(torch.int32)
    else:
        tie = torch.zeros_like(ax, dtype=torch.bool)
        for t in E2M1_MIDPOINTS:
            idx += (ax >= t).to(torch.int32)
            tie |= ax == t
        # At a midpoint idx counts it: idx is the upper neighbour; step down when that one is odd.
        idx = torch.where(tie & (idx % 2 == 1), idx - 1, idx)
    return torch.where((x < 0) & (idx != 0), idx | E2M1_SIGN, idx)


def e8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8 or float8_e8m0fnu) -> float32 2^(e - 127), exact (0 is 2^-127), 255 NaN."""
    b = e.view(torch.uint8).to(torch.int32) if e.dtype == E8M0_DTYPE else e.to(torch.int32)
    bits = torch.where(b == 0, 0x00400000, b << 23)  # 2^-127 is the fp32 subnormal 0x00400000
    bits = torch.where(b == E8M0_NAN, 0x7FC00000, bits)
    return bits.view(torch.float32)


def e8m0_shift_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> float32 as the kernels read them: the byte shifted into the fp32 exponent.

    2^(e - 127) for e in 1..254; 0 reads as 0.0 (not 2^-127) and 255 as inf.
    """
    return (e.to(torch.int32) << 23).view(torch.float32)


def ue8m0_exponent(x: torch.Tensor) -> torch.Tensor:
    """Biased exponent (int32) of the smallest power of two >= positive float x: 2^ceil(log2 x).

    Read from the fp32 bits (exponent + 1 unless the mantissa is zero), so it is exact next to
    powers of two where log2 may round.
    """
    bits = x.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def ue8m0_inverse(e: torch.Tensor) -> torch.Tensor:
    """2^(127 - e) as float32 for biased exponents e in 1..253 (exact: built from its bits)."""
    return ((2 * E8M0_BIAS - e).to(torch.int32) << 23).view(torch.float32)


def to_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """Saturating float -> e4m3fn (round to nearest even) as raw bytes uint8."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE).view(torch.uint8)


def unpack_ue8m0_int32(sf: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's packed UE8M0 scales: int32 [..., n] holding four exponent bytes each (byte j of
    word i is group 4i + j) -> the exponents int32 [..., 4n], in group order."""
    if sf.dtype != torch.int32:
        raise TypeError(f"packed UE8M0 scales must be int32, got {sf.dtype}")
    return torch.stack([(sf >> (8 * j)) & 0xFF for j in range(4)], dim=-1).flatten(-2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [..., K] -> uint8 [..., K/2]: column 2j in the low nibble, 2j+1 in the high."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8/int8 [..., K/2] -> codes int64 [..., K] (the inverse of `pack_nibbles`)."""
    u = packed.view(torch.uint8)
    return torch.stack([u & 0x0F, u >> 4], dim=-1).flatten(-2).long()


# ----------------------------------------------------------------------------------------------
# Block FP8
# ----------------------------------------------------------------------------------------------


def _check_matrix(w: torch.Tensor, name: str) -> torch.Tensor:
    if w.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D weight, got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point weight, got {w.dtype}")
    x = w.detach().to(torch.float32)
    if not torch.isfinite(x).all():
        raise ValueError(f"{name}: weight has NaN or Inf values")
    return x


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = FP8_BLOCK_V4,
                       name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (float8_e4m3fn [N, K], float8_e8m0fnu scales [ceil(N/bn), ceil(K/bk)]).

    Scale per block 2^ceil(log2(amax / 448)) (a power of two, what UE8M0 stores; an all-zero block
    gets 1), values clamped to +-448 and cast with round to nearest even.
    """
    x = _check_matrix(w, name)
    bn, bk = block
    n, k = x.shape
    sn, sk = -(-n // bn), -(-k // bk)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32, device=x.device)
    padded[:n, :k] = x
    tiles = padded.view(sn, bn, sk, bk)
    amax = tiles.abs().amax(dim=(1, 3))
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp(min=1e-38) / E4M3_MAX)),
                           torch.zeros_like(amax))
    scale = torch.exp2(exponent)
    q = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE)
    return q.view(sn * bn, sk * bk)[:n, :k].contiguous(), scale.to(E8M0_DTYPE)


def expand_block_scales(s: torch.Tensor, rows: int, cols: int, block: tuple[int, int],
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Block scales [..., ceil(rows/bn), ceil(cols/bk)] -> per-element scales [..., rows, cols]."""
    bn, bk = block
    s = s.to(dtype)
    if bn > 1:
        s = s.repeat_interleave(bn, dim=-2)
    if bk > 1:
        s = s.repeat_interleave(bk, dim=-1)
    return s[..., :rows, :cols]


def dequantize_fp8_block(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(e4m3 [N, K], scales [sn, sk], float or E8M0) -> `dtype` [N, K] = weight x its block's scale.

    Computed in `dtype` (float32 or float64; pass float64 for an exact product of any float32
    scale). Without `block` the block size follows from the shapes, which needs N and K to be
    multiples of it (true of every DeepSeek matrix); a ragged edge block needs the block given.
    """
    if q.dtype != E4M3_DTYPE:
        raise ValueError(f"FP8 weight must be float8_e4m3fn, got {q.dtype}")
    n, k = q.shape
    sn, sk = scale.shape
    if block is None:
        if n % sn or k % sk:
            raise ValueError(f"scale grid {tuple(scale.shape)} does not divide weight {tuple(q.shape)}; "
                             "give the block size")
        block = (n // sn, k // sk)
    bn, bk = block
    if -(-n // bn) != sn or -(-k // bk) != sk:
        raise ValueError(f"scale grid {tuple(scale.shape)} does not fit weight {tuple(q.shape)} in blocks "
                         f"{tuple(block)}")
    return q.to(dtype) * expand_block_scales(scale, n, k, (bn, bk), dtype)


# ----------------------------------------------------------------------------------------------
# MXFP4 (DeepSeek's checkpoint layout) and GGML's MXFP4 block
# ----------------------------------------------------------------------------------------------


def quantize_mxfp4(w: torch.Tensor, name: str = "tensor", amax_slack: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (K % 32 == 0) -> (int8 [N, K/2] packed E2M1 pairs, float8_e8m0fnu [N, K/32]).

    Per 32 values the scale 2^(floor(log2 amax) - 2) (the OCP MX rule and gguf-py's), codes by
    nearest E2M1 value with ties to the even code, magnitudes above 6 (possible up to 8) saturated.
    ``amax_slack``: each block's exponent is taken from amax * (1 + amax_slack); a small slack finds
    the original scale again for values that are MXFP4 values plus a rounding error that may have
    pulled a power-of-two maximum just below it (winport.gguf.convert._experts_to_mxfp4).
    """
    x = _check_matrix(w, name)
    n, k = x.shape
    if k % MXFP4_GROUP:
        raise ValueError(f"{name}: MXFP4 needs the input dim divisible by {MXFP4_GROUP}, got {k}")
    blocks = x.view(n, k // MXFP4_GROUP, MXFP4_GROUP)
    amax = blocks.abs().amax(-1) * (1.0 + amax_slack)
    # floor(log2(amax)) from frexp (exact, unlike log2 near powers of two): amax = f * 2^e, f in [0.5, 1).
    _, e = torch.frexp(amax)
    exponent = torch.where(amax > 0, (e - 1 - 2).to(torch.float32), torch.full_like(amax, -127.0))
    exponent = exponent.clamp(-127.0, 127.0)
    scale = torch.exp2(exponent)
    codes = e2m1_encode((blocks / scale[..., None]).view(n, k), ties="even")
    return pack_nibbles(codes).view(torch.int8), scale.to(E8M0_DTYPE)


def mxfp4_scale_values(scale: torch.Tensor) -> torch.Tensor:
    """MXFP4 scales as float32 values: E8M0 bytes (uint8 / float8_e8m0fnu) decoded, floats as they are."""
    if scale.dtype == torch.uint8 or scale.dtype == E8M0_DTYPE:
        return e8m0_to_float(scale)
    if scale.is_floating_point():
        return scale.to(torch.float32)
    raise TypeError(f"MXFP4 scales must be E8M0 bytes (uint8, float8_e8m0fnu) or float values, got {scale.dtype}")


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed codes [..., N, K/2] (int8/uint8, low nibble = column 2j) and scales [..., N, K/32]
    (E8M0 bytes or float values) -> `dtype` [..., N, K].

    Computed in float64 when `dtype` is float64, else in float32: with E8M0 scales every product is
    exact in float32 (a 2-bit value times a power of two), so the result is the value rounded once.
    """
    if packed.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"MXFP4 weight must be int8 or uint8, got {packed.dtype}")
    if tuple(scale.shape) != (*packed.shape[:-1], packed.shape[-1] * 2 // MXFP4_GROUP):
        raise ValueError(f"MXFP4 scale shape {tuple(scale.shape)} does not fit packed weight {tuple(packed.shape)}")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    vals = e2m1_decode(unpack_nibbles(packed)).to(work)
    s = mxfp4_scale_values(scale).to(work).repeat_interleave(MXFP4_GROUP, dim=-1)
    return (vals * s).to(dtype)


def dequantize_mxfp4_ggml_blocks(b: torch.Tensor) -> torch.Tensor:
    """GGML MXFP4 blocks uint8 [n, 17] -> float32 [n, 32] (value j: low nibble of byte 1 + j,
    value j + 16: its high nibble; scale 2^(e - 128) times the doubled code values, for every e)."""
    e = b[:, 0].to(torch.int32)
    half_scale = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - E8M0_BIAS - 1)
    qs = b[:, 1:17]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1)
    return 2.0 * e2m1_decode(codes) * half_scale[:, None]


# ----------------------------------------------------------------------------------------------
# GGML Q8_0
# ----------------------------------------------------------------------------------------------

Q8_0_BLOCK, Q8_0_BYTES = GGML_BLOCKS[GGMLType.Q8_0]


def q8_0_values(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """float32 [..., nblk, 32] = d [..., nblk] (float16) x q [..., nblk, 32] (int8), as ggml computes it."""
    x = q.float()
    x.mul_(d.float().unsqueeze(-1))
    return x


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 bytes uint8 [..., nblk * 34] -> float32 [..., nblk * 32]."""
    if raw.shape[-1] % Q8_0_BYTES:
        raise ValueError(f"Q8_0 rows must be whole {Q8_0_BYTES}-byte blocks, got {raw.shape[-1]} bytes")
    b = raw.contiguous().view(torch.uint8).reshape(*raw.shape[:-1], -1, Q8_0_BYTES)
    d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    return q8_0_values(d, b[..., 2:].view(torch.int8)).flatten(-2)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C roundf (halves away from zero), exact in float32 (floor(|x| + 0.5) is not, near 0.5)."""
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2.0 * (a - f)))


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] (K % 32 == 0) -> Q8_0 bytes uint8 [..., K / 32 * 34] (ggml's reference rule:
    d = amax / 127 stored as float16, q = roundf(x / d) from the unrounded d, 0 for an all-zero block)."""
    if x.shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"Q8_0 needs the last dim divisible by {Q8_0_BLOCK}, got {x.shape[-1]}")
    blocks = x.float().reshape(*x.shape[:-1], -1, Q8_0_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = _round_half_away(blocks * inv).to(torch.int8)
    out = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return out.flatten(-2)
