"""`pin_memory=True` without CUDA: a no-op instead of "Found no NVIDIA driver".

Targets torch's tensor factories as SGLang 0.5.23 (e.g. kernels/ops/attention/dsv4/compress.py,
which pins host staging buffers whenever its inputs are not on a GPU) and kt-kernel 0.7.2
(experts_base.py) call them. Pinned (page-locked) memory only matters for asynchronous copies to
a GPU; on a machine with no CUDA device there is nothing to copy to, so ordinary memory is the
correct stand-in. Applied only when torch.cuda.is_available() is False.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "empty_strided", "randn", "rand", "arange")
_applied = False


def _drop_pin(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return fn(*args, **kwargs)

    wrapper._winport_unpinned = True  # type: ignore[attr-defined]
    return wrapper


def apply() -> bool:
    """Install the wrappers when there is no CUDA device; return whether they are active."""
    global _applied
    import torch

    if _applied or torch.cuda.is_available():
        return _applied
    # torch's device context (`with torch.device("meta")`) recognizes factories by identity, from a
    # set it builds once (torch/utils/_device.py, _device_constructors, lru_cache): built after the
    # wrappers, it would hold them, miss the originals the wrappers call, and a model built on the
    # meta device would allocate for real. Fails loudly if torch moved it.
    from torch.utils import _device

    _device._device_constructors()
    for name in FACTORIES:
        original = getattr(torch, name)
        if not getattr(original, "_winport_unpinned", False):
            setattr(torch, name, _drop_pin(original))
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.is_pinned = lambda self, *a, **k: False  # type: ignore[method-assign]
    _applied = True
    return True


def register_patch() -> None:
    """Apply (torch factories need no SGLang hook)."""
    apply()
