"""Shim for `sgl_kernel` (sglang-kernel (sgl_kernel)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("sgl_kernel", "sglang-kernel (sgl_kernel)")
