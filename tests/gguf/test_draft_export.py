"""The DSpark draft bundled in a checkpoint (``mtp.<stage>.*`` + ``dspark_*`` config keys) exports as
a draft GGUF that winport's sidecar reader loads back (issue 6).

winport.gguf.export.draft_to_gguf writes stage ``s`` as ``blk.<s>.*`` (DSpark-only tensors as
``dspark_main_proj`` / ``dspark_markov_embd`` / ...), dense linear weights and stacked routed
experts as Q8_0 (gguf-py's quantizer), norms and other float tensors as stored, and the draft
config as ``deepseek41.mtp.*`` hparams. Checked here on a synthetic draft (names and shapes of
tests/gguf/test_sidecars.py's two-stage draft, fresh values):
- values exactly representable in Q8_0 (per 32-value block: integers up to 127 times one power of
  two, 127 present) come back bit for bit through ``gguf_to_checkpoint(model, draft=...)``, every
  tensor, and the draft's config keys come back equal;
- random bf16 values: Q8_0 tensors equal bf16 of gguf-py's quantize -> dequantize of the same
  floats, the rest bit for bit; the GGUF's types are read with gguf-py's own reader;
- exporting the checkpoint as a model GGUF keeps the draft out of it (own file with --draft-out);
- a checkpoint without a draft, or with stages that disagree with its config, is a clear error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.gguf._helpers import write_gguf
from winport.gguf import GGUFError
from winport.gguf.cli import main as cli_main
from winport.gguf.export import checkpoint_to_gguf, draft_to_gguf
from winport.gguf.to_checkpoint import gguf_to_checkpoint

from .test_model_load import KV, tiny_v41_tensors
from .test_sidecars import DRAFT_KV, TOKENIZER_KV, _tokens, draft_tensors

DRAFT_CFG = {"num_nextn_predict_layers": 2, "dspark_block_size": 5, "dspark_markov_rank": 16,
             "dspark_target_layer_ids": [0, 1, 1], "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
             "dspark_noise_token_id": 3, "enable_confidence_head": False, "confidence_head_with_markov": False}


@pytest.fixture
def setup(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path]:
    """(tiny V4.1 model GGUF, a checkpoint folder converted from it with test_sidecars' draft)."""
    d = tmp_path / "models"
    d.mkdir()
    model = write_gguf(d / "DeepSeek-V4.1-Flash-tiny.gguf", "deepseek41", tiny_v41_tensors(rng),
                       {**KV, **TOKENIZER_KV, **_tokens()})
    draft = write_gguf(tmp_path / "layout-draft.gguf", "deepseek41", draft_tensors(rng), DRAFT_KV)
    folder = gguf_to_checkpoint(model, cache=tmp_path / "cache0", draft=draft, progress=False)
    return model, folder


def _q8_exact(rng: np.random.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """bf16 values Q8_0 stores exactly: per 32-block, integers in [-127, 127] (127 present) x 2^-e."""
    q = rng.integers(-127, 128, shape).astype(np.float32)
    blocks = q.reshape(-1, 32)
    blocks[:, 0] = np.where(rng.random(blocks.shape[0]) < 0.5, -127.0, 127.0)
    e = rng.integers(8, 14, (blocks.shape[0], 1))
    return torch.from_numpy((blocks * np.exp2(-e)).reshape(shape).astype(np.float32)).to(torch.bfloat16)


def _synthetic_draft(folder: Path, layout: dict[str, torch.Tensor], rng: np.random.Generator, exact: bool) -> dict:
    """A checkpoint folder holding only the draft: mtp.* with fresh values, config.json with DRAFT_CFG."""
    folder.mkdir()
    out = {}
    for name, t in layout.items():
        if t.dtype == torch.bfloat16 and exact and t.shape[-1] % 32 == 0:
            out[name] = _q8_exact(rng, tuple(t.shape))
        elif t.dtype == torch.bfloat16:
            out[name] = torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32) * 0.05).bfloat16()
        else:
            assert t.dtype == torch.float32, (name, t.dtype)
            out[name] = torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32))
    save_file(out, str(folder / "model.safetensors"))
    cfg = {"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"], **DRAFT_CFG}
    (folder / "config.json").write_text(json.dumps(cfg))
    return out


def _layout(folder: Path) -> dict[str, torch.Tensor]:
    """mtp.* names, shapes and dtypes of a converted draft; MXFP4 experts (the layout draft's stage 0
    keeps the tiny model's) as the bf16 [N, K] a synthetic draft checkpoint holds."""
    out = {}
    for k, v in load_file(str(folder / "model.safetensors")).items():
        if not k.startswith("mtp.") or (".ffn.experts." in k and k.endswith(".scale")):
            continue
        out[k] = torch.empty(v.shape[0], 2 * v.shape[1], dtype=torch.bfloat16) if v.dtype == torch.uint8 else v
    return out


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(-1).view(torch.uint8).numpy()


