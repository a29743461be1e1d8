"""Stand-in for the POSIX-only `fcntl` module: `flock` for SGLang's file locks on Windows.

SGLang 0.5.23 imports `fcntl` at module level in its JIT loader, load snapshots and extension
loaders, and only ever calls `flock(fd, LOCK_EX | LOCK_SH | LOCK_UN [| LOCK_NB])`. On Windows the
lock is a byte-range lock on the first byte through msvcrt.locking (shared locks are taken as
exclusive: Windows' CRT has no shared mode); elsewhere (Linux under WINPORT_EMULATE_WINDOWS=1) a
per-process lock table stands in, which is enough for the single-process paths that run there.
"""

from __future__ import annotations

import os
import sys
import threading

from shims._missing import missing_getattr

LOCK_SH = 1
LOCK_EX = 2
LOCK_NB = 4
LOCK_UN = 8

_locks: dict[int, threading.Lock] = {}
_table_lock = threading.Lock()


def _fileno(fd: object) -> int:
    return fd if isinstance(fd, int) else fd.fileno()  # type: ignore[attr-defined]


def flock(fd: object, operation: int) -> None:
    """Replaces fcntl.flock (advisory whole-file lock)."""
    n = _fileno(fd)
    blocking = not operation & LOCK_NB
    if sys.platform == "win32":
        import msvcrt

        os.lseek(n, 0, os.SEEK_SET)
        if operation & LOCK_UN:
            msvcrt.locking(n, msvcrt.LK_UNLCK, 1)
        else:
            msvcrt.locking(n, msvcrt.LK_LOCK if blocking else msvcrt.LK_NBLCK, 1)
        return
    with _table_lock:
        lock = _locks.setdefault(n, threading.Lock())
    if operation & LOCK_UN:
        if lock.locked():
            lock.release()
        return
    if not lock.acquire(blocking=blocking):
        raise BlockingIOError(11, "Resource temporarily unavailable")


__getattr__ = missing_getattr("fcntl", "the POSIX fcntl module")
