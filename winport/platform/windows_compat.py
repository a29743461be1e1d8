"""Windows fixes that must be in place before SGLang is imported (applied by winport._bootstrap).

Each targets a module-level statement of sglang 0.5.23 that fails while importing on Windows:
- `srt/mem_cache/storage/mmap/mmap_allocator.py` reads `mmap.PROT_READ` (and friends) at import;
  Windows' mmap module has no PROT_*/MAP_* constants. The allocator is never used on Windows, so
  the POSIX values are defined for the import to succeed.
- `srt/disaggregation/common/conn.py` sets `zmq.MAX_SOCKETS` to 16384 at class definition; Windows'
  libzmq 4.3.5 refuses more than 8192 ("Invalid argument"). SGLang reads the number from
  SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS, which is given a Windows-safe default here.
Standard library only: runs at interpreter start.
"""

from __future__ import annotations

import sys
import types
from collections.abc import MutableMapping

from winport import envs

MMAP_CONSTANTS = {"PROT_READ": 1, "PROT_WRITE": 2, "PROT_EXEC": 4, "MAP_SHARED": 1, "MAP_PRIVATE": 2}
ZMQ_MAX_SOCKETS_ENV = envs.SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS.name
WINDOWS_ZMQ_MAX_SOCKETS = "8192"


def apply(mmap_module: types.ModuleType | None = None, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Apply the fixes (to the given module/environment, for tests); return what was changed."""
    import mmap as real_mmap

    target = real_mmap if mmap_module is None else mmap_module
    changed = []
    for name, value in MMAP_CONSTANTS.items():
        if not hasattr(target, name):
            setattr(target, name, value)
            changed.append(f"mmap.{name}")
    if envs.set_default(envs.SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS, WINDOWS_ZMQ_MAX_SOCKETS, environ):
        changed.append(ZMQ_MAX_SOCKETS_ENV)
    return changed


def apply_if_windows() -> list[str]:
    """Apply on Windows only (Linux has the constants and a libzmq that accepts 16384)."""
    return apply() if sys.platform == "win32" else []
