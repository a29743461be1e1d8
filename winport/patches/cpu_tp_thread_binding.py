"""Bind each CPU tensor-parallel rank to its own CPUs on machines without AMX.

Targets sglang 0.5.23 `srt/distributed/bootstrap.py:_init_cpu_threads_env`. SGLang works out each
rank's CPU list (`numa_utils.init_threads_binding`, from SGLANG_CPU_OMP_THREADS_BIND, which
`winport serve --tp N` sets to equal ranges), but binds only through its sgl_kernel C++ op and only
on AMX or arm64 CPUs; elsewhere it logs a warning and every rank keeps torch's default thread
count over all CPUs. At TP=2 on 2 cores that is 4 busy threads on 2 cores, and a rank's
all-reduce waits on a thread its peer's OpenMP pool has descheduled. Here, when the upstream path
would not bind and a binding was asked for, the rank process is pinned to its CPUs (psutil: works on
Windows and Linux) and torch gets one thread per CPU (or OMP_NUM_THREADS, when set).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from winport import envs
from winport.patches._base import register, require_source

TARGET = "sglang.srt.distributed.bootstrap._init_cpu_threads_env"
logger = logging.getLogger(__name__)


def parse_cpus(spec: Any) -> list[int]:
    """CPU ids from SGLang's per-rank binding: '0-3,8' style text or a sequence of ids."""
    if isinstance(spec, str):
        cpus: list[int] = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi or lo)
            except ValueError:
                raise ValueError(f"SGLANG_CPU_OMP_THREADS_BIND: {spec!r} is not a CPU list like '0-3,8'") from None
            if last < first:
                raise ValueError(f"SGLANG_CPU_OMP_THREADS_BIND: empty CPU range {part!r} in {spec!r}")
            cpus.extend(range(first, last + 1))
        return cpus
    return [int(c) for c in spec]


def bind_current_process(cpus: list[int]) -> int:
    """Pin this process to `cpus` and size torch's intra-op pool to match; return the thread count."""
    import psutil
    import torch

    if not cpus:
        raise ValueError("SGLANG_CPU_OMP_THREADS_BIND gave this rank no CPU")
    # Windows: the process mask covers every thread. Linux: sched_setaffinity(pid) binds only the
    # main thread (and threads created later), so threads already running (an OpenMP pool started
    # while importing) are bound one by one.
    psutil.Process().cpu_affinity(cpus)
    if hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task"):
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, PermissionError):  # a thread that just ended
                pass
    threads = envs.OMP_NUM_THREADS.get()
    if threads is None:
        threads = len(cpus)
    torch.set_num_threads(threads)
    return threads


def _init(original: Any, *args: Any, local_omp_cpuid: Any = None, **kwargs: Any) -> Any:
    from sglang.srt.distributed import bootstrap

    if bootstrap._is_cpu_amx_available or bootstrap._is_cpu_arm64 or not envs.SGLANG_CPU_OMP_THREADS_BIND.is_set():
        return original(*args, local_omp_cpuid=local_omp_cpuid, **kwargs)
    cpus = parse_cpus(local_omp_cpuid)
    threads = bind_current_process(cpus)
    # No shared-memory all-reduce either way (that is the AMX/arm64 C++ path): gloo does it.
    logger.info("winport: this CPU rank runs on CPUs %s with %d torch thread(s)", cpus, threads)
    return None


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, "if _is_cpu_amx_available or _is_cpu_arm64:",
                   "torch.ops.sgl_kernel.init_cpu_threads_env(local_omp_cpuid)",
                   "init_cpu_threads_env and shared memory based AllReduce is disabled")
    require_source("sglang.srt.distributed.bootstrap.init_parallel_runtime",
                   "local_omp_cpuid = _bind_threads_if_cpu(device=device)")
    register(TARGET, _init)
