"""DSpark draft and vision projector (mmproj) GGUFs: found, checked, converted, and the serve plan.

Tiny files written with gguf-py's writer: a V4.1 model (tests/gguf/test_model_load.py's tensors), a
two-stage DSpark draft with real V4.1 layer names plus the DSpark stage tensors, and a two-block
mmproj in llama.cpp's clip spelling. What SGLang 0.5.23 expects (read from its source):
- draft: bundled in the target checkpoint as ``mtp.<stage>.*`` tensors with ``dspark_*`` keys in
  config.json, served with ``--speculative-algorithm DSPARK`` (draft path = the model path); DSpark
  runs on CUDA/NPU/XPU only, so on the CPU the draft is checked but not used;
- mmproj: V4.1's vision tower lives in the model checkpoint (vision.*, aligner.*, image_*) and is
  built only for model_type deepseek_v41 with vision_n_layers > 0, so the projector is bundled into the
  model's shards with the vision keys in config.json, and served.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.gguf._helpers import served_tensors, write_gguf
from winport.gguf import GGUFError, open_gguf
from winport.gguf.to_checkpoint import gguf_to_checkpoint, sidecars

from .test_model_load import KV, E, H, L, V, _bf16, _f32, _q8, tiny_v41_tensors

TOKENIZER_KV = {
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-v3",
    "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
}
IMAGE_TOKEN = "<｜deepseek_image｜>"
RANK, D, INTER = 16, 32, 48  # Markov rank; vision dim and MLP width


def _tokens() -> dict:
    toks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "a", "b", "ab"]
    toks += [f"t{i}" for i in range(V - len(toks) - 1)] + [IMAGE_TOKEN]  # the image token, last
    return {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.token_type": [3, 3] + [1] * (len(toks) - 3) + [3]}


def draft_tensors(rng: np.random.Generator) -> dict:
    """Two DSpark stages: V4.1 decoder-layer tensors + main projection (3 target layers), norms, Markov head."""
    layer = {k: v for k, v in tiny_v41_tensors(rng, n_layers=2).items() if k.startswith("blk.") and "engram" not in k}
    # The draft is Q8_0 throughout, its routed experts too.
    x = (rng.standard_normal((4, H, 32)) * 0.05).astype(np.float32)
    layer["blk.1.ffn_down_exps.weight"] = ("Q8_0", gq.quantize(x, gguf.GGMLQuantizationType.Q8_0))
    layer.update({
        "blk.0.dspark_main_proj.weight": _q8(rng, H, 3 * H),
        "blk.0.dspark_main_norm.weight": _f32(rng, H),
        "blk.1.dspark_norm.weight": _f32(rng, H),
        "blk.1.dspark_markov_embd.weight": _bf16(rng, V, RANK),
        "blk.1.dspark_markov_head.weight": _bf16(rng, V, RANK),
        "token_embd.weight": _q8(rng, V, H),  # a draft's own embedding: SGLang uses the model's
    })
    return layer


DRAFT_KV = {"deepseek41.block_count": 2, "deepseek41.mtp.block_size": 5, "deepseek41.mtp.markov_rank": RANK,
            "deepseek41.mtp.target_layers": [0, 1, 1], "deepseek41.mtp.expert_count": 4,
            "deepseek41.mtp.expert_used_count": 2}
MMPROJ_KV = {"clip.vision.block_count": 2, "clip.vision.embedding_length": D, "clip.vision.attention.head_count": 2,
             "clip.vision.feed_forward_length": INTER, "clip.vision.patch_size": 2,
             "clip.vision.projector.scale_factor": 2}


def mmproj_tensors(rng: np.random.Generator) -> dict:
    t = {"v.patch_embd.weight": _bf16(rng, D, 12), "v.patch_embd.bias": _f32(rng, D),
         "v.post_ln.weight": _f32(rng, D), "mm.0.weight": _bf16(rng, H, 4 * D), "mm.0.bias": _f32(rng, H),
         "mm.2.weight": _bf16(rng, H, H), "mm.2.bias": _f32(rng, H), "v.image_start": _f32(rng, H),
         "v.image_end": _f32(rng, H), "v.image_newline": _f32(rng, H)}
    for i in range(2):
        b = f"v.blk.{i}."
        t.update({b + "ln1.weight": _f32(rng, D), b + "attn_qkv.weight": _bf16(rng, 3 * D, D),
                  b + "attn_out.weight": _bf16(rng, D, D), b + "ln2.weight": _f32(rng, D),
                  b + "ffn_gate.weight": _bf16(rng, INTER, D), b + "ffn_up.weight": _bf16(rng, INTER, D),
                  b + "ffn_down.weight": _bf16(rng, D, INTER)})
    return t


def with_vl_biases(t: dict, rng: np.random.Generator) -> dict:
    """The model's tensors plus the VL routing bias of every layer (needed to serve images)."""
    return {**t, **{f"blk.{i}.exp_probs_b_vl.bias": _f32(rng, E) for i in range(L)}}


