"""Shim for `flashinfer.rope`: apply_rope_with_cos_sin_cache_inplace."""

from shims._missing import missing_getattr
from shims.sgl_kernel._ops import apply_rope_with_cos_sin_cache_inplace  # noqa: F401

__getattr__ = missing_getattr("flashinfer.rope", "flashinfer-python")
