"""Store DeepSeek-V4.1's ratio-1/2 index keys on CPU with torch instead of interpreted Triton.

Targets sglang 0.5.23 `kernels/ops/kvcache/dsv4_fp4_index_k_cache.py:store_fp4_index_k_cache`,
which `srt/mem_cache/deepseek_v4_memory_pool.py:DeepSeekV4IndexerPool.set_index_fp4` imports at
call time for every kv-source layer's index keys. It is two Triton kernels (FP4 quantize, paged
store) that on CPU run in Triton's interpreter (TRITON_INTERPRET=1), one interpreted program per
token: 71% of a 600-token V4.1 demo prefill on this 2-core machine (py-spy). For caches not on
CUDA it goes to `sgl_kernel.store_fp4_index_k_cache` (winport's torch version, tested against
float64 in tests/ops/test_dsv4_xpu_v41.py); CUDA caches keep the Triton kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

from winport.patches._base import require_source

MODULE = "sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache"
CALLER = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4IndexerPool.set_index_fp4"


def _make_store(original: Any) -> Any:
    def store_fp4_index_k_cache(input: Any, cache: Any, loc: Any, *, page_size: int,  # noqa: A002
                                rne: bool = False) -> None:
        if cache.is_cuda:
            return original(input, cache, loc, page_size=page_size, rne=rne)
        import sgl_kernel

        return sgl_kernel.store_fp4_index_k_cache(input, cache, loc, page_size, rne)

    store_fp4_index_k_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return store_fp4_index_k_cache


def apply() -> None:
    """Rebind the module attribute the pool imports at call time."""
    module = importlib.import_module(MODULE)
    original = getattr(module.store_fp4_index_k_cache, "__wrapped__", module.store_fp4_index_k_cache)
    module.store_fp4_index_k_cache = _make_store(original)


def register_patch() -> None:
    """Check the upstream store and its caller, then apply."""
    require_source(f"{MODULE}.store_fp4_index_k_cache", "quantize_fp4_indexer_tensor(input.contiguous(), rne=rne)",
                   "_store_fp4_index_k_cache_kernel[(n_tokens,)](")
    require_source(CALLER, "from sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache import (",
                   "return store_fp4_index_k_cache(", "rne=self.index_k_rne")
    apply()
