"""Store DeepSeek-V4.1's ratio-1/2 latents into the V4 KV cache without SGLang's CUDA JIT kernel.

Targets sglang 0.5.23 `kernels/ops/attention/dsv4/attn.py:fused_store_cache`, bound by name in
`srt/mem_cache/deepseek_v4_memory_pool.py` (`set_key_buffer_fused` of the compressed-KV pools).
V4.1's torch path (`DeepseekV4AttnBackend._low_ratio_write_group`) writes every ratio-1/2 latent
through it; upstream it compiles a CUDA JIT kernel (`deepseek_v4/store.cuh`, nvcc through tvm_ffi,
which Windows does not have), or on ROCm a Triton one. On every device the V4-layout FlashMLA store
and the FP8 indexer store go to winport's torch versions (`sgl_kernel.fused_store_cache_v4` /
`fused_store_cache_indexer`: fixed-shape scatters, so CUDA graphs capture them; tested against
float64 in tests/ops/test_dsv4_xpu_v41.py). The V4 layout is the one SGLang picks off SM100
(`select_dsv4_kv_layout`), so on the users' SM120 and on SM90; anything else (the SM100-only
V4.1 fp8/fp4 layouts, in-kernel RoPE) fails with a message naming what is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

from winport.patches._base import UpstreamChangedError, require_source

ATTN = "sglang.kernels.ops.attention.dsv4.attn"
POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"


def _make_store(original: Any) -> Any:
    def fused_store_cache(input: Any, cache: Any, indices: Any, *, page_size: int, type: str,  # noqa: A002
                          layout: Any = None, freqs_cis: Any = None) -> None:
        import sgl_kernel
        from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

        kv_layout = KVLayout.V4 if layout is None else KVLayout.parse(layout)
        if kv_layout is not KVLayout.V4 or freqs_cis is not None:
            raise NotImplementedError(
                f"winport: fused_store_cache supports the V4 layout without in-kernel RoPE, "
                f"not layout={kv_layout.value} freqs_cis={'given' if freqs_cis is not None else None}")
        if type == "flashmla":
            return sgl_kernel.fused_store_cache_v4(input, cache, indices, page_size)
        if type == "indexer":
            return sgl_kernel.fused_store_cache_indexer(input, cache, indices, page_size)
        raise ValueError(f"fused_store_cache: unknown type {type!r}")

    fused_store_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return fused_store_cache


def apply() -> None:
    """Rebind fused_store_cache in the kernel module and in the pool module that imported it."""
    attn = importlib.import_module(ATTN)
    original = getattr(attn.fused_store_cache, "__wrapped__", attn.fused_store_cache)
    store = _make_store(original)
    attn.fused_store_cache = store
    pool = importlib.import_module(POOL)
    if getattr(pool, "fused_store_cache", None) is None:
        raise UpstreamChangedError(f"{POOL} no longer imports fused_store_cache by name")
    pool.fused_store_cache = store


def register_patch() -> None:
    """Check the upstream store and its caller still look as expected, then apply."""
    require_source(f"{ATTN}.fused_store_cache", "def fused_store_cache(", "module.run(input, cache, indices)",
                   "freqs_cis: Optional[torch.Tensor] = None")
    require_source(f"{POOL}.DeepSeekV4SingleKVPool.set_key_buffer_fused", "return fused_store_cache(")
    apply()
