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
Row chunks are sized to stay in the CPU's L2 cache and run on a thread pool.

Why it scales with threads: numpy releases the GIL inside each of these array loops but holds it
while it sets a call up (argument parsing, type resolution, ~0.5-1 us). A work item is 26 such
calls taking ~12 us in all (shift amounts and masks are 0-d arrays and ``out`` is positional:
numpy scalars as operands cost ~1.1 us per call instead of ~0.7 us; the scratch is contiguous
even for ragged items); items of 32768 blocks (557 kB of source, ~450 us of work on one core)
keep that serial share near 3%. The previous items (8192 blocks, scalar operands, strided scratch)
spent ~35-40 us of ~125-130 us that way (~26-28%), capping the pool near 3x however many threads
it had; on 2 free cores they ran slower with 2 threads than with 1. Work items of several expert
matrices are pooled in one call (:func:`gguf_mxfp4_into_many`), so one expert smaller than
threads x item still fills every thread. Numbers: scripts/bench/RESULTS.md, issue 6 section.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kernels_triton.formats import GGML_BLOCKS, GGMLType
from winport import envs

MXFP4_BLOCK_VALUES, MXFP4_BLOCK_BYTES = GGML_BLOCKS[GGMLType.MXFP4]  # 32 values in 17 bytes

def _c(v: int) -> np.ndarray:
    """A uint64 constant as a 0-d array: numpy takes these ~35% faster per call than numpy scalars."""
    return np.array(v, dtype=np.uint64)


# (shift, mask of the lower field of each swapped pair): nibble 1<->2 of every 16 bits, byte
# 1<->2 of every 32 bits, 16-bit unit 1<->2 of every 64 bits.
_UNZIP_STAGES = (
    (_c(4), _c(0x00F000F000F000F0)),
    (_c(8), _c(0x0000FF000000FF00)),
    (_c(16), _c(0x00000000FFFF0000)),
)
_LOW32 = _c(0xFFFFFFFF)
_S32 = _c(32)
# Blocks per work item, when WINPORT_GGUF_REPACK_CHUNK sets it (None: chunk_blocks() picks).
_CHUNK_BLOCKS: int | None = envs.WINPORT_GGUF_REPACK_CHUNK.get()
# 32768 blocks = 557 kB of source and 2 x 512 kB of uint64 scratch (L2-sized on current desktop and
# server cores): fastest on one to a few threads; see the module docstring for why not smaller.
_CHUNK_FEW_THREADS = 32768
# From 8 threads on, four times that: the threads queue for the GIL at each numpy call's set-up,
# and fewer, longer calls per byte won on the 16-core H200 host (experts 2.58-2.63 GB/s against
# 1.49-1.52 at 8 and 15 threads, medians of 3; scripts/bench/RESULTS.md, issue 22), while one
# thread ran slower with the scratch out of L2.
_CHUNK_MANY_THREADS = 131072
_MANY_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_threads: int | None = None  # torch's intra-op thread count, read once (see parallel_chunks)
_pool_lock = threading.Lock()
_scratch = threading.local()


def conversion_threads() -> int:
    """Worker threads for load-time conversion: torch's intra-op thread count (physical cores)."""
    env = envs.WINPORT_GGUF_THREADS.get()
    if env is not None:
        return max(1, env)
    global _threads
    if _threads is None:
        try:
            import torch

            _threads = max(1, torch.get_num_threads())
        except ImportError:  # pragma: no cover - torch is a dependency of the loader
            _threads = max(1, os.cpu_count() or 1)
    return _threads


def chunk_blocks() -> int:
    """MXFP4 blocks per repacking work item: WINPORT_GGUF_REPACK_CHUNK, else by conversion threads."""
    if _CHUNK_BLOCKS is not None:
        return max(1, _CHUNK_BLOCKS)
    return _CHUNK_MANY_THREADS if conversion_threads() >= _MANY_THREADS else _CHUNK_FEW_THREADS


def parallel_chunks(n: int, step: int, fn: Callable[[int, int], None]) -> None:
    """Run ``fn(start, stop)`` over [0, n) in pieces of ``step`` on the conversion thread pool.

    Small jobs (one piece) or one thread run inline. The calling thread works too (it would only
    wait otherwise), and every thread takes the next piece from a shared counter, so a call costs
    ``threads - 1`` task submissions however many pieces it has. Exceptions propagate to the
    caller once every thread has stopped (no piece is left running behind the caller's back).
    """
    pieces = [(i, min(n, i + step)) for i in range(0, n, step)]
    threads = min(conversion_threads(), len(pieces))
    torch = _torch_or_none()
    prev = torch.get_num_threads() if torch is not None else 1
    if torch is not None and prev > 1:
        # The pool is the parallelism: each torch op of a work item runs on its own thread. Without
        # this every op (above ATen's 32768-value grain) would also start an OpenMP team per pool
        # thread, oversubscribing the cores; measured 10x slower when other processes hold cores.
        # Also when running inline: one conversion thread means one thread (WINPORT_GGUF_THREADS=1
        # is how the thread-scaling benchmark gets its baseline). Process-wide; restored after.
        torch.set_num_threads(1)
    try:
        if threads <= 1:
            for a, b in pieces:
                fn(a, b)
        else:
            _run_pool(pieces, threads, fn)
    finally:
        if torch is not None and prev > 1:
            torch.set_num_threads(prev)


