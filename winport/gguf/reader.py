"""Memory-mapped, zero-copy GGUF reader: single files and llama.cpp split shards.

Why not gguf-py's GGUFReader: it raises on type ids it does not know (the fork ids DeepSeek-V4
GGUFs use) and parses more than needed eagerly. This reader validates everything it reads against
the file size before allocating, so a malformed file gives a GGUFError, never a crash, a hang or a
huge allocation.

Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 kv count, the
key/value pairs, the tensor infos (name, u32 n_dims, u64 dims[n_dims] innermost first, u32 type,
u64 offset relative to the data section), then the data section at the next multiple of
``general.alignment`` (default 32).
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import re
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from winport import envs

from .dequant import dequantize
from .errors import GGUFError
from .types import (
    GGML_MAX_DIMS,
    GGML_TYPES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_SUPPORTED_VERSIONS,
    PLAIN_DTYPES,
    SCALAR_VALUE_DTYPES,
    GGMLTypeInfo,
    GGUFValueType,
)

# Arrays of arrays are legal GGUF but nothing real nests deeper than this; the bound keeps a
# crafted file from recursing without limit.
_MAX_ARRAY_DEPTH = 3
_MAX_ALIGNMENT = 1 << 20
_SHARD_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: where its bytes are and how to read them."""

    name: str
    ggml_dims: tuple[int, ...]  # innermost first, as stored
    type: GGMLTypeInfo
    offset: int  # absolute byte offset in ``path``
    nbytes: int
    path: Path
    _file: GGUFFile = field(repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape in numpy (row-major) order: the reverse of the stored dims."""
        return tuple(reversed(self.ggml_dims))

    @property
    def n_elements(self) -> int:
        """Number of logical values."""
        n = 1
        for d in self.ggml_dims:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        """GGML type name, e.g. ``Q8_0``."""
        return self.type.name

    def raw(self) -> np.ndarray:
        """The stored bytes as a read-only uint8 view of the memory map (no copy)."""
        return self._file._view(self.offset, self.nbytes)

    def raw_rows(self) -> np.ndarray:
        """The stored bytes as uint8 [n_rows, row_bytes] (rows = all but the innermost axis)."""
        row_bytes = self.type.row_bytes(self.ggml_dims[0]) if self.ggml_dims else self.nbytes
        n_rows = self.nbytes // row_bytes if row_bytes else 0
        return self.raw().reshape(n_rows, row_bytes)

    def plain(self) -> np.ndarray:
        """Zero-copy typed view for plain types (F32, F16, BF16 as uint16, F64, I8..I64)."""
        dt = PLAIN_DTYPES.get(self.type.name)
        if dt is None:
            raise GGUFError(f"{self.path}: tensor {self.name!r} of type {self.type.name} is not plain")
        return self.raw().view(dt).reshape(self.shape)

    def dequantize(self, dtype: Any = np.float32) -> np.ndarray:
        """Dequantize to a new array of ``dtype`` in the logical shape."""
        return dequantize(self.raw(), self.type.id, self.shape, dtype=dtype, name=self.name, path=self.path)

    def prefetch(self) -> None:
        """Ask the OS to start reading this tensor's bytes into the page cache (POSIX_FADV_WILLNEED
        from a background thread; returns at once), so a loader that converts the tensor before it
        finds them there instead of faulting them in 128 KiB at a time. No-op on Windows."""
        self._file._prefetch(self.offset, self.nbytes)

    def release(self) -> None:
        """Tell the OS this tensor's bytes are in their final place: unmap its pages and drop them from
        the page cache (Linux; a later read goes to the disk)."""
        self._file._release(self.offset, self.nbytes)


_PREFETCH: concurrent.futures.ThreadPoolExecutor | None = None


def _prefetcher() -> concurrent.futures.ThreadPoolExecutor:
    global _PREFETCH
    if _PREFETCH is None:
        _PREFETCH = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gguf-prefetch")
    return _PREFETCH


def _advise_willneed(fd: int, start: int, length: int) -> None:
    try:
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # advice only (the file may be closed by now): a refusal costs speed, never correctness


class _Cursor:
    """Bounds-checked little-endian reader over a buffer; every read names what it reads."""

    def __init__(self, buf: Any, path: Path, size: int) -> None:
        self.buf = buf
        self.path = path
        self.size = size
        self.pos = 0

    def fail(self, what: str, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}: {problem}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                what,
                f"truncated file: needs {n} bytes at offset {self.pos}, file has {self.size}",
            )

    def remaining(self) -> int:
        return self.size - self.pos

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, *, strict: bool = True) -> str:
        n = self.u64(what + " (string length)")
        if n > self.remaining():
            raise self.fail(
                what,
                f"absurd string length {n} at offset {self.pos - 8} (only {self.remaining()} bytes left)",
            )
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise self.fail(what, f"string is not valid UTF-8 ({exc.reason})") from None
            # Token texts are kept byte-exact so a tokenizer can be rebuilt from them.
            return raw.decode("utf-8", errors="surrogateescape")


def _read_value(cur: _Cursor, vtype: int, what: str, depth: int = 0) -> Any:
    """Read one metadata value of type ``vtype``; arrays of numbers come back as numpy arrays."""
    if vtype in SCALAR_VALUE_DTYPES:
        dt = np.dtype(SCALAR_VALUE_DTYPES[vtype])
        cur.need(dt.itemsize, what)
        v = np.frombuffer(cur.buf, dtype=dt, count=1, offset=cur.pos)[0]
        cur.pos += dt.itemsize
        if vtype == GGUFValueType.BOOL:
            return bool(v)
        return v.item()
    if vtype == GGUFValueType.STRING:
        return cur.string(what, strict=False)
    if vtype == GGUFValueType.ARRAY:
        if depth >= _MAX_ARRAY_DEPTH:
            raise cur.fail(what, f"arrays nested deeper than {_MAX_ARRAY_DEPTH}")
        etype = cur.u32(what + " (array element type)")
        count = cur.u64(what + " (array length)")
        if etype in SCALAR_VALUE_DTYPES:
            dt = np.dtype(SCALAR_VALUE_DTYPES[etype])
            if count > cur.remaining() // dt.itemsize:
                raise cur.fail(what, f"absurd array length {count} (only {cur.remaining()} bytes left)")
            arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos).copy()
            cur.pos += count * dt.itemsize
            return arr.astype(bool) if etype == GGUFValueType.BOOL else arr
        if etype in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            # Each element takes at least 8 (string length) or 12 (array header) bytes.
            min_size = 8 if etype == GGUFValueType.STRING else 12
            if count > cur.remaining() // min_size:
                raise cur.fail(what, f"absurd array length {count} (only {cur.remaining()} bytes left)")
            return [_read_value(cur, etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise cur.fail(what, f"unknown array element type id {etype}")
    raise cur.fail(what, f"unknown value type id {vtype}")


class GGUFFile:
    """One GGUF file, memory-mapped read-only. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fh = None
        self._mm: mmap.mmap | None = None
        self.drop_page_cache = not envs.WINPORT_GGUF_KEEP_PAGE_CACHE.get()  # read by _release
        try:
            self._fh = open(self.path, "rb")
            size = os.fstat(self._fh.fileno()).st_size
            self.size = size
            if size == 0:
                raise GGUFError(f"{self.path}: header: empty file")
            # ACCESS_READ (not copy-on-write): on Windows a copy-on-write view is charged against
            # the commit limit for its whole size, which a 300 GB model cannot afford.
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse()
        except OSError as exc:
            self.close()
            raise GGUFError(f"{self.path}: cannot open/map: {exc}") from None
        except GGUFError:
            self.close()
            raise

    # -- parsing -------------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(self._mm, self.path, self.size)
        cur.need(4, "header (magic)")
        magic = bytes(self._mm[0:4])
        cur.pos = 4
        if magic != GGUF_MAGIC:
            raise cur.fail("header", f"bad magic {magic!r} (expected {GGUF_MAGIC!r}; not a GGUF file)")
        version = cur.u32("header (version)")
        if version not in GGUF_SUPPORTED_VERSIONS:
            if version and version & 0xFFFF == 0:
                raise cur.fail("header", f"version {version:#x} looks big-endian; only little-endian GGUF is supported")
            raise cur.fail("header", f"unsupported version {version} (supported: {GGUF_SUPPORTED_VERSIONS})")
        self.version = version
        n_tensors = cur.u64("header (tensor count)")
        n_kv = cur.u64("header (kv count)")
        # Minimum on-disk sizes: a kv is key length (8) + value type (4) + 1 byte; a tensor info
        # is name length (8) + n_dims (4) + type (4) + offset (8).
        if n_kv > cur.remaining() // 13:
            raise cur.fail("header", f"absurd kv count {n_kv} for a file of {self.size} bytes")
        if n_tensors > cur.remaining() // 24:
            raise cur.fail("header", f"absurd tensor count {n_tensors} for a file of {self.size} bytes")

        metadata: dict[str, Any] = {}
        value_types: dict[str, int] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            if key in metadata:
                raise cur.fail(f"metadata key {key!r}", "duplicate key")
            vtype = cur.u32(f"metadata key {key!r} (value type)")
            metadata[key] = _read_value(cur, vtype, f"metadata key {key!r}")
            value_types[key] = vtype
        self.metadata = metadata
        self.value_types = value_types

        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment > _MAX_ALIGNMENT
            or alignment & (alignment - 1)
        ):
            raise cur.fail("metadata key 'general.alignment'", f"bad alignment {alignment!r} (need a power of two <= {_MAX_ALIGNMENT})")
        self.alignment = alignment

        infos: list[tuple[str, tuple[int, ...], GGMLTypeInfo, int]] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = cur.string(f"tensor info #{i} (name)")
            what = f"tensor {name!r}"
            if name in seen:
                raise cur.fail(what, "duplicate tensor name")
            seen.add(name)
            n_dims = cur.u32(what + " (n_dims)")
            if n_dims > GGML_MAX_DIMS:
                raise cur.fail(what, f"absurd n_dims {n_dims} (max {GGML_MAX_DIMS})")
            dims = tuple(cur.u64(what + " (dims)") for _ in range(n_dims))
            tid = cur.u32(what + " (type)")
            tinfo = GGML_TYPES.get(tid)
            if tinfo is None:
                raise cur.fail(what, f"unknown GGML type id {tid}")
            offset = cur.u64(what + " (offset)")
            infos.append((name, dims, tinfo, offset))

        data_start = -(-cur.pos // alignment) * alignment
        if data_start > self.size and n_tensors:
            raise cur.fail("data section", f"starts at {data_start}, past the end of the file ({self.size} bytes)")
        self.data_start = data_start
        data_size = max(0, self.size - data_start)

        tensors: dict[str, GGUFTensor] = {}
        for name, dims, tinfo, offset in infos:
            what = f"tensor {name!r}"
            if dims and dims[0] % tinfo.block_size:
                raise cur.fail(what, f"row length {dims[0]} is not a multiple of the {tinfo.name} block size {tinfo.block_size}")
            n = 1
            for d in dims:
                n *= d
            nbytes = n // tinfo.block_size * tinfo.type_size
            if offset % alignment:
                raise cur.fail(what, f"offset {offset} is not a multiple of the alignment {alignment}")
            if offset > data_size or nbytes > data_size - offset:
                raise cur.fail(
                    what,
                    f"data [{offset}, {offset + nbytes}) runs past the end of the data section "
                    f"({data_size} bytes; file truncated or offset past the end)",
                )
            tensors[name] = GGUFTensor(name, dims, tinfo, data_start + offset, nbytes, self.path, self)

        ordered = sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes))
        # Sorted by start, a tensor overlaps an earlier one iff it starts before the furthest end
        # seen so far.
        furthest: GGUFTensor | None = None
        for t in ordered:
            if not t.nbytes:
                continue
            if furthest is not None and t.offset < furthest.offset + furthest.nbytes:
                raise cur.fail(f"tensor {t.name!r}", f"overlaps tensor {furthest.name!r}")
            if furthest is None or t.offset + t.nbytes > furthest.offset + furthest.nbytes:
                furthest = t
        self.tensors = tensors

    # -- access --------------------------------------------------------------------------------
    def _view(self, offset: int, nbytes: int) -> np.ndarray:
        if self._mm is None:
            raise GGUFError(f"{self.path}: file is closed")
        return np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=offset)

    def _pages(self, offset: int, nbytes: int) -> tuple[int, int]:
        """The page-aligned [start, end) covering [offset, offset + nbytes), clipped to the file."""
        page = mmap.PAGESIZE
        return offset // page * page, min(-(-(offset + nbytes) // page) * page, self.size)

    def _prefetch(self, offset: int, nbytes: int) -> None:
        # POSIX_FADV_WILLNEED queues the reads and may block until they are submitted, so it runs
        # on one background thread (os.posix_fadvise releases the GIL): the caller's conversion
        # goes on meanwhile. Windows has no such call; there it is a no-op.
        if self._fh is None or nbytes <= 0 or not hasattr(os, "posix_fadvise"):
            return
        start, end = self._pages(offset, nbytes)
        if end > start:
            _prefetcher().submit(_advise_willneed, self._fh.fileno(), start, end - start)

    def _release(self, offset: int, nbytes: int) -> None:
        # Called once a tensor's bytes have been copied into their final place (converted, repacked,
        # handed to kt-kernel), so the machine holds them once, not also in the page cache.
        # MADV_DONTNEED on a read-only file mapping unmaps the pages from this process (a later
        # touch faults them back in, so even pages shared with a live zero-copy view stay correct);
        # then POSIX_FADV_DONTNEED drops them from the page cache (pages another mapping still uses
        # stay; a hot-expert swap that reads them again reads the disk; WINPORT_GGUF_KEEP_PAGE_CACHE=1
        # keeps them). Windows has neither: its
        # working-set trimmer and standby list give the memory back under pressure.
        mm = self._mm
        if mm is None or nbytes <= 0:
            return
        start, end = self._pages(offset, nbytes)
        if end <= start:
            return
        if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass
        if hasattr(os, "posix_fadvise") and self._fh is not None and self.drop_page_cache:
            try:
                os.posix_fadvise(self._fh.fileno(), start, end - start, os.POSIX_FADV_DONTNEED)
            except (OSError, ValueError):
                pass

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or ``default``."""
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Unmap and close. Views still alive keep the mapping; it is released when they go."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # numpy views into the map still exist; the map closes when they are collected.
                pass
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """All shards of a split model given any one shard (or a single file: ``[path]``).

    Shards are named ``<stem>-00001-of-0000N.gguf`` as llama.cpp's gguf-split writes them.
    """
    p = Path(path)
    m = _SHARD_RE.match(p.name)
    if not m:
        return [p]
    count = int(m.group("count"))
    if count < 1 or int(m.group("no")) < 1 or int(m.group("no")) > count:
        raise GGUFError(f"{p}: shard name says {m.group('no')} of {m.group('count')}")
    paths = [p.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(q) for q in paths if not q.exists()]
    if missing:
        raise GGUFError(f"{p}: split model is missing {len(missing)} of {count} shards: {', '.join(missing)}")
    return paths


class GGUFModel:
    """A model in one GGUF file or several split shards, seen as one set of tensors.

    Metadata is the first shard's (gguf-split writes the full metadata there and only the
    ``split.*`` keys elsewhere). Tensor names must be unique across shards.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.paths = shard_paths(path)
        self.files: list[GGUFFile] = []
        try:
            for p in self.paths:
                self.files.append(GGUFFile(p))
            self._check_split()
        except BaseException:
            self.close()
            raise
        self.metadata = self.files[0].metadata
        self.tensors: dict[str, GGUFTensor] = {}
        for f in self.files:
            for name, t in f.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{f.path}: tensor {name!r}: also in {self.tensors[name].path}")
                self.tensors[name] = t

    def _check_split(self) -> None:
        n = len(self.files)
        first = self.files[0]
        count = first.get("split.count")
        if n == 1 and count in (None, 1, 0):
            return
        if count != n:
            raise GGUFError(f"{first.path}: metadata key 'split.count' is {count!r}, found {n} shard files")
        total = sum(len(f.tensors) for f in self.files)
        declared = first.get("split.tensors.count")
        if declared is not None and declared != total:
            raise GGUFError(f"{first.path}: metadata key 'split.tensors.count' is {declared}, shards hold {total} tensors")
        for i, f in enumerate(self.files):
            no = f.get("split.no")
            if no != i:
                raise GGUFError(f"{f.path}: metadata key 'split.no' is {no!r}, expected {i}")

    @property
    def arch(self) -> str | None:
        """``general.architecture``."""
        return self.metadata.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or ``default``."""
        return self.metadata.get(key, default)

    def __iter__(self) -> Iterator[GGUFTensor]:
        return iter(self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.paths[0]}: no tensor named {name!r}") from None

    def close(self) -> None:
        """Close every shard."""
        for f in self.files:
            f.close()

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drop_file_page_cache(path: str | Path) -> None:
    """Drop ``path``'s clean pages from the page cache (fsync, then POSIX_FADV_DONTNEED; no privileges
    needed; pages another process maps stay). A cold-cache start for benchmarks and tests; Linux only."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def open_gguf(path: str | os.PathLike[str]) -> GGUFModel:
    """Open a GGUF model (single file or any shard of a split model)."""
    return GGUFModel(path)


def to_torch(arr: np.ndarray) -> Any:
    """A torch tensor sharing memory with ``arr`` (read-only views are shared too; do not write)."""
    import torch

    with warnings.catch_warnings():
        # torch warns that read-only numpy arrays give tensors it cannot protect; the loader never
        # writes into them and documents that consumers must copy.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)
