"""Timing and the copy-bandwidth roofline shared by the benchmark scripts (run them from the repo
root as `python3 scripts/bench/<name>.py`; this module is imported as a sibling)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def cuda_time(fn: Callable[[], object], iters: int = 50, warmup: int = 5) -> float:
    """Mean GPU seconds per call (CUDA events around `iters` back-to-back calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3 / iters


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Median milliseconds of one call of `fn` over `reps` timed calls, after `warmup` untimed ones.

    CUDA events around each call on a GPU, perf_counter on the CPU; the median keeps one slow call
    (a compile, a clock change) out of the figure.
    """
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def graph_time(fn: Callable[[], object], iters: int = 50) -> float:
    """Mean GPU seconds per call of `fn` replayed from a CUDA graph (no Python launch overhead)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return cuda_time(g.replay, iters=iters)


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second (the memory roofline)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = cuda_time(lambda: y.copy_(x), iters=20)
    return 2 * x.numel() / t
