"""Serve DeepSeek-V4.1's engram tables from the GGUF file's memory map (winport.gguf.engram_rows).

Targets sglang 0.5.23 `srt/layers/engram.py:EngramEmbedding`. Upstream allocates each engram table
whole (device memory, or a host table filled by the weight loader) and looks rows up in it. When
``winport serve`` runs a converted GGUF, the checkpoint carries no engram tensors and names the
tables' place in the GGUF instead (``WINPORT_ENGRAM_GGUF`` = its ``engram_gguf.json``). For those
layers the constructor allocates nothing and maps the table read-only; ``_owned_rows`` (every
lookup path but the host-table and peer-shard ones, which such a layer never takes) gathers the
rows a batch asks for from the map and dequantizes them exactly as upstream does (e4m3 x E8M0 per
32 values, to bf16, rows outside this rank's shard zero). Layers the file does not name, and every
run without the variable, keep upstream's code. On CUDA the gathered rows are copied to the device
per lookup: correct, but not capturable in a CUDA graph, so ``winport serve`` turns graphs off for
such a model.
"""

from __future__ import annotations

import functools
from typing import Any

from winport.patches._base import UpstreamChangedError, require_source

TARGET = "sglang.srt.layers.engram.EngramEmbedding"


@functools.lru_cache(maxsize=1)
def _sources(path: str) -> dict[int, Any]:
    from winport.gguf.engram_rows import read_sources

    return read_sources(path)


def _make_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]) -> None:
        from winport import envs
        from winport.gguf.engram_rows import EngramRows

        path = envs.WINPORT_ENGRAM_GGUF.get()
        source = _sources(path).get(layer_id) if path else None
        if source is None:
            original(self, num_embeddings, dim, layer_id, column_bounds)
            return
        import torch
        from sglang.srt.layers import engram
        from torch import nn

        if (source.rows, source.dim) != (num_embeddings, dim):
            raise ValueError(f"{path}: engram layer {layer_id} is {source.rows} x {source.dim} in "
                             f"{source.path}, the model config says {num_embeddings} x {dim}")
        nn.Module.__init__(self)
        # The attributes upstream's constructor sets, for a table that lives in neither device
        # memory nor a host table (so the lookups take _owned_rows).
        self.dim = dim
        parallel = engram.get_parallel()
        self.tp_size = parallel.tp_size
        self.row_start, row_end = engram.shard_range(num_embeddings, column_bounds, parallel.tp_rank, self.tp_size)
        self.rows = row_end - self.row_start
        self.host_table = None
        self._sort_host_reads = False
        self.staged_by_scheduler = False
        self.peer = None
        self.gguf_rows = EngramRows(source)
        # Plain (empty) tensors, not parameters: the weight loader has nothing to fill here.
        self.weight = torch.empty(0, dim, dtype=torch.float8_e4m3fn)
        self.scale = torch.empty(0, dim // engram.FP8_BLOCK_SIZE, dtype=torch.float8_e8m0fnu)

    return __init__


def _make_owned_rows(original: Any) -> Any:
    @functools.wraps(original)
    def _owned_rows(self: Any, indices: Any) -> Any:
        rows = getattr(self, "gguf_rows", None)
        if rows is None:
            return original(self, indices)
        import torch

        if self.rows == 0:
            return self.new_rows(indices).zero_()
        local = indices - self.row_start
        owned = (local >= 0) & (local < self.rows)
        local = local.masked_fill(~owned, 0)
        w, s = rows.gather(local + self.row_start)
        # Upstream's arithmetic, operation for operation, so the values are bit-identical.
        values = (w.float().unflatten(-1, (-1, 32)) * s.float().unsqueeze(-1)).flatten(-2)
        values = values.to(torch.bfloat16).to(indices.device)
        return values.masked_fill(~owned.unsqueeze(-1), 0)

    return _owned_rows


def apply() -> None:
    """Wrap EngramEmbedding's constructor and row lookup (a no-op for layers no engram_gguf.json names)."""
    from sglang.srt.layers import engram

    cls = engram.EngramEmbedding
    if getattr(cls.__init__, "_winport_engram_gguf", False):
        return
    cls.__init__ = _make_init(cls.__init__)
    cls.__init__._winport_engram_gguf = True  # type: ignore[attr-defined]
    cls._owned_rows = _make_owned_rows(cls._owned_rows)


def register_patch() -> None:
    """Check upstream's constructor and CPU lookup are still the ones this mirrors, then wrap them."""
    require_source(f"{TARGET}.__init__", "shard_range(", "self.peer: Optional[_PeerShards] = None",
                   "self.host_table: Optional[_HostTable] = None",
                   "torch.empty(self.rows, dim, dtype=torch.float8_e4m3fn)",
                   "self.weight.weight_loader = self._load_rows")
    require_source(f"{TARGET}._owned_rows", "local = indices - self.row_start",
                   "self.weight[local].float().unflatten(-1, (-1, FP8_BLOCK_SIZE))",
                   "(rows * self.scale[local].float().unsqueeze(-1)).flatten(-2)",
                   "values.to(torch.bfloat16).masked_fill(~owned.unsqueeze(-1), 0)")
    require_source(f"{TARGET}._lookup", "values = self._owned_rows(indices)")
    from sglang.srt.layers import engram

    if engram.FP8_BLOCK_SIZE != 32:
        raise UpstreamChangedError(f"{TARGET}: engram scales now cover {engram.FP8_BLOCK_SIZE} values, not 32; "
                                   "review winport.gguf.engram_rows")
    apply()
