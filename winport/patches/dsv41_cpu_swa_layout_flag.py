"""Give DeepSeek-V4's attention backend its SWA-layout flag off CUDA, which V4.1 decode reads.

Targets sglang 0.5.23 `srt/layers/attention/deepseek_v4_backend.py`: `DeepseekV4AttnBackend.__init__`
sets `self._swa_interleaved` (whether the SWA cache rows use an interleaved V4.1 layout) only under
`if is_cuda():`, next to FlashMLA's CUDA kernel handle, but `_forward_attention` reads it for every
V4.1 model (`if self.is_dsv41 and (not self._swa_interleaved or ...)`), so the first V4.1 decode on
CPU fails with AttributeError. The flag is a fact about the KV pool, not about CUDA: after the
constructor, a backend without it gets upstream's own formula,
`token_to_kv_pool.get_swa_key_layout().is_interleaved`. On the XPU route winport uses, the branch
it guards only precomputes FlashMLA's CUDA schedule, which returns at once without FlashMLA
metadata, so with a non-interleaved pool nothing else is read.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend.__init__"
READER = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._forward_attention"


def _init(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    result = original(self, *args, **kwargs)
    if not hasattr(self, "_swa_interleaved"):
        self._swa_interleaved = bool(self.token_to_kv_pool.get_swa_key_layout().is_interleaved)
    return result


def register_patch() -> None:
    """Check that upstream still sets the flag only on CUDA and reads it for V4.1, then hook."""
    require_source(TARGET, "if is_cuda():", "self._swa_interleaved = (",
                   "self.token_to_kv_pool.get_swa_key_layout().is_interleaved")
    require_source(READER, "not self._swa_interleaved")
    register(TARGET, _init)
