"""The full-width V4.1-Flash proxy (winport.demo.full_width).

At full width a layer is ~7 GB, too much for CI: here its config and tensor plan are checked at
the real shapes on the meta device, and the writer runs on the same config at the demo's widths,
where its checkpoint must be the V4.1 demo's checkpoint format tensor for tensor (the demo's own
generator and quantizers give the reference; the demo is what SGLang serves in CI). The full width
is served on the H200 machine (scripts/gpu/hybrid_check.sh, part proxy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from winport.demo import quantize
from winport.demo.config import demo_config
from winport.demo.config_v41 import engram_primes
from winport.demo.full_width import INDEX_FILE, full_width_config, planned_tensors, write_checkpoint
from winport.demo.weights_v41 import demo_state_dict_v41


def test_config_has_the_real_layer_shapes() -> None:
    cfg = full_width_config(4)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]) == (5120, 64, 512)
    assert (cfg["q_lora_rank"], cfg["o_lora_rank"], cfg["o_groups"]) == (1280, 1024, 8)
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (384, 6, 2304)
    assert (cfg["index_n_heads"], cfg["index_head_dim"], cfg["engram_head_dim"]) == (32, 128, 256)
    assert cfg["compress_ratios"] == [0, 2, 2, 1] and cfg["kv_source_layer_ids"] == [1, 3]
    assert cfg["num_nextn_predict_layers"] == 0 and not any(k.startswith("dspark_") for k in cfg)
    assert full_width_config(2)["engram_layer_ids"] == [0]
    for bad in (1, 5):
        with pytest.raises(ValueError, match=f"--layers {bad}"):
            full_width_config(bad)


@pytest.mark.parametrize("layers", [2, 3, 4])
def test_layer_roles_suit_sglangs_cuda_tail(layers: int) -> None:
    # On CUDA, SGLang 0.5.23's DeepseekV4Model (decoder SWA bounded replay) asserts these at build
    # time; a 2-layer proxy with its engram on layer 1 failed there on the H200 (2026-12-02).
    cfg = full_width_config(layers)
    last = max(cfg["kv_source_layer_ids"])
    assert last not in cfg["engram_layer_ids"]
    assert last in cfg["index_source_layer_ids"] and cfg["candidate_source_layer_id"] in (-1, last)
    assert set(cfg["compress_ratios"][last + 1:]) <= {0, 1}
    assert cfg["num_hash_layers"] <= last
    assert len(cfg["compress_ratios"]) == layers and cfg["engram_layer_ids"][0] < layers
    assert set(cfg["kv_source_layer_ids"]) == set(cfg["index_source_layer_ids"])


def test_plan_at_full_width() -> None:
    plan = planned_tensors(full_width_config(2))
    assert sorted(k for k in plan if k is not None) == [0, 1]
    layer1 = dict(plan[1])
    experts = [n for n in layer1 if ".ffn.experts." in n]
    assert len(experts) == 384 * 3
    assert layer1["layers.1.ffn.experts.383.w1.weight"] == (2304, 5120)
    assert layer1["layers.1.ffn.experts.0.w2.weight"] == (5120, 2304)
    assert layer1["layers.1.attn.wq_b.weight"] == (64 * 512, 1280)
    assert layer1["layers.1.attn.wo_a.weight"] == (8 * 1024, 64 * 512 // 8)
    assert layer1["layers.1.ffn.shared_experts.w1.weight"] == (2304, 5120)
    assert dict(plan[None])["embed.weight"] == (1024, 5120)
    # MXFP4 experts: 2304 x 5120 x 3 projections x 384 at 4.25 bits
    expert_bytes = sum(s[0] * s[1] for n, s in layer1.items() if ".ffn.experts." in n) * 17 // 32
    assert 7.2e9 < expert_bytes < 7.25e9  # 384 x 18.8 MB (shared/FACTS.md)


def _narrow(layers: int) -> dict:
    """The proxy's config at the demo's widths (and a small engram table)."""
    cfg = full_width_config(layers)
    demo = demo_config("v41")
    for key in ("hidden_size", "num_attention_heads", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts",
                "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "index_n_heads",
                "index_head_dim", "engram_head_dim", "engram_vocab_size"):
        cfg[key] = demo[key]
    primes = engram_primes(1, cfg["engram_max_ngram_size"], cfg["engram_n_heads"], cfg["engram_vocab_size"])
    cfg["engram_num_embeddings"] = [sum(sum(r) for r in layer) for layer in primes]
    return cfg


def test_writer_gives_the_demo_checkpoint_format(tmp_path: Path) -> None:
    cfg = _narrow(3)
    folder = write_checkpoint(tmp_path / "proxy", cfg, seed=3, say=lambda _m: None)
    index = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    got: dict[str, torch.Tensor] = {}
    for file in sorted(set(index.values())):
        with safe_open(str(folder / file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                assert index[name] == file
                got[name] = f.get_tensor(name)
    assert set(got) == set(index)
    want = quantize.quantize_state_dict(demo_state_dict_v41(cfg, seed=3), quantize.V41_BLOCK)
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        t = got[name]
        assert (t.dtype, t.shape) == (ref.dtype, ref.shape), name
        if ".ffn.experts." in name:
            continue  # drawn directly as MXFP4 (module docstring): format only
        assert torch.equal(t.view(torch.uint8) if t.element_size() == 1 else t,
                           ref.view(torch.uint8) if ref.element_size() == 1 else ref), name
    codes = got["layers.1.ffn.experts.0.w1.weight"].view(torch.uint8)
    scales = got["layers.1.ffn.experts.0.w1.scale"].view(torch.uint8)
    assert codes.unique().numel() > 200 and set(scales.unique().tolist()) == {119, 120}
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [32, 32]
    assert not list(tmp_path.glob("*.partial-*"))
