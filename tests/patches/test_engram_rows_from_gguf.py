"""winport.patches.engram_rows_from_gguf: SGLang's EngramEmbedding reads its rows from the GGUF's
memory map (winport.gguf.engram_rows, tested in tests/gguf/test_engram_rows.py) instead of a table
loaded into memory, bit for bit the lookup of the same table loaded the upstream way."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.gguf._helpers import engram_table, write_engram_table
from winport.gguf.engram_rows import write_sources


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
    stream, vals, scales = engram_table(rng, "MXFP8", rows, dim)
    src = write_engram_table(tmp_path, stream, "MXFP8", rows, dim, layer=layer)
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
