"""winport.patches.dsv41_cpu_index_k_store: V4.1's FP4 index-K store on CPU goes to the torch store."""

from __future__ import annotations

import torch

from tests.helpers import run_python_ok


def test_index_k_store_on_cpu_goes_to_the_torch_store() -> None:
    import sgl_kernel

    from winport.patches import dsv41_cpu_index_k_store

    calls: list[object] = []
    store = dsv41_cpu_index_k_store._make_store(lambda *a, **k: calls.append((a, k)))
    k = torch.randn(6, 128).to(torch.bfloat16)
    loc = torch.tensor([0, 5, 63, 64, 100, 7])
    got = torch.zeros(2, 64 * 68, dtype=torch.uint8)
    want = got.clone()
    store(k, got, loc, page_size=64, rne=True)
    sgl_kernel.store_fp4_index_k_cache(k, want, loc, 64, True)
    assert torch.equal(got, want) and got.any()
    assert calls == []


def test_index_k_store_patch_applies() -> None:
    out = run_python_ok(
        "from winport.patches import dsv41_cpu_index_k_store as p; p.register_patch(); p.apply()\n"
        "import sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache as m\n"
        "f = m.store_fp4_index_k_cache; assert hasattr(f, '__wrapped__') and not hasattr(f.__wrapped__, '__wrapped__')\n"
        "print('ok')")
    assert out.strip().endswith("ok")
