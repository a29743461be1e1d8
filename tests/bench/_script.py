"""Load a benchmark script of scripts/bench/ as a module, for the tests of its arithmetic."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from winport.modfile import import_file

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def load(name: str) -> ModuleType:
    """scripts/bench/<name>.py as module `name` (registered in sys.modules: dataclasses look it up there)."""
    return import_file(name, BENCH / f"{name}.py")
