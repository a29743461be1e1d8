"""The sgl_kernel functions winport implements: upstream names and signatures, CUDA -> Triton
kernels in kernels_triton, CPU -> their torch references. Re-exported by shims/sgl_kernel/__init__.py.
"""

from __future__ import annotations

import importlib.util

import torch

from kernels_triton import (
    activation,
    merge_state,
    moe_align,
    moe_routing,
    norm,
    quant,
    rotary,
    sampling,
    spec_cpu,
)
from kernels_triton import bitmask as bitmask_k
from kernels_triton import moe_sum as moe_sum_k
from kernels_triton._dispatch import use_triton

# ---------------------------------------------------------------- normalization


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.rmsnorm: out = input / RMS(input) * weight; returns out."""
    if out is None:
        out = torch.empty_like(input)
    if use_triton(input):
        norm.rmsnorm_triton(input, weight, eps, out)
    else:
        out.copy_(norm.rmsnorm_ref(input, weight, eps))
    return out


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """Replaces sgl_kernel.fused_add_rmsnorm: residual += input; input = rmsnorm(residual) (in place)."""
    if use_triton(input):
        norm.rmsnorm_triton(input, weight, eps, input, residual=residual)
    else:
        norm.fused_add_rmsnorm_ref(input, residual, weight, eps)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
                  enable_pdl: bool | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.gemma_rmsnorm: out = input / RMS(input) * (1 + weight)."""
    if out is None:
        out = torch.empty_like(input)
    if use_triton(input):
        norm.rmsnorm_triton(input, weight, eps, out, gemma=True)
    else:
        out.copy_(norm.rmsnorm_ref(input, weight, eps, gemma=True))
    return out


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                            enable_pdl: bool | None = None) -> None:
    """Replaces sgl_kernel.gemma_fused_add_rmsnorm (in place, weight applied as 1 + weight)."""
    if use_triton(input):
        norm.rmsnorm_triton(input, weight, eps, input, residual=residual, gemma=True)
    else:
        norm.fused_add_rmsnorm_ref(input, residual, weight, eps, gemma=True)


# ---------------------------------------------------------------- activations


