"""Load a benchmark script of scripts/bench/ as a module, for the tests of its arithmetic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def load(name: str) -> ModuleType:
    """scripts/bench/<name>.py as module `name` (registered in sys.modules: dataclasses look it up there)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
