"""CPU tensor parallelism for DeepSeek-V4: keep its single, replicated KV head.

Targets sglang 0.5.23 `srt/configs/update_config.py:adjust_config_with_unaligned_cpu_tp`, which
`ModelRunner.load_model` calls on CPU only. It pads attention heads so that GQA models with head
counts not divisible by the TP size still split: when `num_attention_heads % tp` or
`total_num_kv_heads % tp` is non-zero it pads the KV heads up to a multiple of tp and scales the
query heads with them. DeepSeek-V4 has one KV head by design (a latent shared by every query
head, replicated on each rank, never split), so with tp=2 the KV count 1 becomes 2 and the query
heads double; `MqaAttentionBase.__init__` (srt/models/deepseek_v4.py) then stops at
`assert config.num_key_value_heads == 1` (and the checkpoint shapes would no longer fit). CUDA
never calls this function, which is why upstream TP works there.

For DeepSeek-V4 models the head counts are restored after the call (everything else the function
does, such as padding MoE intermediate sizes, is kept). The query heads and output groups are
split evenly across ranks by the model itself, so a TP size that does not divide them is refused
here with the numbers, instead of a shape error deep in the weight loader.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.configs.update_config.adjust_config_with_unaligned_cpu_tp"
# The attributes the padding branch rewrites on model_config, hf_config and hf_text_config.
HEAD_ATTRS = ("num_key_value_heads", "num_attention_heads", "qk_head_dim")
_MISSING = object()


def is_dsv4(hf_config: Any) -> bool:
    """Whether a HF config describes DeepSeek-V4 or V4.1 (single latent KV head)."""
    archs = getattr(hf_config, "architectures", None) or []
    model_type = str(getattr(hf_config, "model_type", ""))
    return model_type.startswith("deepseek_v4") or any(str(a).startswith("DeepseekV4") for a in archs)


def check_split(hf_config: Any, tp_size: int) -> None:
    """Refuse a TP size that does not divide DeepSeek-V4's query heads or output groups."""
    heads = int(hf_config.num_attention_heads)
    groups = int(getattr(hf_config, "o_groups", heads))
    if heads % tp_size or groups % tp_size:
        raise ValueError(
            f"DeepSeek-V4 with --tp {tp_size}: num_attention_heads={heads} and o_groups={groups} "
            f"(config.json) must both be divisible by the TP size")


def adjust(original: Any, model_config: Any, load_config: Any, tp_size: int, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: run upstream's adjustment, then undo its head padding for DeepSeek-V4."""
    if not is_dsv4(model_config.hf_config):
        return original(model_config, load_config, tp_size, *args, **kwargs)
    check_split(model_config.hf_text_config, tp_size)
    configs = [model_config, model_config.hf_config, model_config.hf_text_config]
    saved = [{a: getattr(c, a, _MISSING) for a in HEAD_ATTRS} for c in configs]
    result = original(model_config, load_config, tp_size, *args, **kwargs)
    for cfg, values in zip(configs, saved, strict=True):
        for attr, value in values.items():
            if value is _MISSING:
                if attr in getattr(cfg, "__dict__", {}):
                    delattr(cfg, attr)
            else:
                setattr(cfg, attr, value)
    return result


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(
        TARGET,
        "model_config.get_total_num_kv_heads() % tp_size != 0",
        'update_config(config, "num_key_value_heads", num_key_value_heads)',
        'update_config(config, "num_attention_heads", num_attention_heads)',
    )
    require_source("sglang.srt.models.deepseek_v4.MqaAttentionBase.__init__",
                   "assert config.num_key_value_heads == 1",
                   "self.n_local_heads = self.n_heads // self.attn_tp_size")
    require_source("sglang.srt.model_executor.model_runner.ModelRunner.load_model",
                   "adjust_config_with_unaligned_cpu_tp(")
    register(TARGET, adjust)
