"""winport.patches.cpu_dsv4_fp8_kv: SGLang's FP8 KV-cache check on CPU is relaxed for DeepSeek-V4 only."""

from __future__ import annotations

import types


def test_fp8_kv_check_is_relaxed_for_deepseek_v4_only() -> None:
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    from winport.patches.cpu_dsv4_fp8_kv import _configure

    seen = {}

    def original(self):  # type: ignore[no-untyped-def]
        seen["amx"] = mod.cpu_has_amx_support()
        seen["backends"] = list(mod.attention_backends())
        return "configured"

    class DeepseekV4ForCausalLM:  # the class name is what the patch checks
        pass

    dsv4 = types.SimpleNamespace(model=DeepseekV4ForCausalLM())
    assert _configure(original, dsv4) == "configured"
    assert seen == {"amx": True, "backends": ["intel_amx"]}
    assert mod.cpu_has_amx_support.__name__ != "<lambda>"  # restored after the call