def _act(input: torch.Tensor, out: torch.Tensor | None, act: str, limit: float | None = None) -> torch.Tensor:
    if input.shape[-1] * input.element_size() % 16 != 0:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    d = input.shape[-1] // 2
    if out is None:
        out = torch.empty(*input.shape[:-1], d, dtype=input.dtype, device=input.device)
    else:
        assert out.shape[:-1] == input.shape[:-1] and out.shape[-1] == d, f"{input.shape} vs {out.shape}"
    if use_triton(input):
        activation.act_and_mul_triton(input, out, act, limit)
    else:
        out.copy_(activation.act_and_mul_ref(input, act, limit))
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.silu_and_mul: silu(x[..., :d]) * x[..., d:]."""
    return _act(input, out, "silu")


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.gelu_and_mul (erf GELU)."""
    return _act(input, out, "gelu")


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.gelu_tanh_and_mul (tanh-approximate GELU)."""
    return _act(input, out, "gelu_tanh")


def silu_and_mul_clamp(input: torch.Tensor, output: torch.Tensor, swiglu_limit: float) -> None:
    """Replaces sgl_kernel.silu_and_mul_clamp (DeepSeek-V4 swiglu_limit): gate <= limit, |up| <= limit."""
    _act(input, output, "silu", float(swiglu_limit))


# ---------------------------------------------------------------- rotary embedding


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                          head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True,
                                          fused_set_kv_buffer_arg: object | None = None,
                                          enable_pdl: bool | None = None) -> None:
    """Replaces sgl_kernel/flashinfer apply_rope_with_cos_sin_cache_inplace (query/key rotated in place)."""
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    if use_triton(query):
        rotary.rope_triton(positions, query, key, head_size, cos_sin_cache, is_neox)
    else:
        query.copy_(rotary.rope_ref(positions, query, head_size, cos_sin_cache, is_neox))
        if key is not None:
            key.copy_(rotary.rope_ref(positions, key, head_size, cos_sin_cache, is_neox))
    a = fused_set_kv_buffer_arg
    if a is not None:
        # Fused KV store: the rotated key and the value go to the cache rows cache_loc.
        if getattr(a, "k_scale", None) is not None or getattr(a, "v_scale", None) is not None:
            raise NotImplementedError("k_scale/v_scale are not supported (as upstream)")
        loc = a.cache_loc.long()
        a.k_buffer.view(a.k_buffer.shape[0], -1)[loc] = key.reshape(key.shape[0], -1).to(a.k_buffer.dtype)
        a.v_buffer.view(a.v_buffer.shape[0], -1)[loc] = a.value.reshape(a.value.shape[0], -1).to(a.v_buffer.dtype)


# ---------------------------------------------------------------- MoE routing


def _route(gating: torch.Tensor, bias: torch.Tensor | None, w: torch.Tensor, ids: torch.Tensor, topk: int,
           score: str, renorm: bool, scale: float = 1.0, softcap: float = 0.0, n_groups: int = 0,
           topk_group: int = 0) -> None:
    if gating.shape[0] == 0:
        return
    if use_triton(gating) and w.is_contiguous() and ids.is_contiguous():
        moe_routing.routing_triton(gating, bias, w, ids, topk, score, renorm, scale, softcap, n_groups, topk_group)
    else:
        rw, ri = moe_routing.routing_ref(gating, bias, topk, score, renorm, scale, softcap, n_groups, topk_group)
        w[:, :topk] = rw.to(w.dtype)
        ids[:, :topk] = ri.to(ids.dtype)


def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, gating_output: torch.Tensor,
                 renormalize: bool = False, moe_softcapping: float = 0.0,
                 correction_bias: torch.Tensor | None = None) -> None:
    """Replaces sgl_kernel.topk_softmax: softmax routing (optional softcap, selection bias), in place."""
    _route(gating_output, correction_bias, topk_weights, topk_ids, topk_weights.shape[1], "softmax", renormalize,
           softcap=moe_softcapping)


def topk_sigmoid(topk_weights: torch.Tensor, topk_ids: torch.Tensor, gating_output: torch.Tensor,
                 renormalize: bool = False, correction_bias: torch.Tensor | None = None,
                 scale: float = 1.0) -> None:
    """Replaces sgl_kernel.topk_sigmoid: sigmoid routing with optional selection bias, in place."""
    _route(gating_output, correction_bias, topk_weights, topk_ids, topk_weights.shape[1], "sigmoid", renormalize,
           scale=scale)


def _shared_slot(w: torch.Tensor, ids: torch.Tensor, n_experts: int, n_shared: int, renorm: bool,
                 routed_scaling_factor: float) -> None:
    # Fused shared expert in the last slot: id = a shared expert (round robin over tokens), weight =
    # (sum of routed weights when renormalizing, else 1) / routed_scaling_factor.
    t = ids.shape[0]
    ids[:, -1] = n_experts + torch.arange(t, device=ids.device, dtype=ids.dtype) % n_shared
    base = w[:, :-1].sum(-1) if renorm else torch.ones(t, device=w.device)
    w[:, -1] = base / (routed_scaling_factor or 1.0)


def moe_fused_gate(input_tensor: torch.Tensor, bias: torch.Tensor | None, num_expert_group: int, topk_group: int,
                   topk: int, renormalize: bool = True, scoring_func: str = "sigmoid",
                   num_fused_shared_experts: int = 0, routed_scaling_factor: float = 1.0,
                   apply_routed_scaling_factor_on_output: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel.moe_fused_gate: grouped (top-2-sum group score) biased top-k routing.

    Returns (weights fp32 [T, topk], ids int32 [T, topk]); the last slot holds the fused shared
    expert when num_fused_shared_experts > 0."""
    t, n = input_tensor.shape
    w = torch.empty(t, topk, dtype=torch.float32, device=input_tensor.device)
    ids = torch.empty(t, topk, dtype=torch.int32, device=input_tensor.device)
    k_routed = topk - (1 if num_fused_shared_experts else 0)
    scale = routed_scaling_factor if apply_routed_scaling_factor_on_output else 1.0
    _route(input_tensor, bias, w, ids, k_routed, scoring_func, renormalize and not num_fused_shared_experts,
           1.0 if num_fused_shared_experts else scale, n_groups=num_expert_group, topk_group=topk_group)
    if num_fused_shared_experts and t:
        _shared_slot(w, ids, n, num_fused_shared_experts, renormalize, routed_scaling_factor)
        if renormalize:
            w /= w[:, :-1].sum(-1, keepdim=True) + moe_routing.RENORM_EPS
        if apply_routed_scaling_factor_on_output:
            w *= routed_scaling_factor
    return w, ids


