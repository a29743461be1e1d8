"""Shim for `sgl_kernel` (sglang-kernel (sgl_kernel)): the functions SGLang calls, on PyTorch and Triton.

Only implemented, tested functions are exported; any other name raises an error naming it.
The table in tests/ops/README.md lists each name, its kernel and its test.
"""

from shims._missing import missing_getattr
from shims.sgl_kernel._ops import (  # noqa: F401  (re-exported upstream names)
    apply_rope_with_cos_sin_cache_inplace,
    apply_token_bitmask_inplace_cuda,
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    biased_topk,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    fp8_blockwise_scaled_mm,
    fp8_scaled_mm,
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    int8_scaled_mm,
    merge_state_v2,
    min_p_sampling_from_probs,
    moe_align_block_size,
    moe_fused_gate,
    moe_sum,
    moe_sum_reduce,
    rmsnorm,
    sgl_per_tensor_quant_fp8,
    sgl_per_token_group_quant_8bit,
    sgl_per_token_group_quant_fp8,
    sgl_per_token_group_quant_int8,
    sgl_per_token_quant_fp8,
    silu_and_mul,
    silu_and_mul_clamp,
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_prob,
    top_p_renorm_probs,
    topk_sigmoid,
    topk_softmax,
    verify_tree_greedy_cpu,
)
from shims.sgl_kernel.dsv4_xpu import *  # noqa: F401,F403  (the DeepSeek-V4 XPU-route functions)
from shims.sgl_kernel.flash_mla import flash_mla_sparse_fwd, flash_mla_with_kvcache  # noqa: F401
from shims.sgl_kernel.memory import weak_ref_tensor  # noqa: F401

__getattr__ = missing_getattr("sgl_kernel", "sglang-kernel (sgl_kernel)")