@pytest.fixture
def model_dir(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, dict, dict]:
    d = tmp_path / "models"
    d.mkdir()
    write_gguf(d / "DeepSeek-V4.1-Flash-UD-Q4_K_XL.gguf", "deepseek41", with_vl_biases(tiny_v41_tensors(rng), rng),
               {**KV, **TOKENIZER_KV, **_tokens()})
    dt, mt = draft_tensors(rng), mmproj_tensors(rng)
    write_gguf(d / "DeepSeek-V4.1-Flash-DSpark-Q8_0.gguf", "deepseek41", dt, DRAFT_KV)
    write_gguf(d / "mmproj-BF16.gguf", "clip", mt, MMPROJ_KV)
    return d, dt, mt


def _main(d: Path) -> Path:
    return d / "DeepSeek-V4.1-Flash-UD-Q4_K_XL.gguf"


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(-1).view(torch.uint8).numpy()


def test_sidecars_found_next_to_model_are_bundled(model_dir: tuple[Path, dict, dict], tmp_path: Path) -> None:
    d, dt, mt = model_dir
    folder = gguf_to_checkpoint(_main(d), cache=tmp_path / "cache", draft=None, mmproj=None, progress=False)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["dspark_block_size"] == 5 and cfg["dspark_markov_rank"] == RANK
    assert cfg["dspark_target_layer_ids"] == [0, 1, 1] and cfg["num_nextn_predict_layers"] == 2
    assert cfg["dspark_n_routed_experts"] == 4 and cfg["dspark_num_experts_per_tok"] == 2
    w = load_file(str(folder / "model.safetensors"))
    # Model tensors untouched by the bundling; draft stage tensors under mtp.<stage>.
    assert "embed.weight" in w and "layers.1.attn.wq_a.weight" in w
    mtp = sorted(k for k in w if k.startswith("mtp."))
    assert "mtp.0.main_proj.weight" in mtp and "mtp.0.main_norm.weight" in mtp and "mtp.1.norm.weight" in mtp
    assert "mtp.0.ffn.experts.3.w2.weight" in mtp and "mtp.1.attn.wq_a.weight" in mtp
    q8_experts = dt["blk.1.ffn_down_exps.weight"][1]
    from winport.demo.quantize import dequantize_mxfp4, quantize_mxfp4

    for e in range(4):  # Q8_0 experts of a draft next to an MXFP4 model -> MXFP4 of gguf-py's dequantization
        ref = torch.from_numpy(gq.dequantize(q8_experts[e], gguf.GGMLQuantizationType.Q8_0))
        got, scale = w[f"mtp.1.ffn.experts.{e}.w2.weight"], w[f"mtp.1.ffn.experts.{e}.w2.scale"]
        assert got.dtype == torch.uint8 and scale.dtype == torch.float8_e8m0fnu
        want = dequantize_mxfp4(*quantize_mxfp4(ref, amax_slack=2.0**-6))
        assert torch.equal(dequantize_mxfp4(got, scale), want) and (want - ref).abs().max() > 0
    np.testing.assert_array_equal(_bits(w["mtp.1.markov_head.embed.weight"]),
                                  dt["blk.1.dspark_markov_embd.weight"][1].view(np.uint8).reshape(-1))
    ref = open_gguf(d / "DeepSeek-V4.1-Flash-DSpark-Q8_0.gguf")["blk.0.dspark_main_proj.weight"].dequantize()
    np.testing.assert_allclose(w["mtp.0.main_proj.weight"].float().numpy(), ref, rtol=2**-8, atol=0)
    assert not any(k.startswith("mtp.") and ".embed." in k and "markov" not in k for k in w)
    # mmproj: in the model's shards, SGLang's V4.1 vision names, gate and up stacked into w1.
    v = {k: t for k, t in w.items() if k.startswith(("vision.", "aligner.", "image_"))}
    gate_up = np.concatenate([mt["v.blk.1.ffn_gate.weight"][1], mt["v.blk.1.ffn_up.weight"][1]], axis=0)
    np.testing.assert_array_equal(_bits(v["vision.blocks.1.mlp.w1.weight"]), gate_up.view(np.uint8).reshape(-1))
    assert set(v) >= {"vision.patch_embed.proj.weight", "vision.norm.weight", "aligner.w2.bias", "image_newline"}
    # The file has no attention biases: SGLang's VisionAttention has them, so they are zeros.
    assert not v["vision.blocks.0.attn.wqkv.bias"].any() and v["vision.blocks.0.attn.wqkv.bias"].shape == (3 * D,)
    vc = cfg
    assert vc["vision_n_layers"] == 2 and vc["vision_dim"] == D and vc["vision_downsample_ratio"] == 2
    assert vc["model_type"] == "deepseek_v41" and vc["vision_min_pixels"] == 295936  # SGLang's default
    assert vc["image_token_id"] == V - 1  # looked up in the model's tokenizer
    side = sidecars(folder)
    assert side["draft"]["stages"] == 2 and side["mmproj"]["tensors"] == len(v)
    # Without sidecars: another cache entry, no mtp.* tensors.
    plain = gguf_to_checkpoint(_main(d), cache=tmp_path / "cache", progress=False)
    assert plain != folder and sidecars(plain) == {}
    assert not any(k.startswith("mtp.") for k in load_file(str(plain / "model.safetensors")))


