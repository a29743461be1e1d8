"""sgl_kernel's DeepSeek-V4 functions of SGLang's device-generic ("XPU") route: signature adapters.

SGLang 0.5.23 sends DeepSeek-V4 through plain `sgl_kernel` functions (and `torch.ops.sgl_kernel`
top-k ops) wherever a module's `_is_xpu` / `is_xpu()` is true; winport sets that flag for the V4
modules and serves the names from here. The computation lives in kernels_triton:
- compress plans, C4/C128 compression, norm + RoPE + cache stores, V4.1's stores:
  kernels_triton.dsv4_xpu_ops (re-exported here under the upstream names and signatures);
- top-k transforms (`torch.ops.sgl_kernel.topk_transform`, `topk_transform_ragged`, `_paged`):
  kernels_triton.indexer.topk_transform_rows (a Triton kernel on CUDA, its torch reference elsewhere);
- mHC: hc_split_sinkhorn, mhc_pre, hc_post (= mhc_post), their fusion and the LM-head mixer:
  kernels_triton.mhc (torch reference + Triton).
This module only adapts the XPU-route signatures (argument order, in-place outputs, op schemas).
"""

from __future__ import annotations

import torch

from kernels_triton.dsv4_xpu_ops import (
    compress_norm_rope_store,
    flash_compress4_decode,
    flash_compress4_prefill,
    flash_compress128_decode,
    flash_compress128_prefill,
    fused_k_norm_rope_flashmla,
    fused_q_indexer_rope_hadamard_quant,
    fused_q_norm_rope,
    fused_store_cache_indexer,
    fused_store_cache_v4,
    plan_compress_decode,
    plan_compress_decode_legacy,
    plan_compress_prefill,
    plan_compress_prefill_legacy,
    store_fp4_index_k_cache,
)

__all__ = [
    "compress_norm_rope_store",
    "flash_compress4_decode",
    "flash_compress4_prefill",
    "flash_compress128_decode",
    "flash_compress128_prefill",
    "fused_hc_head",
    "fused_k_norm_rope_flashmla",
    "fused_store_cache_indexer",
    "fused_store_cache_v4",
    "fused_q_indexer_rope_hadamard_quant",
    "fused_q_norm_rope",
    "hc_post",
    "hc_split_sinkhorn",
    "mhc_fused_post_pre",
    "mhc_pre",
    "plan_compress_decode",
    "plan_compress_decode_legacy",
    "plan_compress_prefill",
    "plan_compress_prefill_legacy",
    "store_fp4_index_k_cache",
    "topk_transform",
    "topk_transform_ragged",
]


# ------------------------------------------------------------------------------------------------
# Top-k transforms (torch.ops.sgl_kernel)
# ------------------------------------------------------------------------------------------------
def _indexer():
    from kernels_triton import indexer

    return indexer


def topk_transform(scores: torch.Tensor, seq_lens: torch.Tensor, page_table: torch.Tensor,
                   out_page_indices: torch.Tensor, page_size: int,
                   out_raw_indices: torch.Tensor | None = None) -> None:
    """Replaces torch.ops.sgl_kernel.topk_transform (XPU) = JIT `topk_v1.cuh::TopKKernel::transform`.

    Row b picks k = out_page_indices.shape[1] columns of scores[b, :seq_lens[b]]: all of them in
    order when seq_len <= k (then -1), else the k largest (order unspecified). Each pick i is written
    as page_table[b, i >> log2(P)] << log2(P) | (i & (P - 1)); out_raw_indices (optional) receives i.
    Picks of -inf scores are kept. The Triton kernel on CUDA, the torch reference elsewhere
    (kernels_triton.indexer.topk_transform_rows).
    """
    if page_size <= 0 or page_size & (page_size - 1):
        raise ValueError("page_size must be a power of 2")
    _indexer().topk_transform_rows(scores, seq_lens, out_page_indices, page_table=page_table,
                                   page_size=page_size, out_raw=out_raw_indices)


def topk_transform_ragged(scores: torch.Tensor, seq_lens: torch.Tensor, out_indices: torch.Tensor,
                          out_offsets: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    """Replaces torch.ops.sgl_kernel.topk_transform_ragged (XPU) = JIT `topk_v2.cuh::transform_ragged`.

    Row i picks k = out_indices.shape[1] positions p of the window scores[i, s : s + seq_lens[i]]
    (s = row_starts[i], 0 if None): all in order when seq_len <= k, else the k largest; writes
    p + out_offsets[i], -1 padded. Unlike the CUDA kernel, `scores` is left unmodified. A window is
    assumed to lie inside its row (positions past the row end read its last score).
    """
    _indexer().topk_transform_rows(scores, seq_lens, out_indices, offsets=out_offsets, row_starts=row_starts)


def topk_transform_paged(scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor,
                         out_page_indices: torch.Tensor, page_size: int,
                         metadata: torch.Tensor | None = None) -> None:
    """Replaces torch.ops.sgl_kernel.topk_transform_paged (XPU) = JIT `topk_v2.cuh::transform_paged`.

    The same selection as topk_transform without raw indices; `metadata` is top-k v2's CUDA work
    plan (plan_topk_v2), which a whole-row selection does not need.
    """
    topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, None)