@pytest.mark.parametrize("exact", [True, False])
def test_draft_gguf_round_trips_through_the_sidecar_reader(setup: tuple[Path, Path], tmp_path: Path,
                                                           rng: np.random.Generator, exact: bool) -> None:
    model, converted = setup
    layout = _layout(converted)
    assert len(layout) > 40 and any(".ffn.experts." in k for k in layout)
    src = _synthetic_draft(tmp_path / "ckpt", layout, rng, exact)
    out = tmp_path / "DSpark-Q8_0.gguf"
    assert cli_main(["export", str(tmp_path / "ckpt"), str(out), "--draft-only"]) == 0
    # The file as gguf-py reads it: stage tensors, Q8_0 dense / experts, F32 norms, the draft hparams.
    r = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.dspark_main_proj.weight"] == "Q8_0" and types["blk.1.ffn_down_exps.weight"] == "Q8_0"
    assert types["blk.1.attn_q_a.weight"] == "Q8_0" and types["blk.0.dspark_main_norm.weight"] == "F32"
    assert types["blk.1.dspark_markov_embd.weight"] == "BF16"  # a float-role table: as stored
    assert not any(n.startswith(("token_embd", "output")) for n in types)
    assert r.fields["deepseek41.block_count"].contents() == 2
    assert r.fields["deepseek41.mtp.target_layers"].contents() == [0, 1, 1]
    # Back through the reader that bundles a draft sidecar into the model's checkpoint.
    back_dir = gguf_to_checkpoint(model, cache=tmp_path / "cache1", draft=out, progress=False)
    back = {k: v for k, v in load_file(str(back_dir / "model.safetensors")).items() if k.startswith("mtp.")}
    expert_scales = {k for k in back if ".ffn.experts." in k and k.endswith(".scale")}
    assert sorted(set(back) - expert_scales) == sorted(src)
    from winport.demo.quantize import dequantize_mxfp4, quantize_mxfp4
    from winport.gguf.export import gguf_name

    n_q8 = n_fp4 = 0
    for name, x in src.items():
        got = back[name]
        g, _, e = gguf_name("layers." + name[len("mtp."):])
        if ".ffn.experts." in name:
            # The tiny model's experts are MXFP4, so SGLang loads the draft's experts as MXFP4 too
            # (convert._experts_to_mxfp4): the Q8_0 values (gguf-py's round trip) requantized.
            n_fp4 += 1
            scale = back[name[: -len("weight")] + "scale"]
            assert got.dtype == torch.uint8 and got.shape == (x.shape[0], x.shape[1] // 2), name
            q8 = gq.dequantize(gq.quantize(x.float().numpy(), gguf.GGMLQuantizationType.Q8_0),
                               gguf.GGMLQuantizationType.Q8_0)
            want = dequantize_mxfp4(*quantize_mxfp4(torch.from_numpy(q8), amax_slack=2.0**-6))
            assert torch.equal(dequantize_mxfp4(got, scale), want), name
            continue
        assert got.dtype == x.dtype and got.shape == x.shape, name
        if exact or types[g] != "Q8_0":
            np.testing.assert_array_equal(_bits(got), _bits(x), err_msg=name)
        else:
            n_q8 += 1
            f = x.float().numpy()
            ref = gq.dequantize(gq.quantize(f, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
            assert np.isfinite(ref).all()
            np.testing.assert_array_equal(_bits(got), _bits(torch.from_numpy(ref).bfloat16()), err_msg=name)
            assert not np.array_equal(_bits(got), _bits(x)), f"{name}: Q8_0 was lossless on random values?"
    assert (exact or n_q8 + n_fp4 > 20) and n_fp4 >= 6
    cfg = json.loads((back_dir / "config.json").read_text())
    assert {k: cfg[k] for k in DRAFT_CFG} == DRAFT_CFG


def test_model_export_keeps_the_draft_out(setup: tuple[Path, Path], tmp_path: Path) -> None:
    _, converted = setup
    folder = tmp_path / "ckpt"
    shutil.copytree(converted, folder)
    # Only bf16/f32 tensors: the exporter writes GGUF's plain types (the MXFP4 experts are dropped here).
    w = {k: v for k, v in load_file(str(folder / "model.safetensors")).items()
         if v.dtype in (torch.bfloat16, torch.float32)}
    save_file(w, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 2 and "dspark_block_size" in cfg
    out, dout = tmp_path / "m.gguf", tmp_path / "m-DSpark.gguf"
    checkpoint_to_gguf(folder, out, arch="deepseek41", draft_out=dout)  # checks the model config round trip
    model_names = {t.name for t in gguf.GGUFReader(str(out)).tensors}
    assert "blk.0.attn_q_a.weight" in model_names and not any("dspark" in n for n in model_names)
    m = gguf.GGUFReader(str(out))
    assert not any(k.startswith("deepseek41.mtp.") for k in m.fields)
    assert m.fields["deepseek41.nextn_predict_layers"].contents() == 0
    draft_names = {t.name for t in gguf.GGUFReader(str(dout)).tensors}
    assert {"blk.0.dspark_main_proj.weight", "blk.1.dspark_markov_head.weight"} <= draft_names


def test_bad_draft_checkpoints_are_named(setup: tuple[Path, Path], tmp_path: Path, rng: np.random.Generator,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _, converted = setup
    folder = tmp_path / "ckpt"
    _synthetic_draft(folder, _layout(converted), rng, exact=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 3}))
    with pytest.raises(GGUFError, match=r"stages \[0, 1\], config\.json says 3"):
        draft_to_gguf(folder, tmp_path / "x.gguf")
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if not k.startswith("dspark_")}))
    assert cli_main(["export", str(folder), str(tmp_path / "y.gguf"), "--draft-only"]) == 2
    assert "no dspark_* keys" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()
