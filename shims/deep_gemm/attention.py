"""DeepGEMM's attention-indexer functions on winport's kernels (kernels_triton.indexer).

Replaces DeepGEMM (`sgl-deep-gemm`) `fp8_mqa_logits`, `fp8_paged_mqa_logits`,
`fp8_fp4_mqa_logits`, `fp8_fp4_paged_mqa_logits`, `get_paged_mqa_logits_metadata` and
`get_num_sms`, with DeepGEMM's call signatures. CUDA runs the Triton kernel, CPU the torch
reference. Columns a row may not see are -inf whether or not `clean_logits` is set (DeepGEMM
leaves them unspecified without it).
"""

from __future__ import annotations

import torch

from kernels_triton import indexer as _ix

QuantQ = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if dtype == torch.float32 else x.to(dtype)


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                   clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """DeepGEMM `fp8_mqa_logits`: q `[M, H, D]` e4m3, kv = (k `[N, D]` e4m3, scale `[N]` fp32),
    weights `[M, H]` fp32, key range `[ks, ke)` per row. Returns fp32 `[M, N]`, or `[M, max_seqlen_k]`
    with column j = key ks + j when max_seqlen_k > 0."""
    return _ix.mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor,
                         max_context_len: int, clean_logits: bool = False) -> torch.Tensor:
    """DeepGEMM `fp8_paged_mqa_logits`: q `[B, next_n, H, D]` e4m3, kv_cache `[pages, block, 1, D+4]`
    uint8, weights `[B*next_n, H]`, context_lens `[B]` or `[B, next_n]`, block_table `[B, blocks]`.
    Returns fp32 `[B*next_n, max_context_len]`. `schedule_meta` is not needed by this kernel."""
    return _ix.paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len)


def fp8_fp4_mqa_logits(q: QuantQ, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                       clean_logits: bool = True, max_seqlen_k: int = 0,
                       logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_mqa_logits`: like fp8_mqa_logits with q = e4m3 tensor or (packed e2m1
    `[M, H, D/2]`, packed UE8M0 int32 `[M, H]`) and kv = (packed e2m1 `[N, D/2]`, UE8M0 int32 `[N]`)
    (an e4m3 kv with fp32 scales is accepted too)."""
    out = _ix.mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k)
    return _as_dtype(out, logits_dtype)


def fp8_fp4_paged_mqa_logits(q: QuantQ, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_table: torch.Tensor,
                             schedule_meta: torch.Tensor, max_context_len: int, clean_logits: bool = False,
                             logits_dtype: torch.dtype = torch.float32,
                             indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_paged_mqa_logits`: q = e4m3 `[B, next_n, H, D]` (or `(q, None)`) or (packed
    e2m1 `[B, next_n, H, D/2]`, UE8M0 int32 `[B, next_n, H]`); kv_cache `[pages, block, 1, D/2+4]` FP4
    (or `[.., D+4]` FP8). Returns `[B*next_n, max_context_len]` in `logits_dtype`."""
    if indices is not None:
        raise NotImplementedError("fp8_fp4_paged_mqa_logits: varlen `indices` rows are not supported")
    out = _ix.paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len)
    return _as_dtype(out, logits_dtype)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM `get_paged_mqa_logits_metadata`: an int32 `[num_sms + 1, 2]` schedule tensor."""
    if indices is not None:
        raise NotImplementedError("get_paged_mqa_logits_metadata: varlen `indices` are not supported")
    return _ix.paged_mqa_logits_metadata_reference(context_lens, block_kv, num_sms)


def get_num_sms() -> int:
    """DeepGEMM `get_num_sms`: SMs of the current CUDA device (CPU count without CUDA)."""
    return _ix.num_sms()
