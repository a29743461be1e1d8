"""GGUF MXFP4 blocks -> kt-kernel's MXFP4 expert layout, without dequantizing.

GGUF (ggml) MXFP4 stores 32 values per 17-byte block: one E8M0 exponent byte, then 16 bytes of
nibbles where element j is the low nibble of byte j and element j+16 the high nibble of byte j.
kt-kernel's MXFP4 MoE wants, per weight matrix [N, K], nibbles [N, K/2] with the low nibble holding
column 2j and the high nibble column 2j+1, plus the E8M0 exponents as a separate [N, K/32] byte
array. Both use the same E2M1 code points, so converting is a nibble shuffle and a byte copy.

How the shuffle is done fast (this runs over ~289 GB of experts): per block, the 16 payload bytes
are two little-endian 64-bit words w0 (bytes 0-7) and w1 (bytes 8-15). Output bytes 0-7 are the
low nibbles of bytes 0..15 in order and output bytes 8-15 the high nibbles. Within one word that is
an "unzip" of its 16 nibbles (even nibbles to the low half, odd to the high half): three
delta-swap stages (nibbles within 16 bits, bytes within 32, 16-bit units within 64). One more
swap exchanges w0's high half with w1's low half. Every step is a whole-array uint64 operation
(numpy, vectorized, no Python loop per block); the only strided access is one copy of the payload
words out of the 17-byte blocks (through an unaligned numpy view) and one of the exponent bytes.
Row chunks are sized to stay in the CPU's L2 cache and run on a thread pool (numpy releases the
GIL in these loops).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MXFP4_BLOCK_VALUES = 32
MXFP4_BLOCK_BYTES = 17

# E2M1 code -> value. ggml stores the table doubled (kvalues_mxfp4 = 0,1,2,3,4,6,8,12 ...) and
# halves through the exponent; the plain values are used here so value = E2M1[code] * 2^(e-127).
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float64,
)

_U = np.uint64
# (shift, mask of the lower field of each swapped pair): nibble 1<->2 of every 16 bits, byte
# 1<->2 of every 32 bits, 16-bit unit 1<->2 of every 64 bits.
_UNZIP_STAGES = (
    (_U(4), _U(0x00F000F000F000F0)),
    (_U(8), _U(0x0000FF000000FF00)),
    (_U(16), _U(0x00000000FFFF0000)),
)
_LOW32 = _U(0xFFFFFFFF)
_S32 = _U(32)
# Blocks per work item: 8192 blocks = 139 kB of source, 4 x 64 kB of uint64 scratch (fits L2).
_CHUNK_BLOCKS = int(os.environ.get("WINPORT_GGUF_REPACK_CHUNK", 8192))

_pool: ThreadPoolExecutor | None = None
_threads: int | None = None  # torch's intra-op thread count, read once (see parallel_chunks)
_pool_lock = threading.Lock()
_scratch = threading.local()


def conversion_threads() -> int:
    """Worker threads for load-time conversion: torch's intra-op thread count (physical cores)."""
    env = os.environ.get("WINPORT_GGUF_THREADS")
    if env:
        return max(1, int(env))
    global _threads
    if _threads is None:
        try:
            import torch

            _threads = max(1, torch.get_num_threads())
        except ImportError:  # pragma: no cover - torch is a dependency of the loader
            _threads = max(1, os.cpu_count() or 1)
    return _threads


def parallel_chunks(n: int, step: int, fn: Callable[[int, int], None]) -> None:
    """Run ``fn(start, stop)`` over [0, n) in pieces of ``step`` on the conversion thread pool.

    Small jobs (one piece) or one thread run inline. Exceptions propagate to the caller.
    """
    global _pool
    pieces = [(i, min(n, i + step)) for i in range(0, n, step)]
    threads = conversion_threads()
    if len(pieces) <= 1 or threads <= 1:
        for a, b in pieces:
            fn(a, b)
        return
    with _pool_lock:
        if _pool is None or _pool._max_workers != threads:  # noqa: SLF001 - resize on thread change
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="winport-gguf")
        pool = _pool
    torch = _torch_or_none()
    prev = torch.get_num_threads() if torch is not None else 1
    if torch is not None and prev > 1:
        # The pool is the parallelism: each torch op of a work item runs on its own thread. Without
        # this every op (above ATen's 32768-value grain) would also start an OpenMP team per pool
        # thread, oversubscribing the cores; measured 10x slower when other processes hold cores.
        # Process-wide while the pool runs (the calling thread only waits); restored after.
        torch.set_num_threads(1)
    try:
        for fut in [pool.submit(fn, a, b) for a, b in pieces]:
            fut.result()
    finally:
        if torch is not None and prev > 1:
            torch.set_num_threads(prev)


def _torch_or_none():  # noqa: ANN202 - torch is optional for the numpy-only repack
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    return torch


