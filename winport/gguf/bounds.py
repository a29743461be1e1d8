"""Sane bounds for GGUF hparams, checked before anything loops or allocates over them.

A GGUF's metadata is untrusted input: a 448-byte file may claim 10^6 layers or 10^9 experts, and
every loop over layers (the name plan, the converter) or allocation sized by a dimension (SGLang's
rope cache, the expert tables) would run for minutes or take gigabytes before failing. The bounds
come from the file itself where they can: a layer count cannot exceed the layers its tensors
cover, and a dimension cannot exceed the largest dimension of any tensor in the file (every width
the model uses is the width of some weight). What no tensor carries (context length, top-k,
window) gets a fixed ceiling far above any DeepSeek-V4 release.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .reader import GGUFError

# Far above any real model (V4.1-Flash has 43 blocks with its MTP stages), far below a loop that hurts.
MAX_LAYERS = 1024
# Ceiling for hparams no tensor dimension bounds (V4.1-Flash: context 1,048,576 = 2^20).
MAX_POSITIONS = 1 << 24

# Keys (after the "{arch}." prefix) that are widths, heads or counts of something a tensor holds:
# each must fit the largest tensor dimension of the file.
DIM_KEYS = (
    "embedding_length", "vocab_size", "feed_forward_length", "expert_feed_forward_length",
    "expert_count", "expert_used_count", "expert_shared_count", "expert_group_count",
    "expert_group_used_count", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "attention.kv_lora_rank", "rope.dimension_count",
    "attention.q_lora_rank", "attention.output_lora_rank", "attention.output_group_count",
    "dsv4.o_lora_rank", "dsv4.o_group_count", "attention.indexer.head_count",
    "attention.indexer.key_length", "hyper_connection.count", "hc_mult", "dsv4.hc_mult",
    "engram.head_count", "engram.key_length", "mtp.expert_count", "mtp.expert_used_count", "mtp.markov_rank",
)
# Keys bounded by MAX_POSITIONS: lengths in tokens and selection sizes.
POSITION_KEYS = (
    "context_length", "attention.sliding_window", "attention.indexer.top_k", "mtp.block_size",
    "rope.scaling.original_context_length", "engram.max_ngram_size", "hyper_connection.sinkhorn_iterations",
)
# Keys that count table rows (engram): a table cannot hold more rows than the file has bytes.
ROW_KEYS = ("engram.num_embeddings", "engram.compressed_vocab_size", "engram.vocab_size")
# Keys that count layers.
LAYER_COUNT_KEYS = ("block_count", "vision.block_count", "leading_dense_block_count", "hash_layer_count",
                    "nextn_predict_layers", "mtp.tower_count")
_BLK_RE = re.compile(r"^(?:blk|v\.blk|vision\.blocks)\.(\d+)\.")


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return int(v.item())
    return None


def tensor_layers(tensor_names: Iterable[str]) -> int:
    """1 + the highest ``blk.N`` index among the tensor names (0 when there is none)."""
    best = -1
    for name in tensor_names:
        m = _BLK_RE.match(name)
        if m:
            best = max(best, int(m.group(1)))
    return best + 1


def _max_dim(tensors: Mapping[str, Any] | Iterable[str]) -> int | None:
    if not isinstance(tensors, Mapping):
        return None
    dims = [d for t in tensors.values() for d in getattr(t, "ggml_dims", ())]
    return max(dims) if dims else None


def _total_bytes(tensors: Mapping[str, Any] | Iterable[str]) -> int | None:
    if not isinstance(tensors, Mapping):
        return None
    return sum(int(getattr(t, "nbytes", 0)) for t in tensors.values())


def check_hparams(metadata: Mapping[str, Any], tensors: Mapping[str, Any] | Iterable[str],
                  where: Any = "<gguf>") -> None:
    """Raise one GGUFError naming every ``{arch}.*`` hparam outside its bound (see module docstring).

    ``tensors`` is the file's tensor table (name -> tensor with ``ggml_dims``) or just the names;
    with names only, dimension keys get the fixed MAX_POSITIONS ceiling instead of the file's own.
    """
    arch = metadata.get("general.architecture", "")
    prefix = f"{arch}."
    names = list(tensors)
    layers = tensor_layers(names)
    max_dim = _max_dim(tensors)
    total = _total_bytes(tensors)
    problems: list[str] = []
    for key, value in metadata.items():
        if not key.startswith(prefix):
            continue
        short = key[len(prefix):]
        values: list[Any] = list(value.tolist()) if hasattr(value, "tolist") and getattr(value, "ndim", 0) else (
            list(value) if isinstance(value, list) else [value])
        ints = [x for v in values if (x := _int_or_none(v)) is not None]
        if not ints:
            continue
        lo, hi = min(ints), max(ints)
        if short in LAYER_COUNT_KEYS:
            if lo < 0 or hi > MAX_LAYERS:
                problems.append(f"{key!r} is {value!r}: outside [0, {MAX_LAYERS}]")
            elif short in ("block_count", "vision.block_count") and hi > layers:
                problems.append(f"{key!r} is {hi} but the file's tensors cover {layers} layer(s)")
        elif short in DIM_KEYS:
            bound = max_dim if max_dim is not None else MAX_POSITIONS
            if lo < 0 or hi > bound:
                what = "the largest tensor dimension in the file" if max_dim is not None else "the ceiling"
                problems.append(f"{key!r} is {value!r}: outside [0, {bound}] ({what})")
        elif short in ROW_KEYS:
            bound = total if total is not None else 1 << 40
            if lo < 0 or hi > bound:
                problems.append(f"{key!r} is {value!r}: outside [0, {bound}] (the file's tensor bytes)")
        elif short in POSITION_KEYS:
            if lo < 0 or hi > MAX_POSITIONS:
                problems.append(f"{key!r} is {value!r}: outside [0, {MAX_POSITIONS}]")
        elif short.endswith(("layer_ids", "source_layers", "target_layers", "candidate_source_layer")):
            # -1 is "none" (V4.1's candidate_source_layer_id on models without one).
            if lo < -1 or hi >= MAX_LAYERS:
                problems.append(f"{key!r} holds layer id(s) outside [-1, {MAX_LAYERS})")
        elif short.endswith("compress_ratios") and len(values) > MAX_LAYERS:
            problems.append(f"{key!r} has {len(values)} entries: more than {MAX_LAYERS} layers")
    if problems:
        raise GGUFError(f"{where}: implausible hparams: " + "; ".join(problems))