def _register_ops() -> None:
    """Define torch.ops.sgl_kernel.topk_transform, _ragged and _paged (only these three names).

    CompositeExplicitAutograd serves every backend (CPU and CUDA tensors alike); a real sgl_kernel
    that already defines a name keeps it.
    """
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")  # noqa: TOR901  (kept alive below)
    schemas = {
        "topk_transform": ("topk_transform(Tensor scores, Tensor seq_lens, Tensor page_table, "
                           "Tensor(a!) out_page_indices, int page_size, Tensor(b!)? out_raw_indices=None) -> ()",
                           topk_transform),
        "topk_transform_ragged": ("topk_transform_ragged(Tensor scores, Tensor seq_lens, Tensor(a!) out_indices, "
                                  "Tensor out_offsets, Tensor? row_starts=None) -> ()", topk_transform_ragged),
        "topk_transform_paged": ("topk_transform_paged(Tensor scores, Tensor seq_lens, Tensor page_tables, "
                                 "Tensor(a!) out_page_indices, int page_size, Tensor? metadata=None) -> ()",
                                 topk_transform_paged),
    }
    for name, (schema, fn) in schemas.items():
        if _op_exists(name):
            continue
        lib.define(schema)
        lib.impl(name, fn, "CompositeExplicitAutograd")
    _LIBS.append(lib)


def _op_exists(name: str) -> bool:
    try:
        torch._C._get_schema(f"sgl_kernel::{name}", "")
    except RuntimeError:
        return False
    return True


_LIBS: list[torch.library.Library] = []
_register_ops()


# ------------------------------------------------------------------------------------------------
# mHC (math in kernels_triton.mhc, which picks Triton or its torch reference by _dispatch.use_triton)
# ------------------------------------------------------------------------------------------------
def _mhc():
    from kernels_triton import mhc

    return mhc


def hc_split_sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int = 4,
                      sinkhorn_iters: int = 20, eps: float = 1e-6
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel `hc_split_sinkhorn` (XPU) = sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn.

    mixes [b, s, (2+hc)*hc] -> pre [b, s, hc], post [b, s, hc] (x2 sigmoid), comb [b, s, hc, hc]
    (Sinkhorn-normalized softmax), dtype of mixes.
    """
    m = _mhc()
    return m.hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, rms_eps: float,
            hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float, sinkhorn_repeat: int,
            n_splits: int = 1, n_splits_pre: int = 32, *, norm_weight: torch.Tensor | None = None,
            norm_eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel `mhc_pre` (XPU) = sglang.kernels.ops.layernorm.mhc.mhc_pre, except that `post`
    comes back as [..., hc] (the XPU branch of DeepseekV4 hc_pre returns it without the squeeze the
    TileLang branch applies).

    residual [..., hc, h] bf16 -> (post [..., hc] f32, comb [..., hc, hc] f32, layer_input [..., h] bf16),
    layer_input RMS-normalized with norm_weight when given.
    """
    m = _mhc()
    post, comb, y = m.mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                      sinkhorn_repeat, n_splits, n_splits_pre, norm_weight=norm_weight, norm_eps=norm_eps)
    return post.squeeze(-1), comb, y


def hc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
            comb_res_mix: torch.Tensor) -> torch.Tensor:
    """Replaces sgl_kernel `hc_post` (XPU) = sglang.kernels.ops.layernorm.mhc.mhc_post.

    out[t, j] = post[t, j] * x[t] + sum_i comb[t, i, j] * residual[t, i], dtype of residual.
    """
    m = _mhc()
    return m.mhc_post(x, residual, post_layer_mix, comb_res_mix)


def mhc_fused_post_pre(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                       comb_res_mix: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                       rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
                       sinkhorn_repeat: int, n_splits: int = 1, tile_n: int = 1, *,
                       norm_weight: torch.Tensor | None = None, norm_eps: float | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel `mhc_fused_post_pre` (XPU) = sglang.kernels.ops.layernorm.mhc.mhc_fused_post_pre.

    hc_post of the finished sublayer (rounded to bf16, as the fused kernel does) followed by mhc_pre of
    the next: returns (residual [..., hc, h], post [..., hc, 1], comb [..., hc, hc], layer_input [..., h]).
    """
    del tile_n
    hc, h = residual.shape[-2:]
    outer = residual.shape[:-2]
    res = hc_post(x.reshape(-1, h), residual.reshape(-1, hc, h), post_layer_mix.reshape(-1, hc),
                  comb_res_mix.reshape(-1, hc, hc))
    post, comb, y = mhc_pre(res, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                            sinkhorn_repeat, n_splits, norm_weight=norm_weight, norm_eps=norm_eps)
    return res.view(*outer, hc, h), post.reshape(*outer, hc, 1), comb.reshape(*outer, hc, hc), y.reshape(*outer, h)


def fused_hc_head(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                  norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Replaces sgl_kernel `fused_hc_head` (XPU) = sglang.kernels.ops.layernorm.mhc_head.fused_hc_head.

    x [T, hc, h] -> y [T, h] (dtype of x): mixes = (x_flat @ hc_fn^T) * rsqrt(mean(x_flat^2) + norm_eps),
    pre = sigmoid(mixes * scale + base) + hc_eps, y = sum_i pre[i] * x[i], all in fp32.
    """
    t, hc, h = x.shape
    xf = x.reshape(t, hc * h).float()
    rsqrt = torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    mixes = (xf @ hc_fn.float().t()) * rsqrt
    pre = torch.sigmoid(mixes * hc_scale.float().reshape(-1)[0] + hc_base.float()) + hc_eps
    return (pre.unsqueeze(-1) * xf.view(t, hc, h)).sum(1).to(x.dtype)
