"""pytest plugin for the wine tier's run of tests/ops under Windows CPython (`-p` loads it there).

While `import sglang` fails on Windows (test_wine.SGLANG_IMPORT_BUG), a second import attempt of an
`sglang.*` module raises KeyError('sglang') from the half-initialised package instead of
ImportError, so `pytest.importorskip` errors instead of skipping the SGLang-reference comparisons.
This makes every later `sglang` import fail the same clean way, naming the real cause. It changes
nothing once SGLang imports; test_wine.test_import_sglang_on_windows tracks that bug.
"""

from __future__ import annotations

import importlib.abc
import sys


class _Unimportable(importlib.abc.MetaPathFinder):
    """Refuses `sglang` and its submodules with the original import error as the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"sglang cannot be imported on Windows yet: {self.reason}", name=name)
        return None


def pytest_configure(config: object) -> None:
    """Try SGLang once before any test module is collected."""
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _Unimportable(repr(exc)))
