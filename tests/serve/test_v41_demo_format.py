"""The V4.1 demo's storage format (winport.demo.quantize with the V4.1 block), without a server.

DeepSeek-V4.1 stores dense linears in FP8 with [32, 32] blocks (V4: [128, 128]; SGLang 0.5.23's
models/deepseek_v4.py `_dequant_fp8` says the same) and routed experts in MXFP4; the engram table is
FP8 rows with one E8M0 scale per 32 values in both the quantized and the `--bf16` form (SGLang reads
it only that way). The quantizers themselves are checked against references in test_demo_quant.py;
here: which tensor gets which format, the scale grids, and that the `--bf16` form is the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from winport.demo import quantize as qz
from winport.demo.config import demo_config

CFG = demo_config("v41")


@pytest.fixture(scope="module")
def plain() -> dict[str, torch.Tensor]:
    from winport.demo.weights_v41 import demo_state_dict_v41

    return demo_state_dict_v41(CFG)


@pytest.fixture(scope="module")
def quant(plain: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return qz.quantize_state_dict(plain, qz.V41_BLOCK)


def test_block_per_variant() -> None:
    assert qz.block_for("v4") == (128, 128) and qz.block_for("v41") == (32, 32)
    with pytest.raises(ValueError, match="unknown demo variant 'v5'"):
        qz.block_for("v5")


def test_which_tensor_is_stored_how(plain: dict[str, torch.Tensor], quant: dict[str, torch.Tensor]) -> None:
    fp8 = {n for n, t in quant.items() if t.dtype == torch.float8_e4m3fn and n.endswith(".weight")}
    fp4 = {n for n, t in quant.items() if t.dtype == torch.int8}
    for name in ("layers.1.attn.wq_b.weight", "layers.3.attn.indexer.wq_b.weight", "layers.2.engram.wkv.weight",
                 "layers.5.ffn.shared_experts.w2.weight", "mtp.0.main_proj.weight", "mtp.2.attn.wo_a.weight"):
        assert name in fp8, name
    # bf16 in the real checkpoint (SGLang builds them without a quant method)
    for name in ("layers.1.attn.compressor.wkv.weight", "layers.3.attn.indexer.wk.weight",
                 "layers.1.attn.indexer.weights_proj.weight", "mtp.1.ffn.gate.weight", "embed.weight"):
        assert quant[name].dtype == torch.bfloat16, name
    n_main = CFG["num_hidden_layers"] * CFG["n_routed_experts"] * 3
    n_draft = CFG["num_nextn_predict_layers"] * CFG["dspark_n_routed_experts"] * 3
    assert len(fp4) == n_main + n_draft
    # [32, 32] grids: engram wkv [5 * 256, 3 * 2 * 64] (2- to 4-grams, 2 heads) -> [40, 12];
    # wq_b [8 * 512, 128] -> [128, 4]
    assert quant["layers.2.engram.wkv.scale"].shape == (40, 12)
    assert quant["layers.1.attn.wq_b.scale"].shape == (128, 4)
    assert quant["mtp.0.ffn.experts.3.w2.scale"].shape == (256, 128 // 32)
    for n in fp8 | fp4:
        assert quant[n[: -len("weight")] + "scale"].dtype == torch.float8_e8m0fnu, n
    # the engram table is passed through untouched (already FP8 + per-32 E8M0)
    for n in ("layers.2.engram.embed.weight", "layers.2.engram.embed.scale"):
        assert torch.equal(quant[n].view(torch.uint8), plain[n].view(torch.uint8)), n


def test_bf16_form_is_the_same_model(plain: dict[str, torch.Tensor], quant: dict[str, torch.Tensor]) -> None:
    bf16 = qz.quantized_values(plain, qz.V41_BLOCK)
    back = qz.dequantize_state_dict(quant)
    assert set(bf16) == set(back) == set(plain)
    for n, t in bf16.items():
        assert torch.equal(t.view(torch.uint8), back[n].view(torch.uint8)), n
    assert bf16["layers.2.engram.embed.weight"].dtype == torch.float8_e4m3fn  # kept as SGLang reads it
    assert bf16["layers.1.attn.wq_b.weight"].dtype == torch.bfloat16
    # (The values alone do not show the block: with power-of-two scales both [32, 32] and [128, 128]
    # blocks give e4m3's 4 significant bits unless an element falls into the subnormal range; the
    # scale grids checked above do.)


def test_quantization_config_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build_demo writes V4.1's quantization_config (and none in the --bf16 form); weights stubbed."""
    from winport.demo import build

    monkeypatch.setattr("winport.demo.weights_v41.demo_state_dict_v41",
                        lambda config, seed=0: {"layers.0.attn.wq_a.weight": torch.ones(64, 64, dtype=torch.bfloat16)})
    q = build.build_demo(tmp_path / "q", "v41", quiet=True)
    b = build.build_demo(tmp_path / "b", "v41", quiet=True, quantized=False)
    assert json.loads((q / "config.json").read_text())["quantization_config"]["weight_block_size"] == [32, 32]
    assert "quantization_config" not in json.loads((b / "config.json").read_text())
    assert build.is_current(q, "v41") and not build.is_current(q, "v41", quantized=False)
    assert build.is_current(b, "v41", quantized=False)
    assert build.default_dir("v41", False).name == "demo-v41-bf16" and build.default_dir("v41").name == "demo-v41"
