"""pytest plugin for the wine tier's run of tests/ops under Windows CPython (`-p` loads it there).

An SGLang module that fails to import on Windows can fail with errors
other than ImportError (AttributeError, ZMQError), and a second attempt on the half-initialised
package raises KeyError; `pytest.importorskip` then errors instead of skipping the comparisons
against SGLang's own references. Before collection this plugin imports every SGLang module that
tests/ops names; if one fails, every `sglang` import fails the same clean way, naming the cause,
so those comparisons are reported as skipped with that reason while the rest of the suite (float64
and torch references, Triton interpreter) still runs. Once SGLang imports it does nothing;
test_wine.test_sglang_imports_on_windows tracks the bugs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import re
import sys
from pathlib import Path

OPS_DIR = Path(__file__).resolve().parents[1] / "ops"
_NAME = re.compile(r"""(?:^\s*(?:import|from)\s+|["'])(sglang(?:\.\w+)*)""", re.M)


def sglang_modules_named_by_ops_tests() -> list[str]:
    """Every sglang module tests/ops imports or passes to importorskip (shortest first)."""
    names = {m for path in OPS_DIR.glob("*.py") for m in _NAME.findall(path.read_text(errors="replace"))}
    return sorted(names, key=lambda n: (n.count("."), n))


class _Unimportable(importlib.abc.MetaPathFinder):
    """Refuses `sglang` and its submodules with the original error as the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"SGLang does not import on Windows yet: {self.reason}", name=name)
        return None


def pytest_configure(config: object) -> None:
    """Try the SGLang modules once, before any test module is collected."""
    for module in sglang_modules_named_by_ops_tests():
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure makes the references unusable
            for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
                del sys.modules[name]
            sys.meta_path.insert(0, _Unimportable(f"import {module}: {exc!r}"))
            return


_exit_status: list[int] = []


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Remember pytest's exit status for pytest_unconfigure."""
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: object) -> None:
    """Leave without interpreter teardown once pytest has reported everything.

    Under Wine a run that imported SGLang and torch sometimes never exits (wine_harness's watchdog
    entry); the results are already printed by now, so nothing is lost by skipping the teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status[-1] if _exit_status else 0)
