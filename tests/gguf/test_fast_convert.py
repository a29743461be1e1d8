"""The vectorized load-time conversions equal slow, straightforward references bit for bit.

The references below are written from the format definitions with plain numpy, one obvious step
at a time (they are the implementations the loader used before it was vectorized). Inputs are
random blocks with the edge values forced in: NaN / inf / 0 / -0 / subnormal Q8_0 scales, q = -128,
E8M0 exponents 0 and 255; shapes with ragged FP8 blocks; chunk sizes small enough that the
threaded chunking and the per-chunk page release are exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.gguf._helpers import write_raw_gguf
from winport.gguf import convert as cv
from winport.gguf import mxfp4_repack, open_gguf
from winport.gguf.dequant import E4M3FN_VALUES

FP8_MAX = np.float32(448.0)


# ---------------------------------------------------------------- references (slow, obvious)
def ref_mxfp4_to_kt(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF MXFP4 -> kt layout, element by element from the layout definitions."""
    blocks = raw.reshape(rows, cols // 32, 17)
    scales = blocks[:, :, 0].copy()
    payload = blocks[:, :, 1:].astype(np.int32)
    codes = np.empty((rows, cols // 32, 32), dtype=np.int32)
    codes[:, :, :16] = payload & 0xF  # element j < 16: low nibble of byte j
    codes[:, :, 16:] = payload >> 4  # element j + 16: high nibble of byte j
    codes = codes.reshape(rows, cols)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # column 2j low, 2j + 1 high
    return packed.astype(np.uint8), scales


def ref_q8_0_values(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q8_0 bytes -> float32 d * q (ggml's reference arithmetic)."""
    b = raw.reshape(rows * cols // 32, 34)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    q = b[:, 2:].copy().view(np.int8).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # inf x 0 = NaN on damaged blocks, on purpose
        return (d * q).reshape(rows, cols)


def ref_fp8_blocks(x: np.ndarray, block: tuple[int, int], fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> (e4m3 bytes [N, K], float32 scales): zero-pad to whole blocks, block max,
    scale = max / 448 (rounded up to a power of two for ue8m0; 1 for all-zero/NaN blocks), divide,
    clip to +-448, round to e4m3 (torch's cast, the conversion under test is not the cast)."""
    bn, bk = block
    n, k = x.shape
    rp, kp = -(-n // bn) * bn, -(-k // bk) * bk
    xp = np.zeros((rp, kp), dtype=np.float32)
    xp[:n, :k] = x
    blocks = xp.reshape(rp // bn, bn, kp // bk, bk)
    amax = np.abs(blocks).max(axis=(1, 3))
    s = amax / FP8_MAX
    if fmt == "ue8m0":
        s = np.exp2(np.ceil(np.log2(np.maximum(s, np.float32(2.0**-126))))).astype(np.float32)
    s = np.where(amax > 0, s, np.float32(1.0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # inf / inf on damaged blocks, on purpose
        q = (blocks / s[:, None, :, None]).reshape(rp, kp)[:n, :k]
    w = torch.from_numpy(np.clip(q, -FP8_MAX, FP8_MAX)).to(torch.float8_e4m3fn)
    return w.view(torch.uint8).numpy(), s


# ---------------------------------------------------------------- inputs
def mxfp4_blocks(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    raw = rng.integers(0, 256, (n_blocks, 17), dtype=np.uint8)
    raw[rng.random(n_blocks) < 0.1, 0] = 0
    raw[rng.random(n_blocks) < 0.1, 0] = 255
    return raw


def q8_0_blocks(rng: np.random.Generator, n_blocks: int, *, nonfinite: bool) -> np.ndarray:
    raw = rng.integers(0, 256, (n_blocks, 34), dtype=np.uint8)
    d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
    special = np.array([0.0, -0.0, 6e-8, -6e-8, 65504.0, -65504.0, 1e-5], dtype=np.float16)
    pick = rng.random(n_blocks) < 0.1
    d[pick] = rng.choice(special, int(pick.sum()))
    if nonfinite:
        bad = np.array([np.nan, np.inf, -np.inf], dtype=np.float16)
        pick = rng.random(n_blocks) < 0.05
        d[pick] = rng.choice(bad, int(pick.sum()))
        d[0] = np.float16(np.nan)
    raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    q = raw[:, 2:].view(np.int8)
    q[rng.random(q.shape) < 0.05] = -128
    q[rng.random(q.shape) < 0.05] = 0
    q[rng.random(q.shape) < 0.02] = 127
    raw[3, 2:] = 0  # an all-zero block next to non-zero ones
    return raw


def _tensor_file(tmp_path: Path, tname: str, shape: tuple[int, ...], raw: np.ndarray):
    p = write_raw_gguf(tmp_path / f"{tname}.gguf", {"general.architecture": "deepseek41"},
                       [("w", tname, shape, raw.tobytes())])
    return open_gguf(p)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint8)


# ---------------------------------------------------------------- MXFP4
@pytest.mark.parametrize("rows,cols", [(1, 32), (7, 96), (64, 256), (300, 1024)])
def test_mxfp4_repack_equals_reference(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                       rows: int, cols: int) -> None:
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 37)  # many ragged pieces on the pool
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "2")
    raw = mxfp4_blocks(rng, rows * cols // 32)
    # Read from an odd offset, as from a memory map whose blocks are never 8-byte aligned.
    buf = np.empty(raw.size + 1, dtype=np.uint8)
    buf[1:] = raw.reshape(-1)
    packed, scales = mxfp4_repack.gguf_mxfp4_to_kt(buf[1:], rows, cols)
    rp, rs = ref_mxfp4_to_kt(raw, rows, cols)
    np.testing.assert_array_equal(packed, rp)
    np.testing.assert_array_equal(scales, rs)
    # The byte-level fallback (big-endian hosts, unaligned outputs) gives the same bytes.
    fp, fs = mxfp4_repack._repack_plain(raw.reshape(-1), rows * cols // 32)
    np.testing.assert_array_equal(fp.reshape(rows, cols // 2), rp)
    np.testing.assert_array_equal(fs.reshape(rows, cols // 32), rs)


def test_mxfp4_into_poisoned_output_fully_written(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 64)
    raw = mxfp4_blocks(rng, 40 * 8)
    packed = np.full((40, 128), 0xA5, dtype=np.uint8)
    scales = np.full((40, 8), 0xA5, dtype=np.uint8)
    mxfp4_repack.gguf_mxfp4_into(raw, packed, scales)
    rp, rs = ref_mxfp4_to_kt(raw, 40, 256)
    np.testing.assert_array_equal(packed, rp)
    np.testing.assert_array_equal(scales, rs)
    with pytest.raises(ValueError, match="MXFP4 repack"):
        mxfp4_repack.gguf_mxfp4_into(raw[:-1], packed, scales)


def test_experts_from_file_equal_reference(tmp_path: Path, rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 50)
    e, n, k = 3, 40, 96
    raw = mxfp4_blocks(rng, e * n * k // 32)
    with _tensor_file(tmp_path, "MXFP4", (e, n, k), raw) as m:
        got = list(cv.iter_mxfp4_experts(m["w"]))
    rows = raw.reshape(e, n, -1)
    assert [g[0] for g in got] == list(range(e))
    for i, packed, scales in got:
        rp, rs = ref_mxfp4_to_kt(rows[i], n, k)
        np.testing.assert_array_equal(packed, rp)
        np.testing.assert_array_equal(scales, rs)


# ---------------------------------------------------------------- Q8_0 -> FP8 / bf16
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("block,shape", [((32, 32), (96, 160)), ((32, 32), (37, 64)),
                                         ((128, 128), (200, 96)), ((128, 128), (256, 256))])
@pytest.mark.parametrize("fmt", ["ue8m0", "fp32"])
@pytest.mark.parametrize("tiles", ["narrow", "tall"])
def test_q8_0_to_fp8_equals_reference(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                      block, shape, fmt, nonfinite, tiles) -> None:
    n, k = shape
    # Small chunks and tiles: several row chunks per tensor (the last one ragged) and, run on two
    # pool threads, either several tiles per row block ("narrow") or tiles of several row blocks
    # ("tall", as for narrow tensors).
    monkeypatch.setattr(cv, "_CHUNK_BYTES", 4 * k * 64)
    monkeypatch.setattr(cv, "_TILE_VALUES", block[0] * block[1] * 2 if tiles == "narrow" else block[0] * k * 2)
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "2")
    raw = q8_0_blocks(rng, n * k // 32, nonfinite=nonfinite)
    ref_w, ref_s = ref_fp8_blocks(ref_q8_0_values(raw, n, k), block, fmt)
    with _tensor_file(tmp_path, "Q8_0", shape, raw) as m:
        w, s = cv.to_fp8_blocks(m["w"], block, scale_fmt=fmt)
    assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == shape
    np.testing.assert_array_equal(w.view(torch.uint8).numpy(), ref_w)
    np.testing.assert_array_equal(_bits(s.numpy()), _bits(ref_s))
    if nonfinite:  # the damaged blocks really produced NaN (so the comparison above covered it)
        assert np.isnan(E4M3FN_VALUES[ref_w]).any()


@pytest.mark.parametrize("nonfinite", [False, True])
def test_q8_0_to_bf16_equals_reference(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                       nonfinite: bool) -> None:
    n, k = 70, 96
    monkeypatch.setattr(cv, "_CHUNK_BYTES", 4 * k * 16)
    monkeypatch.setattr(cv, "_TILE_VALUES", k * 3)
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "2")
    raw = q8_0_blocks(rng, n * k // 32, nonfinite=nonfinite)
    ref = torch.from_numpy(ref_q8_0_values(raw, n, k)).to(torch.bfloat16)
    with _tensor_file(tmp_path, "Q8_0", (n, k), raw) as m:
        out = cv.to_float(m["w"])
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (n, k)
    np.testing.assert_array_equal(out.view(torch.int16).numpy(), ref.view(torch.int16).numpy())


# ---------------------------------------------------------------- pooling and filtering (issue 6)
def test_mxfp4_into_many_equals_reference(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several matrices of different sizes in one pool call; every job checked before any is written."""
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 29)  # ragged items spanning job boundaries
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "3")
    shapes = [(5, 64), (1, 32), (33, 160), (12, 96)]
    raws = [mxfp4_blocks(rng, r * c // 32) for r, c in shapes]
    outs = [(np.full((r, c // 2), 0xA5, np.uint8), np.full((r, c // 32), 0xA5, np.uint8)) for r, c in shapes]
    bad = [(raw, p, s) for raw, (p, s) in zip(raws, outs, strict=True)]
    bad[2] = (raws[2][:-1], *outs[2])  # one short job: nothing may be converted
    with pytest.raises(ValueError, match=r"MXFP4 repack \(job 2\)"):
        mxfp4_repack.gguf_mxfp4_into_many(bad)
    assert all((p == 0xA5).all() and (s == 0xA5).all() for p, s in outs)
    mxfp4_repack.gguf_mxfp4_into_many([(raw, p, s) for raw, (p, s) in zip(raws, outs, strict=True)])
    for raw, (r, c), (p, s) in zip(raws, shapes, outs, strict=True):
        rp, rs = ref_mxfp4_to_kt(raw, r, c)
        np.testing.assert_array_equal(p, rp)
        np.testing.assert_array_equal(s, rs)


def test_parallel_chunks_covers_once_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece runs exactly once across the pool and the calling thread; a worker's exception
    reaches the caller after all threads stopped."""
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "4")
    hits = np.zeros(1000, dtype=np.int64)

    def fn(a: int, b: int) -> None:
        hits[a:b] += 1

    mxfp4_repack.parallel_chunks(1000, 7, fn)
    np.testing.assert_array_equal(hits, 1)

    def boom(a: int, b: int) -> None:
        if a == 70:
            raise RuntimeError("piece 70 failed")

    with pytest.raises(RuntimeError, match="piece 70"):
        mxfp4_repack.parallel_chunks(1000, 7, boom)


@pytest.mark.parametrize("threads", ["1", "3"])
def test_experts_grouped_and_filtered(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                      threads: str) -> None:
    """Experts converted in groups (several per pool call), filtered ones never converted."""
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 40)
    monkeypatch.setenv("WINPORT_GGUF_THREADS", threads)
    e, n, k = 7, 20, 64  # 40 blocks per expert: groups of 2 (1 thread) or 6 (3 threads)
    raw = mxfp4_blocks(rng, e * n * k // 32)
    calls: list[int] = []
    real = cv.gguf_mxfp4_into_many

    def spy(jobs, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(len(jobs))
        return real(jobs, **kw)

    monkeypatch.setattr(cv, "gguf_mxfp4_into_many", spy)
    keep = {0, 2, 3, 6}
    with _tensor_file(tmp_path, "MXFP4", (e, n, k), raw) as m:
        got = list(cv.iter_mxfp4_experts(m["w"], lambda i: i in keep))
    assert [g[0] for g in got] == sorted(keep)
    assert sum(calls) == len(keep) and max(calls) > 1  # only kept experts converted, pooled
    rows = raw.reshape(e, n, -1)
    for i, packed, scales in got:
        rp, rs = ref_mxfp4_to_kt(rows[i], n, k)
        np.testing.assert_array_equal(packed, rp)
        np.testing.assert_array_equal(scales, rs)


@pytest.mark.parametrize("tiles", ["narrow", "tall"])
def test_float_rows_to_fp8_equals_reference(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                            tiles: str) -> None:
    """Non-Q8_0 dense tensors go through dequantized float32 rows (the other source branch of the tiles)."""
    n, k = 70, 96
    block = (32, 32)
    monkeypatch.setattr(cv, "_CHUNK_BYTES", 4 * k * 32)
    monkeypatch.setattr(cv, "_TILE_VALUES", block[0] * block[1] * 2 if tiles == "narrow" else block[0] * k * 2)
    monkeypatch.setenv("WINPORT_GGUF_THREADS", "2")
    x = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-20, 20, (n, 1)))).astype(np.float32)
    x[5, 7], x[40, 0], x[41, 1] = np.nan, np.inf, -0.0
    x[64:, 32:64] = 0.0  # an all-zero block
    ref_w, ref_s = ref_fp8_blocks(x, block, "ue8m0")
    with _tensor_file(tmp_path, "F32", (n, k), x) as m:
        w, s = cv.to_fp8_blocks(m["w"], block, scale_fmt="ue8m0")
    np.testing.assert_array_equal(w.view(torch.uint8).numpy(), ref_w)
    np.testing.assert_array_equal(_bits(s.numpy()), _bits(ref_s))


def test_repack_item_size_follows_the_conversion_threads(monkeypatch) -> None:
    """Unset, the work item grows from 8 threads on (GIL set-up queueing); the variable overrides."""
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", None)
    sizes = {}
    for threads in (1, 2, 7, 8, 16):
        monkeypatch.setenv("WINPORT_GGUF_THREADS", str(threads))
        sizes[threads] = mxfp4_repack.chunk_blocks()
    assert sizes == {1: 32768, 2: 32768, 7: 32768, 8: 131072, 16: 131072}
    monkeypatch.setattr(mxfp4_repack, "_CHUNK_BLOCKS", 4096)
    assert mxfp4_repack.chunk_blocks() == 4096
    # The items a repack makes follow it: a 16-thread pool over 4096-block items still converts
    # every block exactly as the reference does.
    rng = np.random.default_rng(7)
    n = 3 * 4096 + 5
    raw = rng.integers(0, 256, n * 17, dtype=np.uint8)
    packed, scales = np.empty(n * 16, np.uint8), np.full(n, 0xAA, np.uint8)
    mxfp4_repack.gguf_mxfp4_into(raw, packed, scales)
    want_p, want_s = ref_mxfp4_to_kt(raw, n, 32)
    assert np.array_equal(packed, want_p.reshape(-1)) and np.array_equal(scales, want_s.reshape(-1))
