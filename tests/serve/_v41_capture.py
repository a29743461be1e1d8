"""Test support: record what SGLang computes in the V4.1-only parts of a served model.

Loaded into every process of a test server through a generated `sitecustomize.py` (see
tests/serve/test_v41_demo.py) when WINPORT_V41_CAPTURE_DIR is set; never imported by winport.
SGLang's own `--debug-tensor-dump-output-folder` cannot be used: it flushes from a hook on the
inner model, which DeepseekV4ForCausalLM calls as `self.model.forward(...)`, so its hook never
runs, and it records module outputs only.

For every extend (prefill) forward it saves `pass{n}.pt` with:
- `norm/<module>`: output of each V4.1 RMSNorm (compressor.norm: the pooled, normalized latent
  before RoPE; indexer.k_norm: the index key before RoPE).
- `sources/<layer>`: inputs of `forward_low_ratio_sources` (x, q_lora, positions), the compressed
  output slots, the top-k the indexer wrote (request-local compressed positions, -1 padded), the
  index keys SGLang reads back for the written slots, the layer's RoPE table rows at those
  positions, and for every ratio-1/2 layer the data pointers of the compressed-KV and index-K
  buffers it reads (to see which layers share a source's storage).
- `engram/<layer>`: the engram's inputs (residual x, hash ids, input ids) and output.
- `input_ids`, `positions`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

_state: dict[str, Any] = {"records": None, "pass": 0}


def _rec(key: str, value: Any) -> None:
    if _state["records"] is not None:
        _state["records"][key] = value


def _clone(t: Any) -> Any:
    return t.detach().clone().cpu() if isinstance(t, torch.Tensor) else t


def _patch_model(module: Any) -> None:
    cls = module.DeepseekV4ForCausalLM
    load_weights, forward = cls.load_weights, cls.forward

    @functools.wraps(load_weights)
    def named_load(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load_weights(self, *args, **kwargs)
        # remove_duplicate=False: a decoder layer also reaches the next one through `_next_layer`;
        # keep the plain `model.layers.N...` path of each module.
        for name, mod in self.named_modules(remove_duplicate=False):
            if "._next_layer" not in name:
                mod._winport_capture_name = name
        return out

    @functools.wraps(forward)
    def capturing_forward(self: Any, input_ids: Any, positions: Any, forward_batch: Any, *args: Any,
                          **kwargs: Any) -> Any:
        if not forward_batch.forward_mode.is_extend():
            return forward(self, input_ids, positions, forward_batch, *args, **kwargs)
        _state["records"] = {"input_ids": _clone(input_ids), "positions": _clone(positions)}
        try:
            return forward(self, input_ids, positions, forward_batch, *args, **kwargs)
        finally:
            records, _state["records"] = _state["records"], None
            out = Path(os.environ["WINPORT_V41_CAPTURE_DIR"])
            out.mkdir(parents=True, exist_ok=True)
            tmp = out / f".pass{_state['pass']:03d}.pt"
            torch.save(records, tmp)
            tmp.rename(out / f"pass{_state['pass']:03d}.pt")
            _state["pass"] += 1

    cls.load_weights, cls.forward = named_load, capturing_forward


def _patch_sparse(module: Any) -> None:
    cls = module.RMSNorm
    forward = cls.forward

    @functools.wraps(forward)
    def capturing(self: Any, x: Any) -> Any:
        y = forward(self, x)
        _rec(f"norm/{getattr(self, '_winport_capture_name', '?')}", _clone(y))
        return y

    cls.forward = capturing


def _patch_backend(module: Any) -> None:
    cls = module.DeepseekV4AttnBackend
    original = cls.forward_low_ratio_sources

    @functools.wraps(original)
    def capturing(self: Any, *, layer: Any, x: Any, q_lora: Any, positions: Any, forward_batch: Any,
                  **kwargs: Any) -> Any:
        if _state["records"] is None or not forward_batch.forward_mode.is_extend():
            return original(self, layer=layer, x=x, q_lora=q_lora, positions=positions,
                            forward_batch=forward_batch, **kwargs)
        rec: dict[str, Any] = {"x": _clone(x), "q_lora": _clone(q_lora), "positions": _clone(positions),
                               "ratio": layer.compress_ratio, "kwargs": dict(kwargs)}
        result = original(self, layer=layer, x=x, q_lora=q_lora, positions=positions,
                          forward_batch=forward_batch, **kwargs)
        lid, ratio, n = layer.layer_id, layer.compress_ratio, positions.shape[0]
        pool = self.token_to_kv_pool
        core = self.forward_metadata.core_metadata
        out_loc = (core.c1_out_loc if ratio == 1 else core.c2_out_loc)[:n]
        rec["out_loc"] = _clone(out_loc)
        rec["freqs"] = _clone(layer.freqs_cis[positions.to(torch.int64)])
        # Which storage each ratio-1/2 layer reads: its own, or its kv source's.
        ptrs = {}
        for other, item in enumerate(pool.layer_mapping):
            if item is not None and item[0] in (1, 2):
                ptrs[other] = (pool.get_extra_key_buffer(other).data_ptr(),
                               pool.get_index_k_with_scale_buffer(other).data_ptr())
        rec["buffer_ptrs"] = ptrs
        if layer.indexer is not None:
            rec["topk"] = _clone(core.sparse_raw_indices(ratio)[:n])
        if layer.compressor is not None and layer.indexer is not None and layer.indexer.owns_k:
            written = out_loc[out_loc >= 0]
            rec["index_k_slots"] = _clone(written)
            rec["index_k"] = _clone(pool.get_low_ratio_index_k_dequant(lid, written.to(torch.int64)))
        _rec(f"sources/{lid}", rec)
        return result

    cls.forward_low_ratio_sources = capturing


def _patch_engram(module: Any) -> None:
    cls = module.Engram
    forward = cls.forward

    @functools.wraps(forward)
    def capturing(self: Any, x: Any, hash_ids: Any, forward_batch: Any = None, **kwargs: Any) -> Any:
        y = forward(self, x, hash_ids, forward_batch, **kwargs)
        name = getattr(self, "_winport_capture_name", "?")
        _rec(f"engram/{name}", {"x": _clone(x), "hash_ids": _clone(hash_ids),
                                "input_ids": _clone(kwargs.get("input_ids")), "out": _clone(y)})
        return y

    cls.forward = capturing


def install() -> None:
    """Patch the SGLang modules as they are imported (no effect unless the capture dir is set)."""
    if not os.environ.get("WINPORT_V41_CAPTURE_DIR"):
        return
    from winport.importhooks import on_import

    on_import("sglang.srt.models.deepseek_v4", _patch_model)
    on_import("sglang.srt.layers.attention.dsv4.dsv41_sparse", _patch_sparse)
    on_import("sglang.srt.layers.attention.deepseek_v4_backend", _patch_backend)
    on_import("sglang.srt.layers.engram", _patch_engram)
