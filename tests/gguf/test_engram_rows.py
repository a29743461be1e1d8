"""Engram rows gathered from the GGUF's memory map (winport.gguf.engram_rows), against the block
layout's definition. The patch that serves them to SGLang: tests/patches/test_engram_rows_from_gguf.py."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.gguf._helpers import engram_table, write_engram_table
from winport.gguf.engram_rows import (
    EngramRows,
    check_table,
    read_sources,
    write_sources,
)
from winport.gguf.reader import GGUFError

# 96-value rows straddle two blocks for some rows (check_table allows any whole 32-value groups).
FORMATS = [("MXFP8", 64), ("MXFP8", 96), ("MXFP8", 256), ("MXFP8", 512), ("F8_E4M3_B128", 128),
           ("F8_E4M3_B128", 256), ("F8_E4M3_B128", 64), ("F8_E4M3_B128", 96)]


@pytest.mark.parametrize("type_name,dim", FORMATS)
def test_gather_equals_the_layout_definition(tmp_path: Path, type_name: str, dim: int) -> None:
    rng = np.random.default_rng(dim)
    rows = 301
    stream, vals, scales = engram_table(rng, type_name, rows, dim)
    src = write_engram_table(tmp_path, stream, type_name, rows, dim)
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
    stream, _, _ = engram_table(np.random.default_rng(0), "MXFP8", 8, 64)
    src = write_engram_table(tmp_path, stream, "MXFP8", 8, 64)
    Path(src.path).write_bytes(Path(src.path).read_bytes()[:-40])  # the GGUF changed after conversion
    with pytest.raises(GGUFError, match="the GGUF changed since it was converted"):
        EngramRows(src)
    Path(src.path).unlink()
    with pytest.raises(GGUFError, match="the GGUF cannot be read"):
        EngramRows(src)


def test_sources_round_trip_and_bad_file(tmp_path: Path) -> None:
    stream, _, _ = engram_table(np.random.default_rng(0), "MXFP8", 8, 64)
    src = write_engram_table(tmp_path, stream, "MXFP8", 8, 64, layer=5)
    path = write_sources(tmp_path, [src])
    assert read_sources(path) == {5: src}
    path.write_text('{"engram_tables": [{"layer": 5}]}')
    with pytest.raises(GGUFError, match="engram_gguf.json: not a winport engram table list"):
        read_sources(path)
