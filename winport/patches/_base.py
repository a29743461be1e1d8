"""What every patch module shares: an upstream-fingerprint check and hook registration helpers."""

from __future__ import annotations

import inspect
import pkgutil
from collections.abc import Callable
from typing import Any


class UpstreamChangedError(RuntimeError):
    """The SGLang code a patch targets no longer looks as the patch expects."""


def require_source(target: str, *needles: str) -> Any:
    """Resolve `module.attr` and check its source still contains every needle; return the object.

    Fails loudly (UpstreamChangedError) when SGLang changed, instead of patching blindly.
    """
    try:
        obj: Any = pkgutil.resolve_name(target)
    except (ImportError, AttributeError) as exc:
        raise UpstreamChangedError(f"{target} no longer exists upstream ({exc})") from exc
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        raise UpstreamChangedError(f"cannot read the source of {target}: {exc}") from exc
    missing = [n for n in needles if n not in source]
    if missing:
        raise UpstreamChangedError(
            f"{target} changed upstream: expected to find {missing!r}; review the winport patch for it"
        )
    return obj


def register(target: str, hook: Callable[..., Any], kind: str = "AROUND") -> None:
    """Register `hook` on `target` with SGLang's HookRegistry (kind: BEFORE/AFTER/AROUND/REPLACE)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(target, hook, HookType[kind])
