"""winport.patches.dsv4_fused_store: SGLang's fused KV-cache store without its CUDA JIT kernel (the
torch store of the sgl_kernel shim)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_python_ok
from winport.patches import dsv4_fused_store


def _v4_cache(pages: int = 1, page_size: int = 256) -> torch.Tensor:
    return torch.full((pages, -(-page_size * 584 // 576) * 576), 0x5A, dtype=torch.uint8)


def test_fused_store_goes_to_the_torch_store() -> None:
    import sgl_kernel
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    calls: list[object] = []
    store = dsv4_fused_store._make_store(lambda *a, **k: calls.append((a, k)))
    x = torch.randn(5, 512).to(torch.bfloat16)
    loc = torch.tensor([3, 0, 200, 17, 255])
    got, want = _v4_cache(), _v4_cache()
    store(x, got, loc, page_size=256, type="flashmla", layout=KVLayout.V4)
    sgl_kernel.fused_store_cache_v4(x, want, loc, 256)
    assert torch.equal(got, want) and not torch.equal(got, _v4_cache())
    assert calls == [], "no cache may reach the upstream (CUDA JIT) kernel"

    idx_got = torch.zeros(1, 64 * 132, dtype=torch.uint8)
    idx_want = idx_got.clone()
    k = torch.randn(4, 128).to(torch.bfloat16)
    store(k, idx_got, torch.tensor([1, 2, 60, 9]), page_size=64, type="indexer")
    sgl_kernel.fused_store_cache_indexer(k, idx_want, torch.tensor([1, 2, 60, 9]), 64)
    assert torch.equal(idx_got, idx_want)


def test_fused_store_names_what_it_cannot_do() -> None:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    store = dsv4_fused_store._make_store(lambda *a, **k: None)
    x, loc = torch.zeros(1, 512), torch.zeros(1, dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="layout=v41"):
        store(x, _v4_cache(), loc, page_size=256, type="flashmla", layout=KVLayout.V41)
    with pytest.raises(NotImplementedError, match="freqs_cis=given"):
        store(x, _v4_cache(), loc, page_size=256, type="flashmla", freqs_cis=torch.zeros(1, 64))
    with pytest.raises(ValueError, match="unknown type 'other'"):
        store(x, _v4_cache(), loc, page_size=256, type="other")


def test_fused_store_patch_rebinds_the_pool_module() -> None:
    # In a fresh interpreter: the patch changes module state.
    out = run_python_ok(
        "from winport.patches import dsv4_fused_store as p; p.register_patch()\n"
        "import sglang.srt.mem_cache.deepseek_v4_memory_pool as pool, sglang.kernels.ops.attention.dsv4.attn as a\n"
        "assert pool.fused_store_cache is a.fused_store_cache and hasattr(a.fused_store_cache, '__wrapped__')\n"
        "p.apply(); assert not hasattr(a.fused_store_cache.__wrapped__, '__wrapped__')  # idempotent\n"
        "print('ok')")
    assert out.strip().endswith("ok")
