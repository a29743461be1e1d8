"""Shim for `deep_gemm` (DeepGEMM (sgl-deep-gemm)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
"""

from shims._missing import missing_getattr

__getattr__ = missing_getattr("deep_gemm", "DeepGEMM (sgl-deep-gemm)")
from shims.deep_gemm.attention import (  # noqa: E402,F401
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    get_num_sms,
    get_paged_mqa_logits_metadata,
)
from shims.deep_gemm.gemm import fp8_einsum, fp8_gemm_nt, transform_sf_into_required_layout  # noqa: E402,F401
