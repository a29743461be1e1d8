"""The decode-step clock of the hot-swapping hybrid layers (winport.hybrid.hot_registry).

Targets sglang 0.5.23 `srt/model_executor/model_runner.py:ModelRunner.forward`, which runs once a
step in the scheduler process whether the step replays a CUDA graph or runs eagerly. After a decode
forward has been enqueued, the registry counts the step and refreshes the layers' slots every
interval. A hook that changes nothing unless WINPORT_HOT_EXPERTS=1 registered a layer.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"


def _forward(original: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(self, forward_batch, *args, **kwargs)
    from winport.hybrid import hot_registry

    reg = hot_registry.active()
    if reg is not None and forward_batch.forward_mode.is_decode():
        reg.step()
    return out


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(FORWARD, "self.forward_pass_id += 1", "forward_batch")
    register(FORWARD, _forward)
