"""A V4.1 model GGUF + its mmproj GGUF -> a checkpoint SGLang builds the vision tower from.

- The "v41-vision" demo (bf16 form) exported as a model GGUF (`winport gguf export`) and a vision
  projector (`winport gguf export --mmproj-only`) converts back (winport.gguf.to_checkpoint) to
  the demo's own tensors, bit for bit, and to its config.json's keys, vision keys included (read
  from the projector's clip.vision.* hparams): what tests/serve/test_vision_live.py then serves.
- Keys a projector does not carry are defaulted and said so: image_token_id from the model's
  tokenizer, the rest from SGLang's config defaults.
- A projector that does not fit is refused before anything is converted, naming the file and
  tensor: another hidden size, a missing required tensor, a model without VL routing biases, an
  image token outside the vocabulary; through `winport serve` too (ServeError, empty cache).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.gguf._helpers import served_tensors, write_gguf
from winport.gguf import GGUFError
from winport.gguf.cli import main as cli_main
from winport.gguf.to_checkpoint import gguf_to_checkpoint

from .test_model_load import KV, H, _bf16, _f32, tiny_v41_tensors
from .test_sidecars import MMPROJ_KV, TOKENIZER_KV, _tokens, mmproj_tensors, with_vl_biases


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the bf16 v41-vision demo folder, its model GGUF, its mmproj GGUF)."""
    from winport.demo.build import build_demo

    root = tmp_path_factory.mktemp("vision-demo")
    folder = build_demo(root / "demo", "v41-vision", quiet=True, quantized=False)
    model, mmproj = root / "demo-v41-vision-BF16.gguf", root / "mmproj-demo-v41-vision-BF16.gguf"
    assert cli_main(["export", str(folder), str(model)]) == 0
    assert cli_main(["export", str(folder), str(mmproj), "--mmproj-only"]) == 0
    return folder, model, mmproj


def test_demo_round_trips_through_gguf_and_mmproj(demo: tuple[Path, Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder, model, mmproj = demo
    conv = gguf_to_checkpoint(model, cache=tmp_path, mmproj=mmproj, progress=False)
    want, got = load_file(str(folder / "model.safetensors")), served_tensors(conv)
    assert sorted(got) == sorted(want)
    assert any(k.startswith("vision.blocks.1.") for k in got) and "layers.5.ffn.gate.bias_vl" in got
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), k
    cw, cg = json.loads((folder / "config.json").read_text()), json.loads((conv / "config.json").read_text())
    for key in [k for k in cw if k.startswith("vision_")] + ["image_token_id", "vocab_size", "model_type",
                                                              "hidden_size", "engram_compressed_vocab_size"]:
        assert cg[key] == cw[key], key
    assert cg["vision_n_layers"] == 2 and cg["image_token_id"] == 1024
    # Every key is in the file but the unset max_wh_ratio (SGLang's default: None).
    out = capsys.readouterr().out
    assert "vision keys not in the file: vision_max_wh_ratio=None (SGLang's default)\n" in out


def test_demo_gguf_export_writes_the_projector_next_to_it(demo: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`winport demo-model --variant v41-vision --gguf OUT` also writes mmproj-OUT, found by serve."""
    from winport.gguf.convert import load_gguf_model
    from winport.gguf.export import export_demo_gguf

    folder, _, _ = demo
    out = export_demo_gguf(tmp_path / "v41v.gguf", folder=folder, variant="v41-vision")
    with load_gguf_model(out) as lm:  # mmproj=None: looked for next to the model
        assert lm.mmproj is not None and lm.mmproj.paths[0] == tmp_path / "mmproj-v41v.gguf"
        assert lm.mmproj_plan().config["vision_n_layers"] == 2


@pytest.fixture
def tiny(tmp_path: Path, rng: np.random.Generator) -> Path:
    """tests/gguf/test_sidecars.py's tiny V4.1 model (hidden 64, VL biases, image token last)."""
    return write_gguf(tmp_path / "DeepSeek-V4.1-tiny.gguf", "deepseek41", with_vl_biases(tiny_v41_tensors(rng), rng),
                      {**KV, **TOKENIZER_KV, **_tokens()})


def test_defaults_are_said(tiny: Path, tmp_path: Path, rng: np.random.Generator,
                           capsys: pytest.CaptureFixture[str]) -> None:
    mm = write_gguf(tmp_path / "mmproj.gguf", "clip", mmproj_tensors(rng), MMPROJ_KV)
    conv = gguf_to_checkpoint(tiny, cache=tmp_path / "c", mmproj=mm, progress=False)
    cfg = json.loads((conv / "config.json").read_text())
    assert cfg["image_token_id"] == len(_tokens()["tokenizer.ggml.tokens"]) - 1
    assert cfg["vision_min_pixels"] == 295936 and cfg["vision_max_n_token"] == 1024 and cfg["vision_max_wh_ratio"] is None
    out = capsys.readouterr().out
    assert "image_token_id=95 (the id of <｜deepseek_image｜> in the model's tokenizer)" in out
    assert "vision_min_pixels=295936 (SGLang's default)" in out and "vision_rope_theta=10000.0 (SGLang's default)" in out


def _refused(model: Path, mm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, match: str) -> None:
    """GGUFError from the conversion and ServeError from `winport serve --mmproj`, both naming the
    projector file, and nothing converted."""
    from winport.serve import command

    with pytest.raises(GGUFError, match=match) as ei:
        gguf_to_checkpoint(model, cache=tmp_path / "c1", mmproj=mm, progress=False)
    assert str(mm) in str(ei.value) or str(model) in str(ei.value)
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "c2"))
    monkeypatch.setattr(command, "_cuda_available", lambda: False)
    with pytest.raises(command.ServeError, match=match):
        command.build_plan(["--model", str(model), "--device", "cpu", "--mmproj", str(mm)])
    assert not list(tmp_path.rglob("*.safetensors"))


