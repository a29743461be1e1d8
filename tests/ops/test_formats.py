"""kernels_triton.formats against independent references: gguf-py's numpy quantizers, torch's own
float8 casts and float64 math written here from the format definitions (OCP MX v1.0, ggml).

Also checks that the values Triton kernels build from bits inline (where a table gather would be
slow) are the formats module's tables.
"""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels_triton import formats as F
from kernels_triton.dsv4_kv_layout import round_to_e4m3
from kernels_triton.formats import codecs as C
from kernels_triton.indexer import _e2m1
from kernels_triton.mxfp4_moe import _e2m1_half, _scale_pair

QT = gguf.GGMLQuantizationType


# ----------------------------------------------------------------------------------------------
# float64 definitions (written from the specs, not from the module)
# ----------------------------------------------------------------------------------------------


def _e2m1_f64(code: int) -> float:
    """OCP E2M1: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    s, e, m = code >> 3, (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -mag if s else mag


def _e4m3_positive_grid() -> np.ndarray:
    """Every finite non-negative e4m3fn value in code order (bias 7, 0x7F is NaN)."""
    out = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        out.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out, dtype=np.float64)


def _nearest_e4m3_f64(y: np.ndarray) -> np.ndarray:
    """Round float64 `y` to e4m3fn, nearest with ties to the even code, saturating at the largest value."""
    grid = _e4m3_positive_grid()
    a = np.minimum(np.abs(y), grid[-1])
    hi = np.searchsorted(grid, a).clip(1, len(grid) - 1)
    lo = hi - 1
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.copysign(grid[pick], y)


def _e2m1_nearest_f64(y: np.ndarray, ties_even: bool) -> np.ndarray:
    """Magnitude codes 0..7 of the nearest E2M1 value to |y| (saturating at 6)."""
    mags = np.array([_e2m1_f64(c) for c in range(8)])
    d = np.abs(np.minimum(np.abs(y), 6.0)[..., None] - mags)
    best = d.min(-1, keepdims=True)
    cands = d == best  # one or two neighbouring codes
    first = cands.argmax(-1)
    two = cands.sum(-1) == 2
    if ties_even:
        return np.where(two & (first % 2 == 1), first + 1, first)
    return first  # ties to the smaller magnitude


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def test_e2m1_table_and_decode() -> None:
    want = [_e2m1_f64(c) for c in range(16)]
    assert list(F.E2M1_VALUES) == want
    assert [math.copysign(1, v) for v in F.E2M1_VALUES] == [math.copysign(1, v) for v in want]  # -0.0 at 8
    got = C.e2m1_decode(torch.arange(16))
    assert got.dtype == torch.float32 and got.tolist() == want
    assert list(F.GGML_KVALUES_MXFP4) == list(gguf.quants.MXFP4.kvalues)
    assert F.E2M1_MAX == max(want)


@pytest.mark.parametrize("ties", ["even", "down"])
def test_e2m1_encode_nearest(ties: str) -> None:
    mids = np.array(F.E2M1_MIDPOINTS)
    mags = np.array([_e2m1_f64(c) for c in range(8)])
    np.testing.assert_array_equal(mids, (mags[:-1] + mags[1:]) / 2)
    y = np.concatenate([torch.randn(4000, dtype=torch.float64).numpy() * 3, mids, -mids, mags, -mags,
                        [0.0, -0.0, 7.9, -100.0, 6.0001, 1e-30]]).astype(np.float32)
    code = C.e2m1_encode(torch.from_numpy(y), ties=ties).numpy()
    mag = _e2m1_nearest_f64(y.astype(np.float64), ties_even=ties == "even")
    want = np.where((y < 0) & (mag != 0), mag | 8, mag)
    np.testing.assert_array_equal(code, want)
    assert C.e2m1_encode(torch.tensor([float("nan")])).item() == 0
    with pytest.raises(ValueError, match="ties"):
        C.e2m1_encode(torch.zeros(1), ties="up")


def test_e8m0_tables_and_decoders() -> None:
    e = np.arange(256)
    want = [2.0 ** (i - 127) for i in range(255)]
    assert list(F.E8M0_VALUES[:255]) == want and math.isnan(F.E8M0_VALUES[255])
    np.testing.assert_array_equal(np.array(F.E8M0_HALF_VALUES, dtype=np.float32),
                                  gguf.quants.MXFP4.e8m0_to_fp32_half(e.astype(np.uint8)))
    b = torch.arange(256).to(torch.uint8)
    got = C.e8m0_to_float(b)
    torch.testing.assert_close(got[:255].double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=0)
    assert torch.isnan(got[255])
    if C.E8M0_DTYPE is not None:  # torch's own e8m0 cast is a second, independent decoder
        via_torch = b.view(C.E8M0_DTYPE).float()
        assert torch.equal(C.e8m0_to_float(b.view(C.E8M0_DTYPE))[:255], via_torch[:255])
    shift = C.e8m0_shift_to_float(b)
    assert shift[0] == 0.0 and torch.isinf(shift[255])
    assert torch.equal(shift[1:255], got[1:255])


def test_ue8m0_exponent_is_ceil_log2() -> None:
    x = torch.cat([torch.rand(2000) * 10 ** torch.randint(-20, 20, (2000,)).float(),
                   torch.exp2(torch.arange(-120, 120).float()),
                   torch.exp2(torch.arange(-120, 120).float()) * (1 + 2 ** -23),
                   torch.exp2(torch.arange(-120, 120).float()) * (1 - 2 ** -24)])
    x = x[x > 0]
    want = torch.tensor([math.ceil(math.log2(v)) if v != 2 ** round(math.log2(v)) else round(math.log2(v))
                         for v in x.double().tolist()])
    # frexp gives floor(log2) exactly: ceil = floor + (x not a power of two)
    exact = torch.tensor([(math.frexp(v)[1] - 1) + (math.frexp(v)[0] != 0.5) for v in x.double().tolist()])
    assert torch.equal(want, exact)
    e = C.ue8m0_exponent(x)
    assert torch.equal(e - 127, exact.to(torch.int32))
    inv = C.ue8m0_inverse(e)
    assert torch.equal(inv.double(), torch.exp2(-(exact.double())))


def test_e4m3_table() -> None:
    got = torch.tensor(F.E4M3FN_VALUES, dtype=torch.float64)
    via_torch = torch.arange(256).to(torch.uint8).view(torch.float8_e4m3fn).double()
    assert torch.equal(torch.isnan(got), torch.isnan(via_torch))
    ok = ~torch.isnan(got)
    assert torch.equal(got[ok], via_torch[ok])
    assert torch.isnan(got[[0x7F, 0xFF]]).all() and torch.isnan(got).sum() == 2
    np.testing.assert_array_equal(got[:0x7F].numpy(), _e4m3_positive_grid())
    assert F.E4M3_MAX == torch.finfo(torch.float8_e4m3fn).max == _e4m3_positive_grid()[-1]
    y = torch.randn(5000, dtype=torch.float64) * 300
    got_b = C.to_e4m3_bytes(y.float()).view(torch.float8_e4m3fn).double().numpy()
    np.testing.assert_array_equal(got_b, _nearest_e4m3_f64(y.float().double().numpy()))


def test_ggml_block_table_matches_gguf_py() -> None:
    from winport.gguf.types import GGML_QUANT_SIZES_EXCEPTIONS

    for t in F.GGMLType:
        assert F.GGMLType(t.value) is t
        if t in F.FORK_TYPES:
            assert t.name not in QT.__members__
            continue
        assert QT[t.name].value == t.value, t.name
        if t.name not in GGML_QUANT_SIZES_EXCEPTIONS:
            assert F.GGML_BLOCKS[t] == tuple(gguf.GGML_QUANT_SIZES[QT[t.name]]), t.name
    assert set(F.GGML_BLOCKS) == set(F.GGMLType)
    assert F.ggml_row_bytes(F.GGMLType.Q8_0, 64) == 68 and F.ggml_row_bytes(39, 96) == 51
    with pytest.raises(ValueError, match="Q8_0: 40 values"):
        F.ggml_row_bytes(F.GGMLType.Q8_0, 40)


def test_v4_kv_layout_facts() -> None:
    assert F.V4_BYTES_PER_TOKEN == 584 == F.V4_DIM_NOPE + 2 * F.V4_DIM_ROPE + F.V4_NUM_TILES + 1
    assert F.v4_page_bytes(256) == 149760 and F.v4_page_bytes(1) == 1152
    try:
        from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    except ImportError:
        pytest.skip("SGLang not installed: its V4 layout is the reference")
    v4 = KVLayout.V4
    assert (v4.bytes_per_token, v4.data_bytes, v4.scale_bytes, v4.page_align) == (
        F.V4_BYTES_PER_TOKEN, F.V4_DATA_BYTES, F.V4_SCALE_BYTES, F.V4_PAGE_ALIGN)
    for p in (1, 16, 64, 256):
        assert F.v4_page_bytes(p) == v4.page_bytes(p)
    assert F.INDEXER_FP8_BYTES == F.INDEXER_DIM + 4 and F.INDEXER_FP4_BYTES == F.INDEXER_DIM // 2 + 4


# ----------------------------------------------------------------------------------------------
# Block FP8
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,block", [((256, 384), (128, 128)), ((70, 100), (32, 32)), ((5, 33), (4, 8))])
def test_fp8_block_round_trip_vs_float64(shape: tuple[int, int], block: tuple[int, int]) -> None:
    n, k = shape
    bn, bk = block
    x = torch.randn(n, k) * torch.exp2(torch.randint(-12, 12, (n, 1)).float())
    q, s = C.quantize_fp8_block(x, block, "w")
    assert q.dtype == torch.float8_e4m3fn and s.shape == (-(-n // bn), -(-k // bk))
    xd = x.double().numpy()
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = xd[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            want_s = 2.0 ** math.ceil(math.log2(np.abs(blk).max() / 448.0))
            assert s[i, j].float().item() == want_s
            got = q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].double().numpy()
            np.testing.assert_array_equal(got, _nearest_e4m3_f64(blk / want_s))
    sd = np.kron(s.double().numpy(), np.ones(block))[:n, :k]
    back = C.dequantize_fp8_block(q, s, block)
    assert back.dtype == torch.float32
    np.testing.assert_array_equal(back.double().numpy(), q.double().numpy() * sd)
    # float scales that are not powers of two: the float64 product is exact
    s32 = torch.rand(s.shape) + 0.5
    d64 = C.dequantize_fp8_block(q, s32, block, dtype=torch.float64)
    np.testing.assert_array_equal(d64.numpy(), q.double().numpy() * np.kron(s32.double().numpy(), np.ones(block))[:n, :k])


def test_fp8_block_zero_block_and_errors() -> None:
    q, s = C.quantize_fp8_block(torch.zeros(128, 128))
    assert s.float().item() == 1.0 and not q.float().any()
    with pytest.raises(ValueError, match="w: weight has NaN"):
        C.quantize_fp8_block(torch.full((4, 4), float("nan")), name="w")
    with pytest.raises(ValueError, match="does not fit"):
        C.dequantize_fp8_block(q, torch.ones(2, 1), (128, 128))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        C.dequantize_fp8_block(torch.zeros(4, 4), torch.ones(1, 1))


# ----------------------------------------------------------------------------------------------
# MXFP4 and Q8_0 against gguf-py
# ----------------------------------------------------------------------------------------------


def _mx_input(rows: int, k: int) -> torch.Tensor:
    return torch.randn(rows, k) * torch.exp2(torch.randint(-8, 8, (rows, k // 32)).float()).repeat_interleave(32, 1)


def test_mxfp4_matches_gguf_py() -> None:
    x = _mx_input(48, 256)
    packed, scale = C.quantize_mxfp4(x, "w")
    assert packed.dtype == torch.int8 and packed.shape == (48, 128) and scale.shape == (48, 8)
    blocks = gguf.quants.quantize(x.numpy(), QT.MXFP4).reshape(48, 8, 17)
    np.testing.assert_array_equal(scale.view(torch.uint8).numpy(), blocks[:, :, 0])
    ref = gguf.quants.dequantize(blocks.reshape(48, -1), QT.MXFP4)
    np.testing.assert_array_equal(C.dequantize_mxfp4(packed, scale).numpy(), ref)
    # the GGML block decoder on gguf-py's own blocks
    got = C.dequantize_mxfp4_ggml_blocks(torch.from_numpy(blocks.reshape(-1, 17))).reshape(48, 256)
    np.testing.assert_array_equal(got.numpy(), ref)
    # codes: GGML block nibble j / j+16 is column 2j / 2j+1 of ours after the shuffle
    codes = C.unpack_nibbles(packed).numpy().reshape(48, 8, 32)
    np.testing.assert_array_equal(codes[..., :16] | (codes[..., 16:] << 4), blocks[:, :, 1:])


def test_mxfp4_dequantize_scale_forms_and_dtypes() -> None:
    x = _mx_input(6, 64)
    packed, scale = C.quantize_mxfp4(x)
    codes = C.unpack_nibbles(packed).numpy()
    vals = np.array([_e2m1_f64(c) for c in range(16)])[codes]
    e = scale.view(torch.uint8).numpy().astype(np.int64)
    want = vals * np.repeat(2.0 ** (e - 127), 32, axis=1)
    for s in (scale, scale.view(torch.uint8), scale.float()):
        np.testing.assert_array_equal(C.dequantize_mxfp4(packed, s, torch.float64).numpy(), want)
        np.testing.assert_array_equal(C.dequantize_mxfp4(packed.view(torch.uint8), s).double().numpy(), want)
    assert torch.equal(C.dequantize_mxfp4(packed, scale, torch.bfloat16), torch.from_numpy(want).bfloat16())
    # batched [E, N, K/2]; E8M0 0 is 2^-127 and 255 is NaN
    sp = torch.stack([scale.view(torch.uint8), torch.zeros_like(scale.view(torch.uint8))])
    sp[1, 0, 0] = 255
    out = C.dequantize_mxfp4(torch.stack([packed, packed]), sp, torch.float64)
    np.testing.assert_array_equal(out[0].numpy(), want)
    assert torch.isnan(out[1, 0, :32][torch.from_numpy(vals[0, :32] != 0)]).all()
    np.testing.assert_array_equal(out[1, 1:].numpy(), vals[1:] * 2.0 ** -127)
    with pytest.raises(ValueError, match="does not fit"):
        C.dequantize_mxfp4(packed, scale[:, :1])
    with pytest.raises(ValueError, match="divisible by 32"):
        C.quantize_mxfp4(torch.ones(2, 48), name="w")


def test_mxfp4_ties_go_to_the_even_code() -> None:
    # block max 6 * 2^0 -> scale 2^0 (floor(log2 6) - 2 = 0): the midpoints round to even codes
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0] + [0.0] * 22
    packed, scale = C.quantize_mxfp4(torch.tensor([vals]))
    assert scale.float().item() == 1.0
    got = C.dequantize_mxfp4(packed, scale)[0, :10].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -4.0]


def test_q8_0_matches_gguf_py() -> None:
    x = torch.randn(33, 256) * torch.exp2(torch.randint(-6, 6, (33, 1)).float())
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = torch.arange(32) - 15.5
    x[1, 0] = 127.0  # d = 1 exactly, so the halves below are exact ties: roundf takes them away from zero
    x[1, 1:32] = (torch.arange(31) - 15).float() + 0.5
    raw = C.quantize_q8_0(x)
    ref = gguf.quants.quantize(x.numpy(), QT.Q8_0)
    np.testing.assert_array_equal(raw.numpy(), ref)
    np.testing.assert_array_equal(C.dequantize_q8_0(raw).numpy(), gguf.quants.dequantize(ref, QT.Q8_0))
    with pytest.raises(ValueError, match="divisible by 32"):
        C.quantize_q8_0(torch.ones(3, 40))
    with pytest.raises(ValueError, match="34-byte"):
        C.dequantize_q8_0(torch.zeros(3, 40, dtype=torch.uint8))


# ----------------------------------------------------------------------------------------------
# Values built from bits inside Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _e2m1_probe(out_ind, out_moe, out_pair):
    c = tl.arange(0, 16)
    tl.store(out_ind + c, _e2m1(c))
    tl.store(out_moe + c, _e2m1_half(c).to(tl.float32))
    e = tl.arange(0, 256)
    hi, lo = _scale_pair(e.to(tl.uint8), False)
    tl.store(out_pair + 2 * e, hi)
    tl.store(out_pair + 2 * e + 1, lo)


@triton.jit
def _e4m3_probe(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, round_to_e4m3(tl.load(x_ptr + i, mask=m)), mask=m)


def _interpreted() -> None:
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and the interpreter is off")


def test_triton_inline_e2m1_and_e8m0_match_tables() -> None:
    _interpreted()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ind = torch.full((16,), float("nan"), device=dev)
    moe = torch.full((16,), float("nan"), device=dev)
    pair = torch.full((512,), float("nan"), device=dev)
    _e2m1_probe[(1,)](ind, moe, pair)
    table = torch.tensor(F.E2M1_VALUES, dtype=torch.float64)
    assert torch.equal(ind.cpu().double(), table)
    assert torch.equal(torch.signbit(ind.cpu()), torch.signbit(table))
    assert torch.equal(moe.cpu().double() * 2.0 ** 14, table)  # _e2m1_half carries value * 2^-14
    hi, lo = pair.cpu().double().view(256, 2).unbind(1)
    e8 = torch.tensor(F.E8M0_VALUES, dtype=torch.float64)
    assert torch.equal((hi * lo)[:255] * 2.0 ** -14, e8[:255]) and torch.isnan(hi[255])


def test_triton_inline_e4m3_rounding_matches_float64() -> None:
    _interpreted()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    grid = torch.from_numpy(_e4m3_positive_grid()).float()
    mids = (grid[1:] + grid[:-1]) / 2  # every tie, exact in fp32
    x = torch.cat([torch.randn(3000) * 100, grid, -grid, mids, -mids]).clamp(-448, 448)
    out = torch.full_like(x, float("nan"), device=dev)
    _e4m3_probe[(triton.cdiv(x.numel(), 1024),)](x.to(dev), out, x.numel(), BLOCK=1024)
    np.testing.assert_array_equal(out.cpu().double().numpy(), _nearest_e4m3_f64(x.double().numpy()))


def test_unpack_ue8m0_int32_is_little_endian_bytes() -> None:
    words = torch.randint(-2**31, 2**31 - 1, (5, 3), dtype=torch.int64).to(torch.int32)
    want = words.numpy().astype("<i4").view(np.uint8).reshape(5, 12).astype(np.int32)
    np.testing.assert_array_equal(C.unpack_ue8m0_int32(words).numpy(), want)
    with pytest.raises(TypeError, match="int32"):
        C.unpack_ue8m0_int32(words.to(torch.int64))
