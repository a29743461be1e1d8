"""Rope for DeepSeek-V4 layers without compression on CPU.

Targets sglang 0.5.23 `srt/models/deepseek_v4.py` (the attention __init__ calls
`get_rope_wrapper(..., rope_scaling=None)` for compress-ratio-0 layers) and
`srt/layers/rotary_embedding/factory.py:get_rope_cpu`, which asserts `rope_scaling is not None`
(it only knows deepseek_yarn). Without scaling, the generic `get_rope` is the right rotary (plain
RoPE, GPT-J style as requested), so the wrapper is sent there on CPU.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.models.deepseek_v4.get_rope_wrapper"


def _rope_wrapper(original: Any, *args: Any, **kwargs: Any) -> Any:
    device = kwargs.get("device")
    rope_scaling = kwargs.get("rope_scaling", args[5] if len(args) > 5 else None)
    if str(device) == "cpu" and rope_scaling is None:
        from sglang.srt.layers.rotary_embedding.factory import get_rope

        params = dict(kwargs)
        params.pop("device", None)
        return get_rope(*args, **params)
    return original(*args, **kwargs)


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source("sglang.srt.layers.rotary_embedding.factory.get_rope_cpu", "assert rope_scaling is not None")
    register(TARGET, _rope_wrapper)