def test_projector_for_another_hidden_size(tiny: Path, tmp_path: Path, rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    t, other = mmproj_tensors(rng), 2 * H
    t.update({"mm.0.weight": _bf16(rng, other, 4 * 32), "mm.0.bias": _f32(rng, other),
              "mm.2.weight": _bf16(rng, other, other), "mm.2.bias": _f32(rng, other)})
    mm = write_gguf(tmp_path / "mmproj-big.gguf", "clip", t, MMPROJ_KV)
    _refused(tiny, mm, tmp_path, monkeypatch,
             rf"mmproj-big\.gguf: this vision projector does not fit the model .*tensor mm\.2\.weight has shape "
             rf"\[{other}, {other}\], expected \[{H}, {H}\] \(the model's hidden size is {H}")


def test_missing_required_vision_tensor(tiny: Path, tmp_path: Path, rng: np.random.Generator,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    t = mmproj_tensors(rng)
    del t["v.blk.1.attn_out.weight"]
    mm = write_gguf(tmp_path / "mmproj-cut.gguf", "clip", t, MMPROJ_KV)
    _refused(tiny, mm, tmp_path, monkeypatch, r"mmproj-cut\.gguf: .*required tensor v\.blk\.1\.attn_out\.weight missing")


def test_model_without_vl_biases(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_gguf(tmp_path / "DeepSeek-V4.1-text.gguf", "deepseek41", tiny_v41_tensors(rng),
                       {**KV, **TOKENIZER_KV, **_tokens()})
    mm = write_gguf(tmp_path / "mmproj.gguf", "clip", mmproj_tensors(rng), MMPROJ_KV)
    _refused(model, mm, tmp_path, monkeypatch,
             r"DeepSeek-V4\.1-text\.gguf: served with a vision projector, but the model has no VL routing bias .*"
             r"blk\.0\.exp_probs_b_vl\.bias")


def test_image_token_outside_the_vocabulary(tmp_path: Path, rng: np.random.Generator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    toks = _tokens()
    toks["tokenizer.ggml.tokens"] = toks["tokenizer.ggml.tokens"][:-1] + ["t-last"]  # no image token
    model = write_gguf(tmp_path / "DeepSeek-V4.1-noimg.gguf", "deepseek41", with_vl_biases(tiny_v41_tensors(rng), rng),
                       {**KV, **TOKENIZER_KV, **toks})
    mm = write_gguf(tmp_path / "mmproj.gguf", "clip", mmproj_tensors(rng), MMPROJ_KV)
    _refused(model, mm, tmp_path, monkeypatch, r"image_token_id 129264 is outside the model's vocabulary of 96")
