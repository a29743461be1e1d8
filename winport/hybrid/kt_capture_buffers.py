"""kt-kernel's staging buffers outlive every CUDA graph that captured them.

Targets kt-kernel 0.7.2 `experts_base.KExpertsCPUBuffer.get_buffer`. kt-kernel stages each submit
through pinned host buffers (and one GPU output) keyed by the token count. It keeps a count's
buffers for good only if the count is in `capture_bs`, a list SGLang's graph runners overwrite
(`KTMoEWrapper.set_capture_batch_sizes(self.capture_bs)`, in requests); any other count gets the
one "temp" set, freed as soon as another count comes. A CUDA graph captured through a temp set
keeps its raw pointers, so its next replay reads and writes freed memory.

That is what DSpark's target-verify graph does: it is captured per request count (1, 2) but each
request brings a verify block of tokens (6 a request on the V4.1 demo), so the counts kt-kernel
sees (6, 12) were never in the list. Found on the H200 (2026-12-03): the first prefill after
start-up replaced the temp set and the next verify replay died with a segmentation fault in
cuGraphLaunch. The same holds for any graph whose token count is not its request count.

The fix keys on what matters, not on a list of sizes: a buffer handed out while the current CUDA
stream is capturing is kept for good (`capture_buffers`), as kt-kernel keeps the listed ones. It
adds one set per captured token count, as many as kt-kernel itself keeps for the listed sizes.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

TARGET = "kt_kernel.experts_base.KExpertsCPUBuffer.get_buffer"
_NEEDLES = ("batch_size = hidden_states.shape[0]", "if batch_size in cls.capture_buffers:",
            "cls.temp_buffer = cur_buffer")


def capturing(hidden_states: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the stream `hidden_states` is used on."""
    return hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()


def apply() -> None:
    """Wrap KExpertsCPUBuffer.get_buffer once (idempotent); fails loudly if kt-kernel changed it."""
    import pkgutil

    from winport.patches._base import require_source

    require_source(TARGET, *_NEEDLES)
    cls: Any = pkgutil.resolve_name(TARGET.rsplit(".", 1)[0])
    original = cls.__dict__["get_buffer"].__func__
    if getattr(original, "_winport_keeps_captured", False):
        return

    @functools.wraps(original)
    def get_buffer(klass: Any, hidden_states: torch.Tensor, num_experts_per_tok: int) -> Any:
        buffers = original(klass, hidden_states, num_experts_per_tok)
        if capturing(hidden_states):
            klass.capture_buffers.setdefault(hidden_states.shape[0], buffers)
        return buffers

    get_buffer._winport_keeps_captured = True  # type: ignore[attr-defined]
    cls.get_buffer = classmethod(get_buffer)
