"""Import a Python file (or an extension module) by its path, outside any package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(name: str, path: str | Path, register: bool = True) -> ModuleType:
    """The module at ``path`` imported under ``name``; ImportError naming the path if it cannot be.

    ``register`` puts it in sys.modules before it runs, which dataclasses and pickling need (they
    look a class's module up by name while the class is built).
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: no module spec for it")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