def test_direct_route_yields_exactly_the_copied_tensors(model_dir: tuple[Path, dict, dict], tmp_path: Path) -> None:
    """The folder `winport serve` writes for a GGUF (weights="direct") holds no weights; what SGLang's
    loader then reads from the GGUF (winport.gguf.direct.weights) is, name for name and bit for bit and
    in the same order, what the copying route writes into safetensors (model, DSpark draft, mmproj;
    MXFP4 experts, Q8_0 -> FP8 dense)."""
    from winport.gguf import direct

    d, _, _ = model_dir
    copied = gguf_to_checkpoint(_main(d), cache=tmp_path / "copy", draft=None, mmproj=None, dense_fp8=None,
                                progress=False)
    lean = gguf_to_checkpoint(_main(d), cache=tmp_path / "direct", draft=None, mmproj=None, dense_fp8=None,
                              progress=False, weights="direct")
    assert not [p for p in lean.iterdir() if p.suffix == ".safetensors" or "index" in p.name]
    assert json.loads((lean / "config.json").read_text()) == json.loads((copied / "config.json").read_text())
    assert sidecars(lean)["draft"]["stages"] == 2 and "mmproj" in sidecars(lean)
    info = direct.read_sidecar(lean)
    assert info is not None and info["fp4_experts"] and info["dense_fp8"]
    want = load_file(str(copied / "model.safetensors"))
    got = list(direct.weights(lean, progress=False))
    names = [n for n, _ in got]
    assert len(names) == len(set(names)) and sorted(names) == sorted(want)
    assert names == list(_stream_order(copied))
    for name, t in got:
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        np.testing.assert_array_equal(_bits(t), _bits(want[name]), err_msg=name)
    assert direct.read_sidecar(copied) is None
    (lean / direct.SIDECAR).write_text(json.dumps({**info, "model": str(tmp_path / "gone.gguf")}))
    with pytest.raises(GGUFError, match="gone.gguf: the GGUF this server reads its weights from is gone"):
        next(direct.weights(lean, progress=False))


