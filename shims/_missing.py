"""Loud failures for upstream names a shim does not provide.

SGLang probes optional kernels with `hasattr` and `try: from lib import name`, so a missing name
must look missing (AttributeError for getattr/hasattr) while `from lib import name` raises an
ImportError that says which upstream function has no shim, instead of Python's generic message.
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable
from typing import NoReturn


class ShimMissingError(ImportError):
    """An upstream kernel-library name that winport has no shim for (raised by `from x import y`)."""


class ShimMissingAttributeError(AttributeError):
    """The same, raised for attribute access (so `hasattr` stays False)."""


def _message(module: str, upstream: str, name: str) -> str:
    return (
        f"{module}.{name} (upstream {upstream}) has no winport shim yet; "
        f"winport's {module} shim provides only what it implements and tests"
    )


def _called_from_import_from(depth: int) -> bool:
    try:
        frame = sys._getframe(depth)
        op = frame.f_code.co_code[frame.f_lasti]
    except (ValueError, IndexError, AttributeError):
        return False
    return dis.opname[op] == "IMPORT_FROM"


def missing_getattr(module: str, upstream: str) -> Callable[[str], NoReturn]:
    """Build a module-level `__getattr__` that raises a clear error for unshimmed names."""

    def __getattr__(name: str) -> NoReturn:
        if name.startswith("__") and name.endswith("__"):
            # Dunder probes (copy, pickle, pytest, inspect) must see a plain AttributeError.
            raise AttributeError(name)
        msg = _message(module, upstream, name)
        if _called_from_import_from(2):
            raise ShimMissingError(msg, name=f"{module}.{name}")
        raise ShimMissingAttributeError(msg)

    return __getattr__
