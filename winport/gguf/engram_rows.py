"""DeepSeek-V4.1 engram rows read at serve time straight from the GGUF file, through a memory map.

The engram hash tables are the largest tensors of V4.1 (one table holds hundreds of GB in the real
model). They are never converted: the checkpoint winport converts a GGUF into (winport.gguf.to_checkpoint)
carries ``engram_gguf.json``, naming for each engram layer the GGUF file, the byte range of its
table and its format; ``winport serve`` hands that file to SGLang's processes (:data:`ENV`), where
the patch ``engram_rows_from_gguf`` gathers the rows each batch asks for from a read-only memory
map of the GGUF. Nothing is copied, and only the pages of the rows looked up are ever read.

The table is one stream of blocks whatever its GGUF row width (winport.gguf.export.engram_gguf_shape
packs rows narrower than a block): MXFP8 blocks hold 8 E8M0 scales (one per 32 values) then 256
e4m3 values; F8_E4M3_B128 blocks one E8M0 exponent then 128 values. Value ``i`` of table row ``r``
is value ``r * dim + i`` of that stream. :meth:`EngramRows.gather` returns SGLang's EngramEmbedding
layout for the gathered rows: e4m3 values [..., dim] and one E8M0 scale per 32 values [..., dim/32].
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winport import envs
from winport.gguf.reader import GGUFError

if TYPE_CHECKING:
    import numpy as np

SIDECAR = "engram_gguf.json"
ENV = envs.WINPORT_ENGRAM_GGUF.name  # path of a converted checkpoint's engram_gguf.json, for SGLang's processes
SCALE_GROUP = 32  # values per E8M0 scale in SGLang's EngramEmbedding


@dataclass(frozen=True)
class BlockFormat:
    """One engram block type: bytes per block, scale bytes at its start, values per block."""

    block_bytes: int
    scale_bytes: int
    values: int

    @property
    def values_per_scale(self) -> int:
        """Values sharing one stored scale byte."""
        return self.values // self.scale_bytes


BLOCKS = {"MXFP8": BlockFormat(264, 8, 256), "F8_E4M3_B128": BlockFormat(129, 1, 128)}


def split_blocks(blocks: np.ndarray, fmt: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 bytes uint8 [n * values], E8M0 bytes uint8 [n * values / 32]) of whole blocks, uint8
    [n, block_bytes], both flat in stream order: the one place the block layout is read, shared by
    :meth:`EngramRows.gather` and the ``engram="copy"`` route (winport.gguf.to_checkpoint.EngramStream)."""
    import numpy as np

    values = np.ascontiguousarray(blocks[:, fmt.scale_bytes :]).reshape(-1)
    scales = blocks[:, : fmt.scale_bytes]
    copies = fmt.values_per_scale // SCALE_GROUP
    if copies > 1:  # SGLang keeps one scale per 32 values, F8_E4M3_B128 stores one per 128
        scales = np.repeat(scales, copies, axis=1)
    return values, np.ascontiguousarray(scales).reshape(-1)


def check_table(path: str, tensor: str, type_name: str, nbytes: int, rows: int, dim: int) -> BlockFormat:
    """The block format of an engram table, after checking it holds exactly ``rows`` x ``dim`` values.

    Every problem is a GGUFError naming the file and the tensor."""
    fmt = BLOCKS.get(type_name)
    if fmt is None:
        raise GGUFError(f"{path}: tensor {tensor!r}: engram table stored as {type_name}, expected one of "
                        f"{', '.join(BLOCKS)}")
    if dim <= 0 or dim % SCALE_GROUP or rows < 0:
        raise GGUFError(f"{path}: tensor {tensor!r}: engram rows of {dim} values are not whole "
                        f"{SCALE_GROUP}-value scale groups")
    if nbytes % fmt.block_bytes:
        raise GGUFError(f"{path}: tensor {tensor!r}: {nbytes} bytes are not whole {type_name} blocks")
    n_blocks = nbytes // fmt.block_bytes
    if not (rows * dim <= n_blocks * fmt.values < rows * dim + fmt.values):
        raise GGUFError(f"{path}: tensor {tensor!r}: {n_blocks} {type_name} blocks do not hold exactly "
                        f"{rows} rows x {dim} values (engram hparams)")
    return fmt


@dataclass(frozen=True)
class EngramSource:
    """Where one layer's engram table lies in a GGUF file (one entry of ``engram_gguf.json``)."""

    layer: int
    target: str  # SGLang checkpoint prefix, e.g. "layers.2.engram.embed"
    path: str  # the GGUF file (absolute)
    tensor: str  # its GGUF tensor name, for messages
    offset: int  # first byte of the table in the file
    nbytes: int
    type: str  # a key of BLOCKS
    rows: int
    dim: int
    file_size: int  # the GGUF's size when converted: a changed file is refused


