"""`flash_mla.fused_norm_rope_attn_rope_cast` (FlashMLA MegaAttention): not implemented.

SGLang's `flash_mla_interface` imports this module at import time (`from flash_mla import
fused_norm_rope_attn_rope_cast as _mega`) but calls it only on the SM100 "flashmla_mega" path.
The module exists so that import succeeds; every attribute (prefill, decode, ...) raises the
shim's missing-name error naming the upstream function.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("flash_mla.fused_norm_rope_attn_rope_cast", "FlashMLA MegaAttention (sgl-flash-mla)")
