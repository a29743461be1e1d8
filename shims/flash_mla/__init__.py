"""Shim for `flash_mla` (FlashMLA (sgl-flash-mla)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("flash_mla", "FlashMLA (sgl-flash-mla)")