def write_sources(folder: Path, sources: list[EngramSource]) -> Path:
    """Write ``folder/engram_gguf.json``."""
    out = Path(folder) / SIDECAR
    out.write_text(json.dumps({"engram_tables": [asdict(s) for s in sources]}, indent=1))
    return out


def read_sources(path: str | os.PathLike[str]) -> dict[int, EngramSource]:
    """The tables of an ``engram_gguf.json`` by layer; a malformed file is a GGUFError naming it."""
    try:
        entries = json.loads(Path(path).read_text())["engram_tables"]
        sources = [EngramSource(**e) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GGUFError(f"{path}: not a winport engram table list ({e!r})") from e
    return {s.layer: s for s in sources}


class EngramRows:
    """Read-only memory map of one engram table in its GGUF file, gathered row by row."""

    def __init__(self, source: EngramSource) -> None:
        import numpy as np

        self.source = source
        self.fmt = check_table(source.path, source.tensor, source.type, source.nbytes, source.rows, source.dim)
        try:
            size = os.path.getsize(source.path)
        except OSError as e:
            raise GGUFError(f"{source.path}: engram table {source.tensor!r} of layer {source.layer}: "
                            f"the GGUF cannot be read ({e})") from e
        if size != source.file_size or source.offset + source.nbytes > size:
            raise GGUFError(f"{source.path}: {size} bytes, but the engram table {source.tensor!r} was recorded "
                            f"at bytes {source.offset}..{source.offset + source.nbytes} of a "
                            f"{source.file_size}-byte file: the GGUF changed since it was converted")
        # Map from the allocation-granularity boundary below the table (mmap's offset rule).
        start = source.offset - source.offset % mmap.ALLOCATIONGRANULARITY
        with open(source.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), source.offset + source.nbytes - start, access=mmap.ACCESS_READ,
                                  offset=start)
        f = self.fmt
        self._blocks = np.frombuffer(self._map, dtype=np.uint8, count=source.nbytes,
                                     offset=source.offset - start).reshape(-1, f.block_bytes)
        # Blocks one row can touch: a row starts at a multiple of gcd(dim, values) inside its first
        # block, so a row narrower than a block may still straddle two.
        self._span = (f.values - math.gcd(source.dim, f.values) + source.dim - 1) // f.values + 1

    def gather(self, rows: Any) -> tuple[Any, Any]:
        """(e4m3 values float8_e4m3fn [*rows.shape, dim], E8M0 scales [*rows.shape, dim/32]) of the
        table rows ``rows`` (an integer tensor, every entry in [0, rows)); reads only those rows' blocks."""
        import numpy as np
        import torch

        s, f = self.source, self.fmt
        idx = rows.reshape(-1).to(device="cpu", dtype=torch.int64).numpy()
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= s.rows):
            raise IndexError(f"engram layer {s.layer}: row ids outside [0, {s.rows})")
        first, start = np.divmod(idx * s.dim, f.values)  # each row's first block, and its first value there
        ids = first[:, None] + np.arange(self._span)
        # The last rows' spans may run past the stream's end: no row's values lie in those clamped blocks.
        np.minimum(ids, len(self._blocks) - 1, out=ids)
        values, scales = split_blocks(self._blocks[ids.reshape(-1)], f)
        values = values.reshape(idx.size, self._span * f.values)
        scales = scales.reshape(idx.size, self._span * f.values // SCALE_GROUP)
        if values.shape[1] != s.dim:  # rows packed into a block or straddling blocks: cut each one out
            cols = start[:, None] + np.arange(s.dim)
            values = np.take_along_axis(values, cols, axis=1)
            scales = np.take_along_axis(scales, cols[:, ::SCALE_GROUP] // SCALE_GROUP, axis=1)
        shape = tuple(rows.shape)
        e8m0 = getattr(torch, "float8_e8m0fnu", None)
        w, sc = torch.from_numpy(values), torch.from_numpy(scales)
        sc = sc.view(e8m0) if e8m0 is not None else sc
        return (w.view(torch.float8_e4m3fn).reshape(*shape, s.dim),
                sc.reshape(*shape, s.dim // SCALE_GROUP))

    def close(self) -> None:
        """Drop the memory map (tensors gathered before stay valid: they are copies)."""
        del self._blocks
        self._map.close()
