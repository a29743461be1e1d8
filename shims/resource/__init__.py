"""Stand-in for the POSIX-only `resource` module, for SGLang's `set_ulimit` on Windows.

SGLang 0.5.23 imports `resource` unconditionally (srt/utils/common.py) and raises the open-file
and stack limits at start-up. Windows has no per-process rlimits of these kinds (handles are
bounded by the kernel, thread stacks are set per thread), so the limits read as unlimited and
setting them is accepted and changes nothing. prometheus_client (SGLang's --enable-metrics) calls
getpagesize() at import and falls back to 4096 only on ImportError, which this module's presence
prevents: getpagesize is here too.
"""

from __future__ import annotations

import mmap

from shims._missing import missing_getattr

RLIM_INFINITY = -1
RLIMIT_CPU = 0
RLIMIT_FSIZE = 1
RLIMIT_DATA = 2
RLIMIT_STACK = 3
RLIMIT_CORE = 4
RLIMIT_NOFILE = 7
RLIMIT_AS = 9

_KNOWN = {RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_DATA, RLIMIT_STACK, RLIMIT_CORE, RLIMIT_NOFILE, RLIMIT_AS}
error = OSError


def getrlimit(resource: int) -> tuple[int, int]:
    """Replaces resource.getrlimit: every known limit is (RLIM_INFINITY, RLIM_INFINITY)."""
    if resource not in _KNOWN:
        raise ValueError(f"invalid resource specified: {resource}")
    return (RLIM_INFINITY, RLIM_INFINITY)


def setrlimit(resource: int, limits: tuple[int, int]) -> None:
    """Replaces resource.setrlimit: accepted, nothing to change on Windows."""
    if resource not in _KNOWN:
        raise ValueError(f"invalid resource specified: {resource}")


def getpagesize() -> int:
    """Replaces resource.getpagesize: the system's page size (mmap.PAGESIZE, 4096 on x64 Windows)."""
    return mmap.PAGESIZE


__getattr__ = missing_getattr("resource", "the POSIX resource module")
