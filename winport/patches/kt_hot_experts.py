"""The decode-step clock of the hot-swapping hybrid layers (winport.hybrid.hot_registry).

Targets sglang 0.5.23 `srt/model_executor/model_runner.py:ModelRunner.forward`, which runs once a
step in the scheduler process whether the step replays a CUDA graph or runs eagerly. Before the
forward the registry says whether its routes count as decode or prefill (DSpark's verify steps
count as decode, other modes not at all); after a decode forward has been enqueued it counts the
step, moves the swaps in flight on and refreshes the layers' slots every interval. A hook that
changes nothing unless a hot-swapping layer (WINPORT_HOT_EXPERTS, on by default with CUDA) or
--record-experts' route record registered.

Also targets sglang 0.5.23 `srt/managers/scheduler.py:Scheduler.on_idle`, which the scheduler's
loops call whenever no batch is left to run: the route record is written there, so the file holds
every finished request without a write per step.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"


def _step_kind(mode: Any) -> str | None:
    """'decode', 'prefill' or None (not counted) for SGLang's ForwardMode `mode`."""
    if mode.is_decode() or mode.is_target_verify():
        return "decode"
    if mode.is_extend():
        return "prefill"
    return None


def _forward(original: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    from winport.hybrid import hot_registry

    reg = hot_registry.active()
    kind = _step_kind(forward_batch.forward_mode) if reg is not None else None
    if reg is None or kind is None:
        return original(self, forward_batch, *args, **kwargs)
    reg.begin(decode=kind == "decode")
    try:
        out = original(self, forward_batch, *args, **kwargs)
    finally:
        reg.end()
    if kind == "decode":
        reg.step()
    return out


def _on_idle(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    from winport.hybrid import hot_registry

    reg = hot_registry.active()
    if reg is not None:
        reg.idle()
    return original(self, *args, **kwargs)


def register_patch() -> None:
    """Check upstream and register the hooks."""
    require_source(FORWARD, "self.forward_pass_id += 1", "forward_batch")
    register(FORWARD, _forward)
    require_source(ON_IDLE, "Idle housekeeping")
    register(ON_IDLE, _on_idle)