def split_gguf_mxfp4(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Split raw GGUF MXFP4 bytes of a [rows, cols] matrix into (exponents, nibble bytes).

    Returns exponents as uint8 [rows, cols/32] and the block payloads as uint8 [rows, cols/32, 16].
    """
    flat = _check(raw, rows, cols)
    blocks = flat.reshape(rows, cols // MXFP4_BLOCK_VALUES, MXFP4_BLOCK_BYTES)
    return blocks[:, :, 0].copy(), blocks[:, :, 1:]


def _check(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if cols % MXFP4_BLOCK_VALUES:
        raise ValueError(f"MXFP4 row length {cols} is not a multiple of {MXFP4_BLOCK_VALUES}")
    expected = rows * (cols // MXFP4_BLOCK_VALUES) * MXFP4_BLOCK_BYTES
    flat = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size != expected:
        raise ValueError(f"MXFP4 [{rows}, {cols}] needs {expected} bytes, got {flat.size}")
    return flat


def _repack_blocks(src: np.ndarray, out64: np.ndarray, out_s: np.ndarray) -> None:
    """``m`` GGUF MXFP4 blocks (uint8 [m*17], contiguous) -> kt nibbles (uint64 [m, 2]) + exponents [m]."""
    m = out_s.shape[0]
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.shape[1] < m:
        buf = _scratch.buf = np.empty((2, max(m, _CHUNK_BLOCKS)), dtype=np.uint64)
        _scratch.tmp = np.empty_like(buf)
    x, t = buf[:, :m], _scratch.tmp[:, :m]
    # Plane 0 = payload bytes 0-7 of every block, plane 1 = bytes 8-15 (unaligned strided view).
    words = np.ndarray((2, m), dtype="<u8", buffer=src, offset=1, strides=(8, MXFP4_BLOCK_BYTES))
    np.copyto(x, words)
    for s, mask in _UNZIP_STAGES:
        np.right_shift(x, s, out=t)
        np.bitwise_xor(t, x, out=t)
        np.bitwise_and(t, mask, out=t)
        np.bitwise_xor(x, t, out=x)
        np.left_shift(t, s, out=t)
        np.bitwise_xor(x, t, out=x)
    # Now each word is (low nibbles of its 8 bytes) | (high nibbles) << 32. Swap w0's high half
    # with w1's low half, writing straight into the output's two words per block.
    x0, x1, t0 = x[0], x[1], t[0]
    np.right_shift(x0, _S32, out=t0)
    np.bitwise_xor(t0, x1, out=t0)
    np.bitwise_and(t0, _LOW32, out=t0)
    np.bitwise_xor(x1, t0, out=out64[:, 1])
    np.left_shift(t0, _S32, out=t0)
    np.bitwise_xor(x0, t0, out=out64[:, 0])
    np.copyto(out_s, src.reshape(m, MXFP4_BLOCK_BYTES)[:, 0])


def gguf_mxfp4_into(raw: np.ndarray, out_packed: np.ndarray, out_scales: np.ndarray, *,
                    parallel: bool = True) -> None:
    """Repack GGUF MXFP4 bytes of n blocks into preallocated kt arrays (uint8, n*16 and n bytes).

    ``raw``: the stored bytes (any shape, contiguous, e.g. a read-only memory-map view).
    ``out_packed`` / ``out_scales``: contiguous uint8 arrays of n*16 and n bytes; ``out_packed``
    must be 8-byte aligned (fresh numpy/torch allocations are).
    """
    src = np.asarray(raw, dtype=np.uint8).reshape(-1)
    n = src.size // MXFP4_BLOCK_BYTES
    if src.size != n * MXFP4_BLOCK_BYTES or out_packed.size != 16 * n or out_scales.size != n:
        raise ValueError(f"MXFP4 repack: {src.size} source bytes, {out_packed.size} + {out_scales.size} output bytes")
    p = out_packed.reshape(-1)
    s = out_scales.reshape(-1)
    if sys.byteorder != "little" or not (p.flags.c_contiguous and s.flags.c_contiguous) or p.ctypes.data % 8:
        # The word trick assumes little-endian, aligned, contiguous output: plain path otherwise.
        packed, scales = _repack_plain(src, n)
        p[:] = packed.reshape(-1)
        s[:] = scales.reshape(-1)
        return
    out64 = p.view(np.uint64).reshape(n, 2)

    def work(a: int, b: int) -> None:
        _repack_blocks(src[a * MXFP4_BLOCK_BYTES : b * MXFP4_BLOCK_BYTES], out64[a:b], s[a:b])

    if parallel:
        parallel_chunks(n, _CHUNK_BLOCKS, work)
    else:
        for a in range(0, n, _CHUNK_BLOCKS):
            work(a, min(n, a + _CHUNK_BLOCKS))


def _repack_plain(src: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte-level repack (fallback for big-endian hosts or odd outputs): same result, slower."""
    blocks = src.reshape(n, MXFP4_BLOCK_BYTES)
    payload = blocks[:, 1:]
    codes = np.concatenate([payload & 0x0F, payload >> 4], axis=-1)  # [n, 32] in element order
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, blocks[:, 0].copy()


def gguf_mxfp4_to_kt(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Repack GGUF MXFP4 [rows, cols] into kt-kernel's (nibbles [rows, cols/2], scales [rows, cols/32]).

    No value is dequantized: codes and exponents are moved, so the result is bit-exact.
    """
    flat = _check(raw, rows, cols)
    packed = np.empty((rows, cols // 2), dtype=np.uint8)
    scales = np.empty((rows, cols // MXFP4_BLOCK_VALUES), dtype=np.uint8)
    gguf_mxfp4_into(flat, packed, scales)
    return packed, scales


def dequant_kt_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Float64 reference dequantization of kt-kernel's MXFP4 layout (for tests and checks)."""
    rows, half = packed.shape
    codes = np.empty((rows, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    scale = np.ldexp(1.0, scales.astype(np.int32) - 127)
    return E2M1_VALUES[codes] * np.repeat(scale, MXFP4_BLOCK_VALUES, axis=1)
