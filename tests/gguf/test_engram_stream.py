"""Engram tables in bounded memory (issue 6, conversion rule: "engram tables stay in the file and
are read through the memory map on demand").

V4.1-Flash's two engram tables are ~100 GB each. By default (``engram="map"``) winport.gguf.to_checkpoint
leaves them in the GGUF and records where they are (engram_gguf.json); the served model gathers rows
through a memory map (winport.gguf.engram_rows). With ``engram="copy"`` it streams them from the
memory map into the safetensors shard ``engram_chunk_bytes`` of source blocks at a time
(to_checkpoint.EngramStream). Checked here, on tables many times the chunk size, for both routes:
- the checkpoint's ``layers.1.engram.embed.weight`` / ``.scale`` are the GGUF blocks' e4m3 values
  and E8M0 scales bit for bit, against a plain numpy split of the whole block stream, for MXFP8
  one block per row (V4.1-Flash), MXFP8 with 64-value rows packed four to a block (the demo; a
  random, not zero, pad after the last row), and F8_E4M3_B128 (one exponent per 128 values);
- numpy memory (tracemalloc) during the whole conversion does not grow with the table: four times
  the rows add less than one chunk to the peak, and the peak stays far below the table's size.
  (Reading the table whole, as the code before this did, adds the table's size and fails both.)
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.gguf._helpers import random_blocks, write_gguf
from winport.gguf import GGUFError
from winport.gguf.engram_rows import SIDECAR, EngramRows, read_sources
from winport.gguf.to_checkpoint import gguf_to_checkpoint

from .test_model_load import KV, tiny_v41_tensors
from .test_sidecars import TOKENIZER_KV, _tokens

CHUNK = 64 << 10
# type, values per table row, block bytes, values per block
CASES = [("MXFP8", 256, 264, 256), ("MXFP8", 64, 264, 256), ("F8_E4M3_B128", 256, 129, 128)]


def _model(folder: Path, rng: np.random.Generator, tname: str, dim: int, rows: int) -> tuple[Path, np.ndarray]:
    """A tiny V4.1 GGUF with one engram table at layer 1 of ``rows`` x ``dim`` values; returns its blocks."""
    _, _, block_bytes, per_block = next(c for c in CASES if c[0] == tname and c[1] == dim)
    n_blocks = -(-rows * dim // per_block)
    blocks = random_blocks(rng, tname, n_blocks)
    gguf_row = max(dim, per_block)  # packed rows: the GGUF row is one block
    arr = blocks.reshape(-1, gguf_row // per_block * block_bytes)
    t = tiny_v41_tensors(rng)
    t["blk.1.engram_embd.weight"] = (tname, arr)
    kv = {**KV, **TOKENIZER_KV, **_tokens(), "deepseek41.engram.layer_ids": [1],
          "deepseek41.engram.num_embeddings": [rows], "deepseek41.engram.key_length": dim}
    folder.mkdir(parents=True)
    return write_gguf(folder / "DeepSeek-V4.1-Flash-tiny.gguf", "deepseek41", t, kv), blocks


def _reference(tname: str, blocks: np.ndarray, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole-table split of the block stream into e4m3 bytes [rows, dim] and E8M0 bytes [rows, dim/32]."""
    n = rows * dim
    if tname == "MXFP8":
        w, s = blocks[:, 8:].reshape(-1), blocks[:, :8].reshape(-1)
    else:
        w, s = blocks[:, 1:].reshape(-1), np.repeat(blocks[:, 0], 4)
    return w[:n].reshape(rows, dim), s[: n // 32].reshape(rows, dim // 32)


def _has(folder: Path, name: str) -> bool:
    return any(name in safe_open(str(f), framework="pt").keys() for f in folder.glob("*.safetensors"))  # noqa: SIM118


def _read(folder: Path, name: str) -> np.ndarray:
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            if name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                return st.get_tensor(name).view(torch.uint8).numpy()
    raise AssertionError(f"{name} not in {folder}")


def _convert(path: Path, cache: Path, engram: str = "copy") -> tuple[Path, int]:
    """Convert with tracemalloc on; (folder, peak traced bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        folder = gguf_to_checkpoint(path, cache=cache, progress=False, shard_bytes=1 << 20,
                                    engram_chunk_bytes=CHUNK, engram=engram)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return folder, peak


@pytest.mark.parametrize("tname,dim", [(c[0], c[1]) for c in CASES])
def test_engram_table_streams_bit_identically_in_bounded_memory(tmp_path: Path, rng: np.random.Generator,
                                                                tname: str, dim: int) -> None:
    peaks = {}
    for scale in (0, 1, 4):
        # 3.2 / 12.7 MB of MXFP8 blocks at dim 256 (48 / 194 chunks); scale 0: a first conversion
        # whose peak is not compared (one-time allocations of the first run in a process). An odd row
        # count for the packed table leaves a partly used last block and a short last chunk.
        rows = 12001 * max(scale, 1) * 256 // dim
        path, blocks = _model(tmp_path / f"m{scale}", rng, tname, dim, rows)
        table_bytes = blocks.nbytes
        assert table_bytes > 40 * CHUNK
        folder, peaks[scale] = _convert(path, tmp_path / f"cache{scale}")
        w, s = _reference(tname, blocks, rows, dim)
        got_w = _read(folder, "layers.1.engram.embed.weight")
        got_s = _read(folder, "layers.1.engram.embed.scale")
        assert got_w.shape == (rows, dim) and got_s.shape == (rows, dim // 32)
        np.testing.assert_array_equal(got_w, w)
        np.testing.assert_array_equal(got_s, s)
        if scale == 4:  # the default route on the largest table: nothing copied, every row read back
            mapped, map_peak = _convert(path, tmp_path / "cache-map", engram="map")
            assert not _has(mapped, "layers.1.engram.embed.weight") and map_peak < table_bytes / 8
            table = EngramRows(read_sources(mapped / SIDECAR)[1])
            got_w, got_s = table.gather(torch.arange(rows))
            np.testing.assert_array_equal(got_w.view(torch.uint8).numpy(), w)
            np.testing.assert_array_equal(got_s.view(torch.uint8).numpy(), s)
            table.close()
    assert peaks[4] < table_bytes / 8, f"peak {peaks[4]} B while converting a {table_bytes} B table"
    assert peaks[4] - peaks[1] < CHUNK, f"peak grew with the table: {peaks}"


def test_engram_table_of_a_non_fp8_type_is_named(tmp_path: Path, rng: np.random.Generator) -> None:
    t = tiny_v41_tensors(rng)
    t["blk.1.engram_embd.weight"] = ("Q8_0", random_blocks(rng, "Q8_0", 64).reshape(8, 8 * 34))
    kv = {**KV, **TOKENIZER_KV, **_tokens(), "deepseek41.engram.layer_ids": [1],
          "deepseek41.engram.num_embeddings": [8], "deepseek41.engram.key_length": 256}
    path = write_gguf(tmp_path / "bad.gguf", "deepseek41", t, kv)
    with pytest.raises(GGUFError, match=r"bad\.gguf: tensor 'blk\.1\.engram_embd\.weight': engram table stored as Q8_0"):
        gguf_to_checkpoint(path, cache=tmp_path / "cache", progress=False)
