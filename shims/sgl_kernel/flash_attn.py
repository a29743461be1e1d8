"""Shim for `sgl_kernel.flash_attn` (FlashAttention-3 entry points as sgl-kernel ships them).

CUDA -> kernels_triton.flash_attn (Triton), CPU -> its fp32 torch reference. Arguments that select
features winport does not implement (FP8 descales, appending new k/v, in-kernel rotary, qv, sinks,
score_mod, attention_chunk, cache_batch_idx/leftpad) raise NotImplementedError instead of being
silently ignored.
"""

from __future__ import annotations

import torch

from kernels_triton import flash_attn as fa
from kernels_triton._dispatch import use_triton
from shims._missing import missing_getattr


def _unsupported(**kw: object) -> None:
    bad = [k for k, v in kw.items() if v is not None and not (isinstance(v, (bool, int, float)) and not v)]
    if bad:
        raise NotImplementedError(f"winport flash-attention shim: unsupported arguments {bad}")


def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, max_q: int, **kw: object):
    if use_triton(q):
        return fa.attention_triton(q, k, v, cu_q, max_q, **kw)
    return fa.attention_ref(q, k, v, cu_q, **kw)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor | None, max_seqlen_q: int | None = None,
                           max_seqlen_k: int | None = None, seqused_q: torch.Tensor | None = None,
                           seqused_k: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                           softmax_scale: float | None = None, causal: bool = False, qv: torch.Tensor | None = None,
                           q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                           v_descale: torch.Tensor | None = None, window_size: tuple[int, int] = (-1, -1),
                           attention_chunk: int = 0, softcap: float = 0.0, num_splits: int = 1,
                           pack_gqa: bool | None = None, deterministic: bool = False, sm_margin: int = 0,
                           return_softmax_lse: bool = False, sinks: torch.Tensor | None = None,
                           score_mod: object | None = None, aux_tensors: object | None = None,
                           ver: int = 3, **kwargs: object):
    """Replaces sgl_kernel.flash_attn.flash_attn_varlen_func (FA3): q [total_q, Hq, D], k/v [total_k, Hk, D]
    (or paged with page_table + seqused_k). Returns out, or (out, softmax_lse [Hq, total_q]) when
    return_softmax_lse."""
    _unsupported(qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, seqused_q=seqused_q,
                 attention_chunk=attention_chunk, sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors)
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if cu_seqlens_q.numel() > 1 else 0
    out, lse = _run(q, k, v, cu_seqlens_q, int(max_seqlen_q), cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                    page_table=page_table, softmax_scale=softmax_scale, causal=causal,
                    window_size=tuple(window_size), softcap=softcap)
    return (out, lse.transpose(0, 1).contiguous()) if return_softmax_lse else out


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                            qv: torch.Tensor | None = None, rotary_cos: torch.Tensor | None = None,
                            rotary_sin: torch.Tensor | None = None, cache_seqlens: torch.Tensor | int | None = None,
                            cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                            page_table: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
                            cu_seqlens_k_new: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                            rotary_seqlens: torch.Tensor | None = None, q_descale: torch.Tensor | None = None,
                            k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                            softmax_scale: float | None = None, causal: bool = False,
                            window_size: tuple[int, int] = (-1, -1), attention_chunk: int = 0,
                            softcap: float = 0.0, rotary_interleaved: bool = True,
                            scheduler_metadata: torch.Tensor | None = None, num_splits: int = 0,
                            pack_gqa: bool | None = None, sm_margin: int = 0, return_softmax_lse: bool = False,
                            sinks: torch.Tensor | None = None, score_mod: object | None = None,
                            aux_tensors: object | None = None, ver: int = 3, **kwargs: object):
    """Replaces sgl_kernel.flash_attn.flash_attn_with_kvcache (FA3): q [B, Sq, Hq, D] (or varlen
    [total_q, Hq, D] with cu_seqlens_q), cache [B, S, Hk, D] or paged [pages, P, Hk, D] with page_table,
    cache_seqlens [B] keys per sequence. Returns out (q's layout) or (out, softmax_lse)."""
    _unsupported(k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx,
                 cache_leftpad=cache_leftpad, cu_seqlens_k_new=cu_seqlens_k_new, q_descale=q_descale,
                 k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk, sinks=sinks,
                 score_mod=score_mod, aux_tensors=aux_tensors)
    batched = cu_seqlens_q is None
    if batched:
        bsz, sq = q.shape[0], q.shape[1]
        q3 = q.reshape(bsz * sq, q.shape[2], q.shape[3])
        cu_q = torch.arange(0, (bsz + 1) * sq, sq, dtype=torch.int32, device=q.device)
        max_q = sq
    else:
        q3, cu_q = q, cu_seqlens_q
        bsz = cu_q.numel() - 1
        max_q = int(max_seqlen_q) if max_seqlen_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
    if page_table is None:
        # A dense [B, S, H, D] cache is a paged cache with one page of S rows per sequence.
        page_table = torch.arange(k_cache.shape[0], dtype=torch.int32, device=q.device).view(-1, 1)
    if cache_seqlens is None:
        cache_seqlens = torch.full((bsz,), page_table.shape[1] * k_cache.shape[1], dtype=torch.int32,
                                   device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((bsz,), cache_seqlens, dtype=torch.int32, device=q.device)
    out, lse = _run(q3, k_cache, v_cache, cu_q, max_q, seqused_k=cache_seqlens.to(torch.int32),
                    page_table=page_table.to(torch.int32), softmax_scale=softmax_scale, causal=causal,
                    window_size=tuple(window_size), softcap=softcap)
    if batched:
        out = out.view(q.shape)
        lse = lse.view(bsz, max_q, -1).permute(0, 2, 1).contiguous()  # [B, Hq, Sq]
    else:
        lse = lse.transpose(0, 1).contiguous()  # [Hq, total_q]
    return (out, lse) if return_softmax_lse else out


__getattr__ = missing_getattr("sgl_kernel.flash_attn", "sglang-kernel (sgl_kernel)")
