"""Shim for `flash_attn_interface` (FlashAttention-3 (flash_attn_interface)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
Same implementation as sgl_kernel.flash_attn (the FA3 signatures are the same).
"""

from shims._missing import missing_getattr
from shims.sgl_kernel.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401

__getattr__ = missing_getattr("flash_attn_interface", "FlashAttention-3 (flash_attn_interface)")
