"""Back DeepSeek-V4.1's engram host tables with a memory-mapped file in winport's cache.

Targets sglang 0.5.23 `srt/layers/engram.py:_HostTable.__init__` (used when
SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1: the engram rows live in host memory that the GPU reads).
Upstream backs the 'shared' layout with a Linux memfd (`os.memfd_create`) that the other TP ranks
open through `/proc/<pid>/fd/<n>`, mapped with `mmap.MAP_SHARED`, and the 'per_rank' layout with
an anonymous `MAP_PRIVATE | MAP_ANONYMOUS` map; both then `madvise(MADV_HUGEPAGE)`. Windows has no
memfd, no /proc, none of those mmap flags and no madvise. winport's design reads engram tables from
memory-mapped files anyway, so here every table is a file under `<winport cache>/engram/`:
rank 0 creates it at the table's size ('shared': one file, its path broadcast to the other ranks,
which map the same file; 'per_rank': one file per rank), mapped with Python's portable
`mmap.mmap(fileno, length)` (shared and writable on Linux and Windows). The rest is upstream's:
the byte view, the barrier so every rank holds the mapping before rank 0 goes on, and the
cudaHostRegister pin plus device pointer when CUDA is present. The files are removed at exit
(best effort: Windows keeps a mapped file until the process ends).

Applied only where `os.memfd_create` is missing (Windows, and Linux under WINPORT_EMULATE_WINDOWS=1):
on Linux the upstream memfd + huge pages stay, since a file mapping gets no transparent huge pages
and upstream measures ~10x slower lookups without them. The upstream check runs everywhere.
"""

from __future__ import annotations

import atexit
import mmap
import os
from pathlib import Path
from typing import Any

from winport.patches._base import require_source

TARGET = "sglang.srt.layers.engram._HostTable"


def _table_file(name: str, nbytes: int, tag: str) -> Path:
    from winport.paths import cache_dir

    folder = cache_dir() / "engram"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}-{tag}-{nbytes}.bin"


def _create(path: Path, nbytes: int) -> None:
    with open(path, "wb") as f:
        f.truncate(nbytes)

    def remove() -> None:
        try:
            path.unlink()
        except OSError:
            pass  # Windows: still mapped by a process that has not exited yet

    atexit.register(remove)


def _init(self: Any, layout: str, nbytes: int, name: str, group: Any) -> None:
    """_HostTable.__init__ over a file-backed shared mapping (see the module docstring)."""
    import torch
    from sglang.srt.layers import engram

    if layout not in ("shared", "per_rank"):
        raise ValueError(f"Invalid SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT={layout!r}; expected 'shared' or 'per_rank'")
    self.layout, self.nbytes, self.group, self.dirty = layout, nbytes, group, False
    rank = group.rank_in_group
    if layout == "shared":
        path = None
        if rank == 0:
            path = _table_file(name, nbytes, f"pid{os.getpid()}")
            _create(path, nbytes)
        path = Path(group.broadcast_object(None if path is None else str(path), src=0))
    else:
        path = _table_file(name, nbytes, f"pid{os.getpid()}-rank{rank}")
        _create(path, nbytes)
    # Kept open for the life of the table (upstream keeps its memfd the same way).
    self.fd = open(path, "r+b")  # noqa: SIM115
    self.path = path
    self.mm = mmap.mmap(self.fd.fileno(), nbytes)
    self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
    if layout == "shared":
        group.barrier()
    if torch.cuda.is_available():
        err = torch.cuda.cudart().cudaHostRegister(self.bytes.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister({nbytes} bytes) of {path} failed: {err}")
        self.device_ptr = engram._registered_device_ptr(self.bytes.data_ptr())
    else:
        self.device_ptr = self.bytes.data_ptr()


def apply() -> None:
    """Replace the constructor (the rest of _HostTable works on any byte mapping) where there is no memfd."""
    import importlib

    if hasattr(os, "memfd_create"):
        return

    module = importlib.import_module("sglang.srt.layers.engram")
    module._HostTable.__init__ = _init


def register_patch() -> None:
    """Check that upstream still builds the table from a memfd / anonymous map, then replace it."""
    require_source(f"{TARGET}.__init__", "self._open_shared_fd(nbytes, name)", "mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS",
                   "torch.frombuffer(self.mm, dtype=torch.uint8)", "cudaHostRegister")
    require_source(f"{TARGET}._open_shared_fd", "os.memfd_create(name, 0)")
    require_source(f"{TARGET}.finish_load", "self.group.barrier()")
    apply()
