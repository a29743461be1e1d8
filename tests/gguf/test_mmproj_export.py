"""The V4.1 vision projector exports back to an mmproj GGUF (winport.gguf.export.mmproj_to_gguf).

Starting from tests/gguf/test_sidecars.py's two-block mmproj in llama.cpp's clip spelling (written
with gguf-py, gate and up projections apart): GGUF -> the converted checkpoint (to_checkpoint bundles
the vision tensors into the model's shards, the vision keys into config.json) -> GGUF
(mmproj_to_gguf) gives the original file's tensors back, same names, types, shapes and bytes (read
with gguf-py's own reader), plus the zero attention biases the conversion added, and the
clip.vision hparams; converting the exported file again gives the same vision tensors and keys. A vision tensor with no GGUF name, or a missing one, is
a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.gguf._helpers import write_gguf
from winport.gguf import GGUFError
from winport.gguf.cli import main as cli_main
from winport.gguf.export import mmproj_to_gguf
from winport.gguf.to_checkpoint import gguf_to_checkpoint

from .test_model_load import KV, tiny_v41_tensors
from .test_sidecars import MMPROJ_KV, TOKENIZER_KV, _tokens, mmproj_tensors, with_vl_biases


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), bytes(t.data.tobytes())) for t in r.tensors}


@pytest.fixture
def converted(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path, Path]:
    """(model GGUF, original mmproj GGUF, the converted checkpoint folder)."""
    model = write_gguf(tmp_path / "DeepSeek-V4.1-Flash-tiny.gguf", "deepseek41", with_vl_biases(tiny_v41_tensors(rng), rng),
                       {**KV, **TOKENIZER_KV, **_tokens()})
    mm = write_gguf(tmp_path / "mmproj-BF16.gguf", "clip", mmproj_tensors(rng),
                    {**MMPROJ_KV, "clip.vision.rope.freq_base": 10000.0})
    return model, mm, gguf_to_checkpoint(model, cache=tmp_path / "c0", mmproj=mm, progress=False)


def test_mmproj_round_trips(converted: tuple[Path, Path, Path], tmp_path: Path) -> None:
    model, mm, folder = converted
    out = tmp_path / "out" / "mmproj-BF16.gguf"
    assert cli_main(["export", str(folder), str(out), "--mmproj-only"]) == 0
    orig, back = _tensors(mm), _tensors(out)
    added = sorted(set(back) - set(orig))
    assert set(orig) <= set(back) and added == [f"v.blk.{i}.attn_{w}.bias" for i in range(2) for w in ("out", "qkv")]
    assert all(not any(back[n][2]) for n in added)  # zeros
    for name, (tname, shape, data) in orig.items():
        assert back[name][:2] == (tname, shape), name
        assert back[name][2] == data, name
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == "clip"
    for k, v in {**MMPROJ_KV, "clip.vision.rope.freq_base": 10000.0}.items():
        assert r.fields[k].contents() == v, k
    again = gguf_to_checkpoint(model, cache=tmp_path / "c1", mmproj=out, progress=False)
    a, b = _vision(folder), _vision(again)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), k
    assert json.loads((again / "config.json").read_text()) == json.loads((folder / "config.json").read_text())


def _vision(folder: Path) -> dict[str, torch.Tensor]:
    return {k: t for k, t in load_file(str(folder / "model.safetensors")).items()
            if k.startswith(("vision.", "aligner.", "image_"))}


def test_bad_vision_checkpoint_is_named(converted: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, folder = converted
    w = _vision(folder)
    del w["vision.blocks.1.mlp.w2.weight"]
    w["vision.extra.weight"] = torch.zeros(2)
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(w, str(bad / "model.safetensors"))
    (bad / "vision_config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(GGUFError, match=r"missing: vision\.blocks\.1\.mlp\.w2\.weight; with no mmproj GGUF name: "
                                        r"vision\.extra\.weight"):
        mmproj_to_gguf(bad, tmp_path / "x.gguf")
    (bad / "vision_config.json").write_text("{}")
    with pytest.raises(GGUFError, match="vision_n_layers is None"):
        mmproj_to_gguf(bad, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