def biased_topk(gating_output: torch.Tensor, correction_bias: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, topk: int, scoring_func: str = "sigmoid", num_fused_shared_experts: int = 0,
                renormalize: bool = True, routed_scaling_factor: float = 1.0,
                apply_routed_scaling_factor_on_output: bool = False) -> None:
    """Replaces sgl_kernel.biased_topk: ungrouped biased top-k (sigmoid / sqrtsoftplus), in place."""
    if not num_fused_shared_experts:
        # Straight into the caller's buffers: no temporaries and copies (this runs once per MoE layer).
        scale = routed_scaling_factor if apply_routed_scaling_factor_on_output else 1.0
        _route(gating_output, correction_bias, topk_weights, topk_ids, topk, scoring_func, renormalize, scale)
        return
    w, ids = moe_fused_gate(gating_output, correction_bias, 1, 1, topk, renormalize, scoring_func,
                            num_fused_shared_experts, routed_scaling_factor, apply_routed_scaling_factor_on_output)
    topk_weights.copy_(w)
    topk_ids.copy_(ids)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                         sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                         num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor | None = None,
                         pad_sorted_token_ids: bool = False, ignore_invalid_expert: bool = False) -> None:
    """Replaces sgl_kernel.moe_align_block_size (torch on every device; see kernels_triton/moe_align.py)."""
    moe_align.moe_align_block_size_ref(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                                       num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids,
                                       ignore_invalid_expert)


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    """Replaces sgl_kernel.moe_sum_reduce: output = input.sum(1) * routed_scaling_factor."""
    if use_triton(input):
        moe_sum_k.moe_sum_triton(input, output, routed_scaling_factor)
    else:
        output.copy_(moe_sum_k.moe_sum_ref(input, routed_scaling_factor))


def moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    """Replaces sgl_kernel.moe_sum: output = input.sum(1)."""
    moe_sum_reduce(input, output, 1.0)


# ---------------------------------------------------------------- 8-bit quantization


def sgl_per_token_group_quant_8bit(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                                   group_size: int, eps: float, fp8_min: float, fp8_max: float,
                                   scale_ue8m0: bool = False) -> None:
    """Replaces sgl_kernel.sgl_per_token_group_quant_8bit (fp8 or int8 by output_q's dtype; fp32 scales)."""
    if output_s.dtype != torch.float32:
        raise NotImplementedError("winport: packed (int32) UE8M0 scales are not implemented; use fp32 scales")
    if use_triton(input):
        quant.group_quant_triton(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)
    else:
        q, s = quant.group_quant_ref(input, group_size, eps, fp8_min, fp8_max, output_q.dtype, scale_ue8m0)
        output_q.copy_(q)
        output_s.copy_(s.reshape(output_s.shape))


def sgl_per_token_group_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                                  group_size: int, eps: float, fp8_min: float, fp8_max: float,
                                  scale_ue8m0: bool = False) -> None:
    """Replaces sgl_kernel.sgl_per_token_group_quant_fp8."""
    sgl_per_token_group_quant_8bit(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)


def sgl_per_token_group_quant_int8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                                   group_size: int, eps: float, int8_min: float, int8_max: float) -> None:
    """Replaces sgl_kernel.sgl_per_token_group_quant_int8."""
    sgl_per_token_group_quant_8bit(input, output_q, output_s, group_size, eps, int8_min, int8_max)


def sgl_per_token_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor) -> None:
    """Replaces sgl_kernel.sgl_per_token_quant_fp8: one scale per row (absmax / fp8 max)."""
    fmax = float(torch.finfo(output_q.dtype).max)
    h = input.shape[-1]
    sgl_per_token_group_quant_8bit(input, output_q, output_s.view(-1, 1), h, 1e-10, -fmax, fmax)


def sgl_per_tensor_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                             is_static: bool) -> None:
    """Replaces sgl_kernel.sgl_per_tensor_quant_fp8: one scale (given when is_static, else absmax / fp8 max).

    Plain torch on every device: two reductions and one fused elementwise pass."""
    fmax = float(torch.finfo(output_q.dtype).max)
    if not is_static:
        output_s.fill_(float(input.abs().amax().float().clamp_min(1e-10)) / fmax)
    output_q.copy_((input.float() / output_s.float().reshape(())).clamp(-fmax, fmax).to(output_q.dtype))


