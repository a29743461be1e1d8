"""Let DeepSeek-V4's FP8 KV cache exist on CPUs without AMX.

Targets sglang 0.5.23 `srt/mem_cache/kv_cache_configurator.py:KVCacheConfigurator.configure`,
which refuses an FP8 KV cache on CPU unless the CPU has AMX and the attention backend is
intel_amx. That rule is about the generic MHA FP8 path. DeepSeek-V4's pool stores its own
584-byte-per-token layout and is read by winport's DSV4 attention kernels, which need no AMX, so
for DeepSeek-V4 models the two checks are satisfied for the duration of the call.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure"


def _is_dsv4(configurator: Any) -> bool:
    model = getattr(configurator, "model", None)
    return type(model).__name__.startswith("DeepseekV4")


def _configure(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    if not _is_dsv4(self):
        return original(self, *args, **kwargs)
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    saved = mod.cpu_has_amx_support, mod.attention_backends
    mod.cpu_has_amx_support = lambda: True
    mod.attention_backends = lambda: ["intel_amx"]
    try:
        return original(self, *args, **kwargs)
    finally:
        mod.cpu_has_amx_support, mod.attention_backends = saved


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, "if not cpu_has_amx_support():", "configured_backends = set(attention_backends())")
    register(TARGET, _configure)