def _run_pool(pieces: list[tuple[int, int]], threads: int, fn: Callable[[int, int], None]) -> None:
    """``fn`` over ``pieces`` on ``threads`` threads (the caller's included); see parallel_chunks."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < threads - 1:  # noqa: SLF001 - grow on thread change
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="winport-gguf")
        pool = _pool
    counter = itertools.count()  # next() on it is atomic under the GIL
    failed = threading.Event()

    def drain() -> None:
        for i in counter:
            if i >= len(pieces) or failed.is_set():
                return
            try:
                fn(*pieces[i])
            except BaseException:
                failed.set()
                raise

    futs = [pool.submit(drain) for _ in range(threads - 1)]
    err: BaseException | None = None
    try:
        drain()
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the workers stopped
        err = e
    for fut in futs:
        if fut.cancel():  # never started: the counter is exhausted, nothing left for it to do
            continue
        try:
            fut.result()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    if err is not None:
        raise err


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
    if buf is None or buf.size < 4 * m:
        buf = _scratch.buf = np.empty(4 * max(m, chunk_blocks()), dtype=np.uint64)
    # Both scratch arrays contiguous [2, m] whatever m is (a [:, :m] slice of a wider buffer is
    # strided, and numpy's 2-D strided loops cost ~2x the per-call overhead on ragged items).
    x, t = buf[: 2 * m].reshape(2, m), buf[2 * m : 4 * m].reshape(2, m)
    # ``out`` positional everywhere: the keyword costs parsing time, and that time holds the GIL.
    rshift, lshift, xor, band = np.right_shift, np.left_shift, np.bitwise_xor, np.bitwise_and
    # Plane 0 = payload bytes 0-7 of every block, plane 1 = bytes 8-15 (unaligned strided view).
    words = np.ndarray((2, m), dtype="<u8", buffer=src, offset=1, strides=(8, MXFP4_BLOCK_BYTES))
    np.copyto(x, words)
    for s, mask in _UNZIP_STAGES:  # delta swap: t = ((x >> s) ^ x) & mask; x ^= t ^ (t << s)
        rshift(x, s, t)
        xor(t, x, t)
        band(t, mask, t)
        xor(x, t, x)
        lshift(t, s, t)
        xor(x, t, x)
    # Now each word is (low nibbles of its 8 bytes) | (high nibbles) << 32. Swap w0's high half
    # with w1's low half, writing straight into the output's two words per block.
    x0, x1, t0 = x[0], x[1], t[0]
    rshift(x0, _S32, t0)
    xor(t0, x1, t0)
    band(t0, _LOW32, t0)
    xor(x1, t0, out64[:, 1])
    lshift(t0, _S32, t0)
    xor(x0, t0, out64[:, 0])
    np.copyto(out_s, src.reshape(m, MXFP4_BLOCK_BYTES)[:, 0])


def gguf_mxfp4_into(raw: np.ndarray, out_packed: np.ndarray, out_scales: np.ndarray, *,
                    parallel: bool = True) -> None:
    """Repack GGUF MXFP4 bytes of n blocks into preallocated kt arrays (uint8, n*16 and n bytes).

    ``raw``: the stored bytes (any shape, contiguous, e.g. a read-only memory-map view).
    ``out_packed`` / ``out_scales``: contiguous uint8 arrays of n*16 and n bytes; ``out_packed``
    must be 8-byte aligned (fresh numpy/torch allocations are).
    """
    gguf_mxfp4_into_many([(raw, out_packed, out_scales)], parallel=parallel)


def gguf_mxfp4_into_many(jobs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], *,
                         parallel: bool = True) -> None:
    """:func:`gguf_mxfp4_into` for several (raw, out_packed, out_scales) jobs in one pool call.

    Every job is checked before any is converted; the work items of all jobs share the pool, so
    small matrices (one expert each) still keep every thread busy.
    """
    checked = []
    for k, (raw, out_packed, out_scales) in enumerate(jobs):
        src = np.asarray(raw, dtype=np.uint8).reshape(-1)
        n = src.size // MXFP4_BLOCK_BYTES
        if src.size != n * MXFP4_BLOCK_BYTES or out_packed.size != 16 * n or out_scales.size != n:
            raise ValueError(f"MXFP4 repack (job {k}): {src.size} source bytes, "
                             f"{out_packed.size} + {out_scales.size} output bytes")
        checked.append((src, n, out_packed.reshape(-1), out_scales.reshape(-1)))
    items: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]] = []
    step = chunk_blocks()
    for src, n, p, s in checked:
        if sys.byteorder != "little" or not (p.flags.c_contiguous and s.flags.c_contiguous) or p.ctypes.data % 8:
            # The word trick assumes little-endian, aligned, contiguous output: plain path otherwise.
            packed, scales = _repack_plain(src, n)
            p[:] = packed.reshape(-1)
            s[:] = scales.reshape(-1)
            continue
        out64 = p.view(np.uint64).reshape(n, 2)
        items += [(src, out64, s, a, min(n, a + step)) for a in range(0, n, step)]

    def work(i0: int, i1: int) -> None:
        for src, out64, s, a, b in items[i0:i1]:
            _repack_blocks(src[a * MXFP4_BLOCK_BYTES : b * MXFP4_BLOCK_BYTES], out64[a:b], s[a:b])

    if parallel:
        parallel_chunks(len(items), 1, work)
    else:
        work(0, len(items))


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
    """Float64 dequantization of kt-kernel's MXFP4 layout (for tests and checks): the MXFP4
    reference, kernels_triton.formats.codecs.dequantize_mxfp4, on numpy arrays (E8M0 255 is NaN)."""
    import torch

    from kernels_triton.formats.codecs import dequantize_mxfp4

    p = torch.from_numpy(np.ascontiguousarray(packed, dtype=np.uint8))
    s = torch.from_numpy(np.ascontiguousarray(scales, dtype=np.uint8))
    return dequantize_mxfp4(p, s, torch.float64).numpy()
