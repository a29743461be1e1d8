"""`sgl_kernel.weak_ref_tensor` (shims/sgl_kernel/memory.py): same memory, no reference.

Upstream's contract (sgl-kernel: torch::from_blob over the data pointer, no deleter): the result
has the input's dtype, shape, strides and address, writes through either are seen by the other,
and the input's memory is released when the input goes, whatever happens to the view.
"""

from __future__ import annotations

import pytest
import torch

from shims.sgl_kernel import weak_ref_tensor


def test_cpu_tensors_come_back_as_they_are() -> None:
    t = torch.randn(3, 4)
    assert weak_ref_tensor(t) is t
    with pytest.raises(TypeError, match="expected a tensor"):
        weak_ref_tensor([1, 2])  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int64,
                                   torch.int32, torch.bool, torch.uint8])
def test_gpu_view_shares_memory(dtype: torch.dtype) -> None:
    base = torch.randn(6, 10, device="cuda").mul(3)
    src = (base > 0) if dtype == torch.bool else base.to(dtype)
    for t in (src, src[:, 2:7], src.t(), src[1:5:2]):  # contiguous, sliced, transposed, strided
        v = weak_ref_tensor(t)
        assert (v.dtype, v.shape, v.stride(), v.data_ptr()) == (t.dtype, t.shape, t.stride(), t.data_ptr())
        assert torch.equal(v.view(torch.uint8) if dtype.itemsize == 1 else v.cpu(), t.view(torch.uint8)
                           if dtype.itemsize == 1 else t.cpu())
    a = torch.randn(1024, device="cuda")
    v = weak_ref_tensor(a)
    a.fill_(7.0)
    assert torch.all(v == 7.0)
    v.fill_(-2.0)
    assert torch.all(a == -2.0)


@pytest.mark.gpu
def test_gpu_view_does_not_keep_the_memory_alive() -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    a = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    v = weak_ref_tensor(a)
    assert torch.cuda.memory_allocated() - before == 64 * 2**20
    del a
    # The caching allocator got the block back although the view is still alive.
    assert torch.cuda.memory_allocated() == before
    assert v.shape == (64 * 2**20,)
