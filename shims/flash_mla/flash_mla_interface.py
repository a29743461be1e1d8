"""`flash_mla.flash_mla_interface`: FlashMLA's Python API (sparse paths) on winport's kernels.

Replaces FlashMLA (`sgl-flash-mla`) `flash_mla_interface`: `FlashMLASchedMeta`, `get_mla_metadata`,
`flash_mla_with_kvcache` (sparse decode on the DeepSeek-V4 FP8 cache) and `flash_mla_sparse_fwd`
(sparse prefill). CUDA runs the Triton kernels of kernels_triton.sparse_mla, CPU the torch
reference. Dense decode (no `indices`) and the V3.2 / V4.1 cache formats are not implemented and
raise NotImplementedError: SGLang's DeepSeek-V4 backend uses neither off SM100.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels_triton import sparse_mla


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's tile-scheduler metadata holder (same fields as upstream).

    Our kernels schedule themselves, so `tile_scheduler_metadata` / `num_splits` stay None; the
    config recorded on first use keeps upstream's check that a reused object sees the same shapes.
    """

    @dataclasses.dataclass
    class Config:
        """Shapes a FlashMLASchedMeta was first used with."""

        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args: object, **kwargs: object) -> tuple[FlashMLASchedMeta, None]:
    """FlashMLA `get_mla_metadata`: an empty FlashMLASchedMeta (filled on first use) and None."""
    return FlashMLASchedMeta(), None


def _check_sched_meta(meta: FlashMLASchedMeta, cfg: FlashMLASchedMeta.Config) -> None:
    if not meta.have_initialized:
        meta.have_initialized = True
        meta.config = cfg
    elif meta.config != cfg:
        raise AssertionError(
            f"FlashMLASchedMeta reused with different arguments: first {meta.config}, now {cfg}; "
            "use one get_mla_metadata() object per shape, as FlashMLA requires")


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta | torch.Tensor | None,
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
    kv_format: str | None = None,
    *,
    use_legacy: bool = True,
    descale_q: torch.Tensor | None = None,
    descale_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA `flash_mla_with_kvcache`, sparse mode on the V4 FP8 cache.

    q `[b, s_q, h_q, 512]` bf16; k_cache / extra_k_cache `[pages, P, 1, 584]` byte views of the V4
    cache; indices / extra_indices_in_kvcache `[b, s_q, topk]` int32 (`page * P + slot`, -1 none);
    topk_length / extra_topk_length `[b]` int32; attn_sink `[h_q]` fp32.
    Returns (out `[b, s_q, h_q, head_dim_v]` bf16, softmax_lse `[b, h_q, s_q]` fp32, natural log).
    `use_legacy`, `kv_format` are accepted for the sgl-flash-mla call signature; both kernel sets
    compute the same function on this format.
    """
    if indices is None:
        raise NotImplementedError("flash_mla_with_kvcache: dense (non-sparse) decode has no winport kernel; "
                                  "DeepSeek-V4 always passes `indices`")
    if causal:
        raise ValueError("causal must be False when sparse attention is enabled")
    if descale_q is not None or descale_k is not None:
        raise NotImplementedError("flash_mla_with_kvcache: descale_q/descale_k (FP8 q) are not supported")
    if kv_format not in (None, "V4"):
        raise NotImplementedError(f"flash_mla_with_kvcache: kv_format {kv_format!r} (only the V4 layout)")
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        _check_sched_meta(tile_scheduler_metadata, FlashMLASchedMeta.Config(
            q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache,
            indices.shape[-1], None if extra_k_cache is None else extra_k_cache.shape[1],
            None if extra_indices_in_kvcache is None else extra_indices_in_kvcache.shape[-1]))
    return sparse_mla.sparse_mla_decode(
        q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache,
        extra_topk_length, softmax_scale, head_dim_v)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    indexer_topk: int = 0,
    *,
    use_legacy: bool = True,
    return_log2_lse: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA `flash_mla_sparse_fwd`: sparse prefill over bf16 `kv`.

    q `[s_q, h_q, d_qk]` bf16, kv `[s_kv, 1, d_qk]` bf16, indices `[s_q, 1, topk]` int32 (negative
    or >= s_kv: none), topk_length `[s_q]` int32, attn_sink `[h_q]` fp32. Returns (out
    `[s_q, h_q, d_v]` bf16, max_logits `[s_q, h_q]`, lse `[s_q, h_q]`); the statistics are in
    natural-log units, or base 2 when `return_log2_lse` is true (what SGLang asks of the legacy
    kernel). Neither is used by SGLang's DeepSeek-V4 path, which keeps only `out`.
    """
    if indexer_topk:
        raise NotImplementedError("flash_mla_sparse_fwd: indexer_topk > 0 (lse_indexer) is not supported")
    return sparse_mla.sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                                         lse_log2=bool(return_log2_lse))