def test_cli_convert_writes_a_safetensors_folder(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`winport gguf convert` is the explicit safetensors export (serving reads the GGUF and needs none)."""
    from winport.gguf.cli import convert_main

    d, _, _ = model_dir
    out = tmp_path / "ckpt"
    assert convert_main([str(_main(d)), str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert "mtp.0.main_proj.weight" in load_file(str(out / "model.safetensors"))  # the draft next to it
    assert not list(tmp_path.glob("*.converting"))
    assert convert_main([str(_main(d)), str(out)]) == 2 and "exists" in capsys.readouterr().err


def _stream_order(folder: Path) -> list[str]:
    """Tensor names of a single-shard safetensors file in the order they were written."""
    import struct

    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return [k for k, _ in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])]


def _plan(argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cuda: bool = False):
    from winport.serve import command

    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(command, "_cuda_available", lambda: cuda)
    return command.build_plan(argv)


def test_serve_plan_dspark_on_cuda(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    d, _, _ = model_dir
    plan = _plan(["--model", str(_main(d)), "--device", "cuda"], monkeypatch, tmp_path, cuda=True)
    a = plan.argv
    assert a[a.index("--speculative-algorithm") + 1] == "DSPARK"
    assert a[a.index("--speculative-draft-model-path") + 1] == str(plan.model_path)
    assert "mtp.0.main_proj.weight" in served_tensors(plan.model_path)  # read from the GGUFs by SGLang's loader
    assert "bundled into the model: image inputs are served" in capsys.readouterr().out


def test_a_found_draft_is_left_out_when_kt_kernel_runs_experts(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """With routed experts in kt-kernel (--gpu-experts N, or a --vram-gib plan that leaves some on the CPU)
    a draft only found next to the model is not used: the decode budget projects DSpark as a loss there
    (scripts/bench/RESULTS.md). Asked for by flag, it is used; with every expert on the GPU it stays on."""
    from winport.placement import cli

    d, _, _ = model_dir
    plan = _plan(["--model", str(_main(d)), "--device", "cuda", "--gpu-experts", "2"], monkeypatch, tmp_path, cuda=True)
    assert "--speculative-algorithm" not in plan.argv and "--speculative-draft-model-path" not in plan.argv
    assert "DSpark draft found next to the model but not used: with routed experts in kt-kernel" in capsys.readouterr().out
    plan = _plan(["--model", str(_main(d)), "--device", "cuda", "--gpu-experts", "2", "--speculative-algorithm",
                  "DSPARK"], monkeypatch, tmp_path, cuda=True)
    assert plan.argv.count("--speculative-algorithm") == 1 and "--kt-num-gpu-experts" in plan.argv
    # A budget that leaves experts on the CPU: the draft is left out and not counted in the plan.
    monkeypatch.setattr(cli, "card", lambda: (96 * 2**30, "a pretended card"))
    monkeypatch.setattr(cli, "host_ram", lambda: 512 * 2**30)
    monkeypatch.setattr("winport.placement.model_bytes.ModelBytes.expert_gpu", lambda self, mxfp4: 2**30)
    plan = _plan(["--model", str(_main(d)), "--device", "cuda", "--vram-gib", "8", "--context-length", "4096"],
                 monkeypatch, tmp_path, cuda=True)
    n = plan.placement.inputs.sizes.experts_per_layer
    assert 0 < plan.placement.slots < n
    assert "--speculative-algorithm" not in plan.argv
    assert "draft" not in {what for what, _, _ in plan.placement.lines}


def test_serve_plan_cpu_notes_and_refusals(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from winport.serve.command import ServeError

    d, _, _ = model_dir
    plan = _plan(["--model", str(_main(d)), "--device", "cpu"], monkeypatch, tmp_path)
    assert "--speculative-algorithm" not in plan.argv
    out = capsys.readouterr().out
    assert "DSpark draft found next to the model but not used" in out and "only on CUDA, NPU or XPU" in out
    # Named by flag: refused with the reason, before the model is converted (fresh cache stays empty).
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache2"))
    draft = d / "DeepSeek-V4.1-Flash-DSpark-Q8_0.gguf"
    with pytest.raises(ServeError, match=r"--draft-model .*only on CUDA, NPU or XPU.*usable DSpark draft"):
        _plan(["--model", str(_main(d)), "--device", "cpu", "--draft-model", str(draft)], monkeypatch, tmp_path / "x")
    assert not (tmp_path / "x" / "cache" / "gguf").exists()
    # A projector named by flag is served (bundled into the checkpoint), on the CPU too.
    plan = _plan(["--model", str(_main(d)), "--device", "cpu", "--mmproj", str(d / "mmproj-BF16.gguf")],
                 monkeypatch, tmp_path / "y")
    assert sidecars(plan.model_path)["mmproj"]["source"] == [str(d / "mmproj-BF16.gguf")]


def test_draft_named_by_flag_elsewhere(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    d, _, _ = model_dir
    other = tmp_path / "elsewhere"
    other.mkdir()
    p = write_gguf(other / "my-speculator.gguf", "deepseek41", draft_tensors(rng), DRAFT_KV)
    plan = _plan(["--model", str(_main(d)), "--device", "cuda", "--draft-model", str(p)], monkeypatch, tmp_path,
                 cuda=True)
    assert sidecars(plan.model_path)["draft"]["source"] == [str(p)]
    assert "DSPARK" in plan.argv


@pytest.mark.parametrize("damage,match", [
    ("no_markov", r"Markov head"),
    ("no_targets", r"deepseek41\.mtp\.target_layers missing"),
    ("wrong_targets", r"2 target layers in the metadata, 3 by the shape"),
    ("no_stage_tensor", r"required tensor blk\.1\.attn_q_a\.weight missing"),
])
def test_bad_draft_is_named(model_dir: tuple[Path, dict, dict], tmp_path: Path, rng: np.random.Generator,
                            monkeypatch: pytest.MonkeyPatch, damage: str, match: str) -> None:
    from winport.serve.command import ServeError

    d, _, _ = model_dir
    t, kv = draft_tensors(rng), dict(DRAFT_KV)
    if damage == "no_markov":
        del t["blk.1.dspark_markov_head.weight"]
    elif damage == "no_targets":
        del kv["deepseek41.mtp.target_layers"]
    elif damage == "wrong_targets":
        kv["deepseek41.mtp.target_layers"] = [1, 2]
    else:
        del t["blk.1.attn_q_a.weight"]
    bad = write_gguf(tmp_path / "bad-draft.gguf", "deepseek41", t, kv)
    with pytest.raises(GGUFError, match=match) as ei:
        gguf_to_checkpoint(_main(d), cache=tmp_path / "cache", draft=bad, progress=False)
    assert str(bad) in str(ei.value)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))  # checked before any conversion
    with pytest.raises(ServeError, match=match):
        _plan(["--model", str(_main(d)), "--device", "cuda", "--draft-model", str(bad)], monkeypatch, tmp_path,
              cuda=True)


def test_bad_mmproj_is_named(model_dir: tuple[Path, dict, dict], tmp_path: Path, rng: np.random.Generator) -> None:
    d, _, _ = model_dir
    t = mmproj_tensors(rng)
    del t["v.blk.1.ffn_up.weight"], t["mm.2.weight"]
    bad = write_gguf(tmp_path / "mmproj-bad.gguf", "clip", t, MMPROJ_KV)
    with pytest.raises(GGUFError) as ei:
        gguf_to_checkpoint(_main(d), cache=tmp_path / "cache", mmproj=bad, progress=False)
    msg = str(ei.value)
    assert str(bad) in msg and "v.blk.1.ffn_gate_up.weight" in msg and "mm.2.weight" in msg
    # A truncated file: the reader's error, naming the file.
    raw = (d / "mmproj-BF16.gguf").read_bytes()
    cut = tmp_path / "mmproj-cut.gguf"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(GGUFError, match=str(cut).replace(".", r"\.")):
        gguf_to_checkpoint(_main(d), cache=tmp_path / "cache", mmproj=cut, progress=False)


def test_serve_vram_plan_counts_the_draft_and_the_vision_tower(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`--vram-gib` on a GGUF served with no copy: the plan reads the draft's and the mmproj's sizes from
    their GGUF headers (winport.placement.source), as served: quantized tensors 1 byte a value (FP8),
    float ones at their width; counted here with gguf-py's reader, not winport's."""
    import gguf

    from winport.placement import cli

    d, _, _ = model_dir
    monkeypatch.setattr(cli, "card", lambda: (96 * 2**30, "a pretended card"))
    monkeypatch.setattr(cli, "host_ram", lambda: 512 * 2**30)
    plan = _plan(["--model", str(_main(d)), "--device", "cuda", "--vram-gib", "40", "--context-length", "4096"],
                 monkeypatch, tmp_path, cuda=True)

    def served(path: Path) -> int:
        width = {"F32": 4, "F16": 2, "BF16": 2}
        return sum(int(np.prod(t.shape)) * width.get(t.tensor_type.name, 1) for t in gguf.GGUFReader(path).tensors)

    lines = {what: size for what, size, _ in plan.placement.lines}
    assert lines["draft"] == served(d / "DeepSeek-V4.1-Flash-DSpark-Q8_0.gguf") > 0
    assert lines["vision tower"] == served(d / "mmproj-BF16.gguf") > 0
    out = capsys.readouterr().out
    assert "winport serve:   draft" in out and "winport serve:   vision tower" in out


def test_hot_swaps_read_from_the_gguf_the_experts_loading_gave(model_dir: tuple[Path, dict, dict],
                                                               tmp_path: Path) -> None:
    """A folder served straight from its GGUF has no safetensors: GPU expert swaps read each expert from
    the GGUF (winport.hybrid.expert_source.GGUFExperts), bit for bit what the copying route wrote for it
    (and so what loading handed SGLang and kt-kernel)."""
    from winport.hybrid.expert_source import CheckpointExperts, GGUFExperts, NoExpertSource, expert_source

    d, _, _ = model_dir
    copied = gguf_to_checkpoint(_main(d), cache=tmp_path / "copy", draft=None, mmproj=None, dense_fp8=None,
                                progress=False)
    lean = gguf_to_checkpoint(_main(d), cache=tmp_path / "direct", draft=None, mmproj=None, dense_fp8=None,
                              progress=False, weights="direct")
    config = json.loads((copied / "config.json").read_text())
    experts = config["n_routed_experts"]
    for layer in range(config["num_hidden_layers"]):
        want, got = CheckpointExperts(copied, layer, experts), expert_source(lean, layer, experts)
        assert isinstance(got, GGUFExperts) and isinstance(expert_source(copied, layer, experts), CheckpointExperts)
        for e in range(experts):
            a, b = want(e), got(e)
            for field in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                x, y = getattr(a, field), getattr(b, field)
                assert x.shape == y.shape and x.element_size() == y.element_size(), (layer, e, field)
                np.testing.assert_array_equal(_bits(x), _bits(y), err_msg=f"layer {layer} expert {e} {field}")
    with pytest.raises(NoExpertSource, match="no safetensors files"):
        CheckpointExperts(lean, 0, experts)
    with pytest.raises(NoExpertSource, match=f"GPU expert swaps read {experts + 1} MXFP4 experts"):
        GGUFExperts(_main(d), 0, experts + 1)


def test_loading_and_hot_swaps_share_one_open_of_the_gguf(model_dir: tuple[Path, dict, dict], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With hot experts on, the weight stream keeps the GGUF open and every layer's swap source reads that
    same open (issue 22: one open a process); without them the stream closes it at its end."""
    from winport.gguf import convert, direct
    from winport.hybrid import expert_source as es

    d, _, _ = model_dir
    lean = gguf_to_checkpoint(_main(d), cache=tmp_path / "direct", draft=None, mmproj=None, dense_fp8=None,
                              progress=False, weights="direct")
    model = direct.read_sidecar(lean)["model"]
    experts = json.loads((lean / "config.json").read_text())["n_routed_experts"]
    opens: list[Path] = []
    real = convert.open_gguf
    monkeypatch.setattr(convert, "open_gguf", lambda p: (opens.append(Path(p).resolve()), real(p))[1])

    def model_opens() -> int:
        return sum(p == Path(model).resolve() for p in opens)

    es._open_gguf.cache_clear()
    try:
        assert sum(1 for _ in direct.weights(lean, progress=False, keep_open=True)) > 0
        assert model in direct._OPEN
        for layer in (0, 1):
            es.expert_source(lean, layer, experts)(experts - 1)
        assert model_opens() == 1, opens
    finally:
        es._open_gguf.cache_clear()
        while model in direct._OPEN:
            direct.let_go(model)
    opens.clear()
    assert sum(1 for _ in direct.weights(lean, progress=False)) > 0
    assert model not in direct._OPEN and model_opens() == 1  # opened for the stream, closed at its end
