"""Shim for `deep_gemm` (DeepGEMM (sgl-deep-gemm)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("deep_gemm", "DeepGEMM (sgl-deep-gemm)")
from shims.deep_gemm.gemm import fp8_einsum, fp8_gemm_nt, transform_sf_into_required_layout  # noqa: E402,F401
