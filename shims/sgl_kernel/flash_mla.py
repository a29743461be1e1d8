"""`sgl_kernel.flash_mla_with_kvcache` / `sgl_kernel.flash_mla_sparse_fwd` (the FlashMLA ops sgl-kernel shipped).

Same kernels as shims.flash_mla (kernels_triton.sparse_mla); these keep sgl-kernel's call
signatures, which SGLang's DeepSeek-V4 backend imports on XPU and older code paths. sgl-kernel's
sparse prefill returned base-2 statistics, so this one does too.
"""

from __future__ import annotations

import torch

from shims.flash_mla import flash_mla_interface as _fmi


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: object = None,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sgl-kernel `flash_mla_with_kvcache` (sparse mode): (out `[b, s_q, h_q, dv]` bf16, lse `[b, h_q, s_q]`)."""
    meta = tile_scheduler_metadata if isinstance(tile_scheduler_metadata, _fmi.FlashMLASchedMeta) else None
    return _fmi.flash_mla_with_kvcache(
        q, k_cache, block_table, cache_seqlens, head_dim_v, meta, None, softmax_scale, causal,
        is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
        extra_topk_length)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sgl-kernel `flash_mla_sparse_fwd`: (out, max_logits, lse), statistics in base 2."""
    return _fmi.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                                     return_log2_lse=True)
