"""SIGQUIT on Windows: SGLang's "a child failed" signal mapped onto SIGTERM.

Targets sglang 0.5.23: entrypoints/engine.py `_set_envs_and_config` registers a SIGQUIT handler that
kills the process tree, and the scheduler, detokenizer, tokenizer manager and watchdog send SIGQUIT
to their parent when they fail. Windows has no SIGQUIT, so `signal.SIGQUIT` raises AttributeError
there before the server starts. Where it is missing it is set to SIGTERM, the closest meaning both
systems have ("stop now"): on Linux under emulation the handler runs as upstream intends; on
Windows psutil's send_signal(SIGTERM) terminates the parent, and `winport serve`, which watches
the whole tree, then stops every remaining process.
"""

from __future__ import annotations

import signal

from winport.patches._base import require_source


def apply() -> bool:
    """Define signal.SIGQUIT as SIGTERM where the platform has none; return whether it did."""
    if hasattr(signal, "SIGQUIT"):
        return False
    signal.SIGQUIT = signal.SIGTERM  # type: ignore[attr-defined,misc]
    return True


def register_patch() -> None:
    """Check upstream still signals with SIGQUIT, then apply."""
    require_source("sglang.srt.entrypoints.engine._set_envs_and_config", "signal.signal(signal.SIGQUIT")
    apply()