# ---------------------------------------------------------------- FP8 / INT8 scaled matmuls


def _fp8_gemm_module() -> object | None:
    # Issue 4's block-scaled FP8 GEMM kernel, used on CUDA when it exists.
    if importlib.util.find_spec("kernels_triton.fp8_gemm") is None:
        return None
    return importlib.import_module("kernels_triton.fp8_gemm")


def _scaled_mm_ref(mat_a: torch.Tensor, mat_b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
                   out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    # a [M, K] * scales_a ([M, 1] or scalar), b [K, N] * scales_b ([1, N] or scalar), fp32 accumulate.
    a = mat_a.float() * scales_a.float().reshape(-1, 1) if scales_a.numel() > 1 else mat_a.float() * scales_a.float()
    b = mat_b.float() * scales_b.float().reshape(1, -1) if scales_b.numel() > 1 else mat_b.float() * scales_b.float()
    y = a @ b
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def fp8_scaled_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.fp8_scaled_mm: per-token x per-channel (or per-tensor) scaled FP8 GEMM.

    Dequantize-and-matmul in torch (fp32 on CPU, out_dtype on CUDA via cuBLAS)."""
    if mat_a.is_cuda:
        a = mat_a.to(out_dtype) * scales_a.to(out_dtype).reshape(-1, 1)
        y = a @ (mat_b.to(out_dtype) * scales_b.to(out_dtype).reshape(1, -1))
        return y + bias.to(out_dtype) if bias is not None else y
    return _scaled_mm_ref(mat_a, mat_b, scales_a, scales_b, out_dtype, bias)


def int8_scaled_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
                   out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.int8_scaled_mm: the integer product is exact, then scaled (as the int32
    accumulator of the CUDA kernel). fp32 holds every sum of K int8*int8 products exactly while
    K * 127^2 < 2^24; longer K accumulates in fp64."""
    k = mat_a.shape[-1]
    acc_dtype = torch.float32 if k * 127 * 127 < (1 << 24) else torch.float64
    acc = mat_a.to(acc_dtype) @ mat_b.to(acc_dtype)
    sa = scales_a.to(acc_dtype).reshape(-1, 1) if scales_a.numel() > 1 else scales_a.to(acc_dtype)
    sb = scales_b.to(acc_dtype).reshape(1, -1) if scales_b.numel() > 1 else scales_b.to(acc_dtype)
    y = acc * sa * sb
    if bias is not None:
        y = y + bias.to(acc_dtype)
    return y.to(out_dtype)


def fp8_blockwise_scaled_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, scales_a: torch.Tensor,
                            scales_b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Replaces sgl_kernel.fp8_blockwise_scaled_mm: a [M, K] with scales [M, K/128] (1x128 groups),
    b [K, N] with scales [K/128, N/128] (128x128 blocks).

    kernels_triton.fp8_gemm.fp8_block_gemm (Triton on CUDA, the torch reference elsewhere) takes B as
    [N, K] with scales [N/128, K/128]: the same data transposed, so only views change hands.
    """
    from kernels_triton.fp8_gemm import fp8_block_gemm

    m, k = mat_a.shape
    n = mat_b.shape[1]
    bk, bn = k // scales_b.shape[0], n // scales_b.shape[1]
    return fp8_block_gemm(mat_a, scales_a, mat_b.t().contiguous(), scales_b.t().contiguous(), (bn, bk), out_dtype)


# ---------------------------------------------------------------- sampling


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Replaces sgl_kernel.top_k_renorm_prob (flashinfer top_k_renorm_probs): fp32 renormalized probs."""
    p = probs.float()
    return sampling.renorm(p, sampling.top_k_mask(p, top_k))


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Replaces sgl_kernel.top_p_renorm_prob (flashinfer top_p_renorm_probs)."""
    p = probs.float()
    return sampling.renorm(p, sampling.top_p_mask(p, top_p))


top_k_renorm_probs = top_k_renorm_prob
top_p_renorm_probs = top_p_renorm_prob


def _check_nan(probs: torch.Tensor, check_nan: bool) -> None:
    if check_nan and torch.isnan(probs).any():
        raise ValueError("Input probs contains NaN.")


def min_p_sampling_from_probs(probs: torch.Tensor, min_p: torch.Tensor | float, indices: torch.Tensor | None = None,
                              deterministic: bool = True, generator: torch.Generator | None = None,
                              check_nan: bool = False) -> torch.Tensor:
    """Replaces sgl_kernel/flashinfer min_p_sampling_from_probs -> int32 token ids."""
    if indices is not None:
        probs = probs[indices.long()]
    _check_nan(probs, check_nan)
    p = probs.float()
    return sampling.sample_from(torch.where(sampling.min_p_mask(p, min_p), p, 0.0), generator)


def top_k_top_p_sampling_from_probs(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
                                    indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
                                    deterministic: bool = True, generator: torch.Generator | None = None,
                                    check_nan: bool = False) -> torch.Tensor:
    """Replaces sgl_kernel/flashinfer top_k_top_p_sampling_from_probs -> int32 token ids."""
    if indices is not None:
        probs = probs[indices.long()]
    _check_nan(probs, check_nan)
    return sampling.top_k_top_p_sample(probs, top_k, top_p, filter_apply_order, generator)


def apply_token_bitmask_inplace_cuda(logits: torch.Tensor, bitmask: torch.Tensor,
                                     indices: torch.Tensor | list[int] | None = None) -> None:
    """Replaces sgl_kernel.apply_token_bitmask_inplace_cuda: logits[~allowed] = -inf, in place."""
    if isinstance(indices, list):
        indices = torch.tensor(indices, dtype=torch.int32, device=logits.device)
    if use_triton(logits):
        bitmask_k.bitmask_triton(logits, bitmask, indices)
    else:
        bitmask_k.bitmask_ref(logits, bitmask, indices)


# ---------------------------------------------------------------- attention state merge


def merge_state_v2(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                   v_merged: torch.Tensor | None = None,
                   s_merged: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel.merge_state_v2 (natural-log LSE; +inf LSE counts as empty)."""
    if v_merged is None:
        v_merged = torch.empty_like(v_a)
    if s_merged is None:
        s_merged = torch.empty_like(s_a, dtype=torch.float32)
    if use_triton(v_a):
        merge_state.merge_state_triton(v_a, s_a, v_b, s_b, v_merged, s_merged)
    else:
        v, s = merge_state.merge_state_ref(v_a, s_a, v_b, s_b)
        v_merged.copy_(v)
        s_merged.copy_(s)
    return v_merged, s_merged


# ---------------------------------------------------------------- CPU-engine helpers (CPU only)


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """Replaces sgl_kernel.copy_all_layer_kv_cache_cpu (SGLang's copy_all_layer_kv_cache_tiled on CPU)."""
    spec_cpu.copy_all_layer_kv_cache(data_ptrs, strides, tgt_loc, src_loc)


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Replaces sgl_kernel.assign_req_to_token_pool_cpu."""
    spec_cpu.assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                      pool_len)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Replaces sgl_kernel.assign_extend_cache_locs_cpu."""
    spec_cpu.assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                      pool_len)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                                           topk: int, speculative_num_steps: int) -> None:
    """Replaces sgl_kernel.assign_draft_cache_locs_contiguous_cpu."""
    spec_cpu.assign_draft_cache_locs_contiguous(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                                topk, speculative_num_steps)


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                          accept_stride: int) -> None:
    """Replaces sgl_kernel.fill_bonus_tokens_cpu."""
    spec_cpu.fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride)


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """Replaces sgl_kernel.fill_accept_out_cache_loc_cpu."""
    spec_cpu.fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc)


def build_tree_kernel_efficient_cpu(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                    verified_seq_len: torch.Tensor, tree_mask: torch.Tensor,
                                    positions: torch.Tensor, retrive_index: torch.Tensor,
                                    retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                                    topk: int, depth: int, draft_token_num: int, tree_mask_mode: int) -> None:
    """Replaces sgl_kernel.build_tree_kernel_efficient_cpu."""
    spec_cpu.build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                         retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                         draft_token_num, int(tree_mask_mode))


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                           candidates: torch.Tensor, retrive_index: torch.Tensor,
                           retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                           target_predict: torch.Tensor) -> None:
    """Replaces sgl_kernel.verify_tree_greedy_cpu."""
    spec_cpu.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, target_predict)
