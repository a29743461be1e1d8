"""Shim for `flash_mla` (FlashMLA (sgl-flash-mla)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
Implemented: sparse decode on the DeepSeek-V4 FP8 cache (`flash_mla_with_kvcache` with
`indices`), sparse prefill (`flash_mla_sparse_fwd`), `get_mla_metadata`, `FlashMLASchedMeta`.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("flash_mla", "FlashMLA (sgl-flash-mla)")

from shims.flash_mla import flash_mla_interface, fused_norm_rope_attn_rope_cast  # noqa: E402,F401
from shims.flash_mla.flash_mla_interface import (  # noqa: E402,F401
    FlashMLASchedMeta,
    flash_mla_sparse_fwd,
    flash_mla_with_kvcache,
    get_mla_metadata,
)
