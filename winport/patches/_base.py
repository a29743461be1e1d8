"""What every patch module shares: an upstream-fingerprint check and hook registration helpers."""

from __future__ import annotations

import importlib
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
        cause = _import_failure(target)
        if cause is not None:
            # The module exists but failed to import (a missing dependency, say): that is not an
            # upstream change, and resolve_name's AttributeError would hide the real error.
            raise UpstreamChangedError(f"{target}: importing {cause[0]} failed: {cause[1]!r}") from cause[1]
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


def _import_failure(target: str) -> tuple[str, BaseException] | None:
    """The first module prefix of `target` that exists but raises while importing, with its error."""
    parts = target.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                return None  # this prefix is an attribute (or really gone), not a broken import
            return name, exc
        except Exception as exc:  # noqa: BLE001 - any import-time error is the one to report
            return name, exc
    return None


def register(target: str, hook: Callable[..., Any], kind: str = "AROUND") -> None:
    """Register `hook` on `target` with SGLang's HookRegistry (kind: BEFORE/AFTER/AROUND/REPLACE)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(target, hook, HookType[kind])


def never_supported(*args: Any, **kwargs: Any) -> bool:
    """Stands in for an SGLang capability check of a CUDA JIT kernel (nvcc is not there on Windows):
    never supported, so the caller takes its plain path."""
    return False
