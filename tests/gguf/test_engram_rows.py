"""Engram rows gathered from the GGUF's memory map (winport.gguf.engram_rows) and the patch that
serves them (winport.patches.engram_rows_from_gguf), against the block layout's definition and
against SGLang's own EngramEmbedding lookup on the same table loaded the upstream way."""

from __future__ import annotations

import mmap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from winport.gguf.engram_rows import (
    BLOCKS,
    EngramRows,
    EngramSource,
    check_table,
    read_sources,
    write_sources,
)
from winport.gguf.reader import GGUFError

# 96-value rows straddle two blocks for some rows (check_table allows any whole 32-value groups).
FORMATS = [("MXFP8", 64), ("MXFP8", 96), ("MXFP8", 256), ("MXFP8", 512), ("F8_E4M3_B128", 128),
           ("F8_E4M3_B128", 256), ("F8_E4M3_B128", 64), ("F8_E4M3_B128", 96)]


def _table(rng: np.random.Generator, type_name: str, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block stream bytes, e4m3 bytes [rows, dim], E8M0 bytes per 32 values [rows, dim/32]) from the
    layout's definition: blocks of (scales, values), value i of row r at stream position r*dim+i."""
    f = BLOCKS[type_name]
    n_blocks = -(-rows * dim // f.values)
    vals = rng.integers(0, 0x7F, (n_blocks, f.values), dtype=np.uint8)  # finite e4m3, either sign below
    vals |= rng.integers(0, 2, vals.shape, dtype=np.uint8) << 7
    scales = rng.integers(110, 145, (n_blocks, f.scale_bytes), dtype=np.uint8)
    stream = np.concatenate([scales, vals], axis=1).reshape(-1)
    flat_vals = vals.reshape(-1)[: rows * dim].reshape(rows, dim)
    per32 = np.repeat(scales, f.values_per_scale // 32, axis=1).reshape(-1)[: rows * dim // 32]
    return stream, flat_vals, per32.reshape(rows, dim // 32)


def _write(tmp_path: Path, stream: np.ndarray, type_name: str, rows: int, dim: int, layer: int = 2,
           lead: int = 70_001) -> EngramSource:
    path = tmp_path / f"model-{type_name}-{dim}.gguf"
    head = np.random.default_rng(1).integers(0, 256, lead, dtype=np.uint8)  # offset off any map boundary
    path.write_bytes(head.tobytes() + stream.tobytes() + b"\0" * 17)
    return EngramSource(layer=layer, target=f"layers.{layer}.engram.embed", path=str(path), tensor=f"blk.{layer}.x",
                        offset=lead, nbytes=stream.size, type=type_name, rows=rows, dim=dim,
                        file_size=path.stat().st_size)


@pytest.mark.parametrize("type_name,dim", FORMATS)
def test_gather_equals_the_layout_definition(tmp_path: Path, type_name: str, dim: int) -> None:
    rng = np.random.default_rng(dim)
    rows = 301
    stream, vals, scales = _table(rng, type_name, rows, dim)
    src = _write(tmp_path, stream, type_name, rows, dim)
    assert src.offset % mmap.ALLOCATIONGRANULARITY
    table = EngramRows(src)
    idx = torch.from_numpy(rng.integers(0, rows, (3, 7))).to(torch.int32)
    idx[0, 0], idx[-1, -1] = 0, rows - 1  # both ends of the table
    w, s = table.gather(idx)
    assert w.dtype == torch.float8_e4m3fn and w.shape == (3, 7, dim)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (3, 7, dim // 32)
    np.testing.assert_array_equal(w.view(torch.uint8).numpy(), vals[idx.numpy()])
    np.testing.assert_array_equal(s.view(torch.uint8).numpy(), scales[idx.numpy()])
    empty_w, empty_s = table.gather(torch.zeros(0, dtype=torch.int64))
    assert empty_w.shape == (0, dim) and empty_s.shape == (0, dim // 32)
    with pytest.raises(IndexError, match=r"engram layer 2: row ids outside \[0, 301\)"):
        table.gather(torch.tensor([rows]))
    table.close()


def test_table_checks_name_the_file_and_tensor(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"f\.gguf: tensor 't': engram table stored as Q8_0"):
        check_table("f.gguf", "t", "Q8_0", 264, 4, 64)
    with pytest.raises(GGUFError, match="not whole MXFP8 blocks"):
        check_table("f.gguf", "t", "MXFP8", 265, 4, 64)
    with pytest.raises(GGUFError, match=r"do not hold exactly 9 rows x 64 values"):
        check_table("f.gguf", "t", "MXFP8", 264, 9, 64)
    with pytest.raises(GGUFError, match="scale groups"):
        check_table("f.gguf", "t", "MXFP8", 264, 4, 48)
    stream, _, _ = _table(np.random.default_rng(0), "MXFP8", 8, 64)
    src = _write(tmp_path, stream, "MXFP8", 8, 64)
    Path(src.path).write_bytes(Path(src.path).read_bytes()[:-40])  # the GGUF changed after conversion
    with pytest.raises(GGUFError, match="the GGUF changed since it was converted"):
        EngramRows(src)
    Path(src.path).unlink()
    with pytest.raises(GGUFError, match="the GGUF cannot be read"):
        EngramRows(src)


def test_sources_round_trip_and_bad_file(tmp_path: Path) -> None:
    stream, _, _ = _table(np.random.default_rng(0), "MXFP8", 8, 64)
    src = _write(tmp_path, stream, "MXFP8", 8, 64, layer=5)
    path = write_sources(tmp_path, [src])
    assert read_sources(path) == {5: src}
    path.write_text('{"engram_tables": [{"layer": 5}]}')
    with pytest.raises(GGUFError, match="engram_gguf.json: not a winport engram table list"):
        read_sources(path)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_patched_lookup_is_bit_identical_to_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     tp_size: int) -> None:
    """SGLang's EngramEmbedding with the table loaded its own way vs the patched one reading the map:
    the same bf16 rows bit for bit, unowned rows zero on each simulated TP rank; no table allocated."""
    from sglang.srt.layers import engram

    from winport.gguf.engram_rows import ENV
    from winport.patches import engram_rows_from_gguf as patch

    rows, dim, layer = 96, 64, 2
    rng = np.random.default_rng(7)
    stream, vals, scales = _table(rng, "MXFP8", rows, dim)
    src = _write(tmp_path, stream, "MXFP8", rows, dim, layer=layer)
    sidecar = write_sources(tmp_path, [src])
    bounds = (0, 48, 96)
    idx = torch.from_numpy(rng.integers(0, rows, (5, 9)))
    original_init, original_owned = engram.EngramEmbedding.__init__, engram.EngramEmbedding._owned_rows
    for rank in range(tp_size):
        monkeypatch.setattr(engram, "get_parallel", lambda r=rank: types.SimpleNamespace(tp_size=tp_size, tp_rank=r))
        upstream = engram.EngramEmbedding(rows, dim, layer, bounds)
        upstream._load_rows(upstream.weight, torch.from_numpy(vals).view(torch.float8_e4m3fn))
        upstream._load_rows(upstream.scale, torch.from_numpy(scales).view(torch.float8_e8m0fnu))
        expected = upstream._owned_rows(idx)
        with monkeypatch.context() as m:
            m.setenv(ENV, str(sidecar))
            m.setattr(engram.EngramEmbedding, "__init__", original_init)
            m.setattr(engram.EngramEmbedding, "_owned_rows", original_owned)
            patch._sources.cache_clear()
            patch.apply()
            served = engram.EngramEmbedding(rows, dim, layer, bounds)
            assert served.weight.numel() == 0 and not list(served.parameters()), "the table must not be allocated"
            assert (served.row_start, served.rows) == (upstream.row_start, upstream.rows)
            got = served._owned_rows(idx)
            other_layer = engram.EngramEmbedding(rows, dim, layer + 1, bounds)  # not in the sidecar: upstream
            assert not hasattr(other_layer, "gguf_rows") and other_layer.weight.shape == (upstream.rows, dim)
        assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), expected.view(torch.int16))
        assert torch.isfinite(got).all() and got.abs().sum() > 0
        if tp_size > 1:
            assert (got.abs().sum(-1) == 0).any(), "rows outside this rank's shard must be zero"
    with monkeypatch.context() as m:
        m.setenv(ENV, str(sidecar))
        m.setattr(engram, "get_parallel", lambda: types.SimpleNamespace(tp_size=1, tp_rank=0))
        patch._sources.cache_clear()
        patch.apply()
        with pytest.raises(ValueError, match=r"engram layer 2 is 96 x 64 in .*the model config says 95 x 64"):
            engram.EngramEmbedding(rows - 1, dim, layer, (0, 95))
    monkeypatch.setattr(engram.EngramEmbedding, "__init__", original_init)
    monkeypatch.setattr(engram.EngramEmbedding, "_owned_rows", original_owned)
    patch._sources.cache_clear()
