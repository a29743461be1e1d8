"""`sgl_kernel.weak_ref_tensor`: a view of a GPU tensor's memory that does not keep it alive.

SGLang's breakable CUDA graphs (model_executor/runner_backend_utils/breakable_cuda_graph) hand
such views of pool-allocated intermediates between graph segments, so the graph pool, not the
Python objects, decides when that memory is reused; V4.1's decoder replay tail captures them on
the first prefill longer than its row buckets. Upstream builds the view in C++ from the data
pointer (torch::from_blob, no deleter). Here: torch.as_tensor over an object exposing
`__cuda_array_interface__` with the same pointer, shape and strides, which torch wraps without a
copy and without a reference to the source tensor. The element type travels as an unsigned
integer of the same width and is viewed back, so bf16 and fp8 tensors pass too.
"""

from __future__ import annotations

import torch

_UINT = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_AS_UINT = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


class _Pointer:
    """Only the address, shape and strides of a tensor: what torch.as_tensor reads."""

    def __init__(self, t: torch.Tensor) -> None:
        size = t.element_size()
        self.__cuda_array_interface__ = {
            "data": (t.data_ptr(), False),
            "shape": tuple(t.shape),
            "strides": tuple(s * size for s in t.stride()),
            "typestr": _UINT[size],
            "version": 3,
        }


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s memory (same dtype, shape, strides, address) that holds no reference to
    `t` or its storage; CPU tensors come back as they are (upstream: CUDA only)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"weak_ref_tensor: expected a tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        return t
    size = t.element_size()
    if size not in _UINT:
        raise TypeError(f"weak_ref_tensor: {t.dtype} ({size}-byte elements) is not supported")
    view = torch.as_tensor(_Pointer(t), device=t.device)
    return view if t.dtype == _AS_UINT[size] else view.view(t.dtype)
