"""winport.patches.cpu_tp_dsv4_single_kv_head: CPU tensor parallelism keeps DeepSeek-V4's single KV head."""

from __future__ import annotations

import types

import pytest


def _demo_model_config(tmp_path):  # type: ignore[no-untyped-def]
    import json

    from sglang.srt.configs.model_config import ModelConfig

    from winport.demo.config import demo_config

    (tmp_path / "config.json").write_text(json.dumps(demo_config("v4")))
    return ModelConfig(str(tmp_path), trust_remote_code=True)


def test_cpu_tp_keeps_deepseek_v4_single_kv_head(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp as upstream

    from winport.patches.cpu_tp_dsv4_single_kv_head import adjust

    # Upstream alone pads the single KV head to 2 and doubles the query heads (the bug).
    padded = upstream(_demo_model_config(tmp_path), LoadConfig(), 2)
    assert (padded.hf_config.num_key_value_heads, padded.num_attention_heads) == (2, 16)
    fixed = adjust(upstream, _demo_model_config(tmp_path), LoadConfig(), 2)
    for cfg in (fixed, fixed.hf_config, fixed.hf_text_config):
        assert (cfg.num_key_value_heads, cfg.num_attention_heads) == (1, 8)
    assert fixed.hf_config.original_num_attention_heads == 8  # the rest of upstream's work is kept
    with pytest.raises(ValueError, match=r"--tp 3: num_attention_heads=8 and o_groups=2"):
        adjust(upstream, _demo_model_config(tmp_path), LoadConfig(), 3)
    other = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"]))
    assert adjust(lambda mc, lc, tp: ("upstream", mc, tp), other, None, 2) == ("upstream", other, 2)
