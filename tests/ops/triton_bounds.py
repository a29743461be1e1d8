"""Memory-bounds checking for Triton kernels run by the interpreter (TRITON_INTERPRET=1).

On CPU the interpreter hands kernels the tensors' own host memory and loads and stores through raw
addresses. A kernel that reaches past its tensors therefore corrupts the Python process's heap in
silence (on a GPU it would overwrite a neighbouring buffer just as silently); the values a test
compares can still be right. This module wraps the interpreter so that every active (unmasked)
address of every load, store and atomic must fall inside the storage of one of the launch's tensor
arguments; otherwise the launch fails before the access, naming the kernel, the operation and the
address. tests/ops/conftest.py installs it for the whole op suite on CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

_launches: list[tuple[str, np.ndarray, np.ndarray]] = []  # (kernel name, sorted starts, ends)
_installed: list[bool] = []


def _tensors(arg: Any) -> Iterator[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        yield arg
    elif isinstance(arg, tuple | list):
        for a in arg:
            yield from _tensors(a)
    elif hasattr(arg, "base") and isinstance(getattr(arg, "base", None), torch.Tensor):  # TensorDescriptor
        yield arg.base


def storage_ranges(args: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted [start, end) byte ranges of the storages behind every tensor in ``args``."""
    spans: dict[int, int] = {}
    for t in _tensors(args):
        st = t.untyped_storage()
        start = st.data_ptr()
        spans[start] = max(spans.get(start, start), start + st.nbytes())
    starts = np.array(sorted(spans), dtype=np.uint64)
    ends = np.array([spans[s] for s in sorted(spans)], dtype=np.uint64)
    return starts, ends


def outside(addrs: np.ndarray, itemsize: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The addresses of ``addrs`` whose ``itemsize`` bytes are not all inside one range."""
    addrs = np.asarray(addrs, dtype=np.uint64).ravel()
    if addrs.size == 0:
        return addrs
    if starts.size == 0:
        return addrs
    idx = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    ok = idx >= 0
    safe = np.where(ok, idx, 0)
    ok &= addrs + np.uint64(itemsize) <= ends[safe]
    return addrs[~ok]


def _check(op: str, ptrs: Any, mask: Any) -> None:
    if not _launches:
        return
    name, starts, ends = _launches[-1]
    data = np.asarray(ptrs.data)
    if mask is not None:
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
        data = data[active]
    from triton.runtime.interpreter import _get_np_dtype

    itemsize = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
    bad = outside(data, itemsize, starts, ends)
    if bad.size:
        spans = ", ".join(f"[{int(s):#x}, {int(e):#x})" for s, e in zip(starts, ends, strict=True))
        raise AssertionError(f"Triton kernel {name}: {op} of {bad.size} element(s) outside its tensors, first at "
                             f"{int(bad[0]):#x} ({itemsize} B); the launch's storages: {spans or 'none'}")


def install() -> None:
    """Wrap the interpreter's launch and memory operations (idempotent)."""
    if _installed:
        return
    from triton.runtime import interpreter as ti

    launch = ti.GridExecutor.__call__

    @functools.wraps(launch)
    def checked_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        starts, ends = storage_ranges((args, tuple(kwargs.values())))
        _launches.append((getattr(self.fn, "__name__", repr(self.fn)), starts, ends))
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launches.pop()

    ti.GridExecutor.__call__ = checked_launch
    builder = type(ti.interpreter_builder)

    def wrap(method: str, check: Callable[[tuple[Any, ...]], tuple[Any, Any]]) -> None:
        original = getattr(builder, method)

        @functools.wraps(original)
        def checked(self: Any, *a: Any, **kw: Any) -> Any:
            ptrs, mask = check(a)
            _check(method, ptrs, mask)
            return original(self, *a, **kw)

        setattr(builder, method, checked)

    wrap("create_masked_load", lambda a: (a[0], a[1]))  # (ptrs, mask, other, ...)
    wrap("create_masked_store", lambda a: (a[0], a[2]))  # (ptrs, value, mask, ...)
    wrap("create_atomic_rmw", lambda a: (a[1], a[3]))  # (rmwOp, ptr, val, mask, ...)
    wrap("create_atomic_cas", lambda a: (a[0], None))  # (ptr, cmp, val, ...)
    _installed.append(True)
