"""GGUF hparams are bounded before anything loops or allocates over them (winport.gguf.bounds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.gguf._helpers import random_blocks, write_gguf
from winport.gguf import GGUFError, names
from winport.gguf.bounds import MAX_LAYERS, MAX_POSITIONS, check_hparams
from winport.gguf.reader import open_gguf


def _tiny(path: Path, kv: dict, arch: str = "deepseek41", layers: int = 2) -> Path:
    """A small GGUF with `layers` blocks of two tensors each (widest dim 64) and the given hparams."""
    rng = np.random.default_rng(7)
    tensors = {}
    for layer in range(layers):
        tensors[f"blk.{layer}.attn_norm.weight"] = ("F32", rng.standard_normal(64).astype(np.float32))
        tensors[f"blk.{layer}.attn_q_a.weight"] = ("Q8_0", random_blocks(rng, "Q8_0", 4).reshape(2, 68))
    return write_gguf(path, arch, tensors, kv)


def _layers(path: Path) -> int:
    with open_gguf(path) as m:
        return names.n_layers_from_metadata(m.metadata, m.tensors, m.paths[0])


def test_sane_hparams_pass(tmp_path: Path) -> None:
    p = _tiny(tmp_path / "ok.gguf", {"deepseek41.block_count": 2, "deepseek41.embedding_length": 64,
                                     "deepseek41.expert_count": 8, "deepseek41.context_length": 1 << 20,
                                     "deepseek41.kv_source_layer_ids": [0, 1]})
    assert _layers(p) == 2


@pytest.mark.parametrize("count", [3, 10**6, 10**9, MAX_LAYERS + 1])
def test_block_count_beyond_the_tensors_is_refused(tmp_path: Path, count: int) -> None:
    p = _tiny(tmp_path / "layers.gguf", {"deepseek41.block_count": count})
    with pytest.raises(GGUFError) as exc:
        _layers(p)
    msg = str(exc.value)
    assert str(p) in msg and "deepseek41.block_count" in msg and str(count) in msg


@pytest.mark.parametrize(("key", "value"), [
    ("deepseek41.expert_count", 10**9),
    ("deepseek41.embedding_length", 65),  # one past the widest tensor dimension (64)
    ("deepseek41.vocab_size", 2**31),
    ("deepseek41.attention.head_count", 10**6),
    ("deepseek41.expert_feed_forward_length", 4096),
    ("deepseek41.context_length", MAX_POSITIONS + 1),
    ("deepseek41.attention.indexer.top_k", 2**32 - 1),
    ("deepseek41.kv_source_layer_ids", [0, MAX_LAYERS]),
    ("deepseek41.compress_ratios", [1] * (MAX_LAYERS + 1)),
    ("deepseek41.engram.num_embeddings", 10**9),
])
def test_implausible_hparam_is_named(tmp_path: Path, key: str, value: object) -> None:
    p = _tiny(tmp_path / "dims.gguf", {"deepseek41.block_count": 2, key: value})
    with pytest.raises(GGUFError) as exc:
        _layers(p)
    assert key in str(exc.value) and str(p) in str(exc.value)


def test_every_problem_in_one_error() -> None:
    meta = {"general.architecture": "deepseek4", "deepseek4.block_count": 10**6,
            "deepseek4.expert_count": 10**9}
    with pytest.raises(GGUFError) as exc:
        check_hparams(meta, ["blk.0.attn_norm.weight"], "model.gguf")
    assert "deepseek4.block_count" in str(exc.value) and "deepseek4.expert_count" in str(exc.value)


def test_vision_block_count_bounded(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    p = write_gguf(tmp_path / "mmproj.gguf", "clip",
                   {"v.blk.0.attn_q.weight": ("F32", rng.standard_normal((8, 8)).astype(np.float32))},
                   {"clip.vision.block_count": 10**7})
    from winport.gguf.convert import plan_mmproj

    with open_gguf(p) as m, pytest.raises(GGUFError, match="clip.vision.block_count"):
        plan_mmproj(m)


def test_gguf_info_refuses_a_crafted_layer_count(tmp_path: Path) -> None:
    """The file from the report: a few hundred bytes claiming 10^7 layers; info answers at once."""
    p = _tiny(tmp_path / "crafted.gguf", {"deepseek4.block_count": 10**7}, arch="deepseek4", layers=1)
    r = subprocess.run([sys.executable, "-m", "winport", "gguf", "info", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "deepseek4.block_count" in r.stderr and "10000000" in r.stderr
