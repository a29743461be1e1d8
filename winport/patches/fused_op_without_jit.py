"""SGLang's fused ops never pick their run-time-compiled CUDA (JIT) backend.

Targets sglang 0.5.23 `kernels/fused_op.py`: `BaseFusedOp._auto_backend_candidates` lists the
backends an op may auto-select, best first, and ops such as `attention.clamp_position` (decode
positions, forward_batch_info) put `KernelBackend.JIT` first on CUDA. JIT means CUDA C++ compiled
at run time with nvcc through tvm_ffi, which the Windows port does not have (and on the Linux proxy
it would hide that gap). With JIT removed from the candidates each op falls through to its next
backend: Triton where the op has one, else its platform forward, else the torch reference
(`forward_native`), which SGLang keeps as the semantic definition of every fused op.
Explicit per-call `backend=KernelBackend.JIT` requests are left alone (none on the DeepSeek-V4 path).
"""

from __future__ import annotations

import functools
from typing import Any

from winport.patches._base import UpstreamChangedError, require_source

TARGET = "sglang.kernels.fused_op.BaseFusedOp._auto_backend_candidates"


def apply() -> None:
    """Wrap `_auto_backend_candidates` so it drops `KernelBackend.JIT` (idempotent)."""
    from sglang.kernels import fused_op
    from sglang.kernels.spec import KernelBackend

    if not hasattr(KernelBackend, "JIT"):
        raise UpstreamChangedError("sglang.kernels.spec.KernelBackend has no JIT member any more")
    original = fused_op.BaseFusedOp._auto_backend_candidates
    if getattr(original, "_winport_without_jit", False):
        return

    @functools.wraps(original)
    def candidates_without_jit(self: Any) -> tuple[Any, ...]:
        return tuple(b for b in original(self) if b is not KernelBackend.JIT)

    candidates_without_jit._winport_without_jit = True  # type: ignore[attr-defined]
    fused_op.BaseFusedOp._auto_backend_candidates = candidates_without_jit


def register_patch() -> None:
    """Check that auto-selection still walks `self.priority`, then filter JIT out of it."""
    require_source(TARGET, "for backend in self.priority:", "candidates.append(backend)")
    require_source("sglang.kernels.fused_op.BaseFusedOp._resolve_forward_method",
                   "candidates = self._auto_backend_candidates()")
    apply()
