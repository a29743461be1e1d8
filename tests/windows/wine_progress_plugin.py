"""pytest plugin for the wine tier: records which test a Windows CPython run is in (`-p` loads it).

With WINPORT_WINE_PROGRESS naming a file, it gets "START <nodeid>" before each test, "<OUTCOME>
<nodeid>" after each phase report that decides a test, and "END <exit status>" when the session
ends; so when the process crashes or hangs, tests/windows/test_wine.py knows in which test.
WINPORT_WINE_RESUME_FROM=<nodeid> runs the collected tests from that one on (WINE_WORKAROUNDS
"resume after a crash (ops)").
"""

from __future__ import annotations

import os
from typing import Any

PROGRESS_ENV = "WINPORT_WINE_PROGRESS"
RESUME_ENV = "WINPORT_WINE_RESUME_FROM"


def _progress(line: str) -> None:
    path = os.environ.get(PROGRESS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:  # reopened per line: a crash loses nothing written
            f.write(line + "\n")


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """With WINPORT_WINE_RESUME_FROM, deselect every test collected before that node id."""
    start = os.environ.get(RESUME_ENV)
    if not start:
        return
    ids = [item.nodeid for item in items]
    if start not in ids:
        raise RuntimeError(f"{RESUME_ENV}={start!r}: no such test was collected")
    cut = ids.index(start)
    config.hook.pytest_deselected(items=items[:cut])
    del items[:cut]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """Record that a test is starting."""
    _progress(f"START {nodeid}")


def pytest_runtest_logreport(report: Any) -> None:
    """Record the phase reports that decide a test: its call, or a setup/teardown that did not pass."""
    if report.when == "call" or report.outcome != "passed":
        _progress(f"{report.outcome.upper()} {report.nodeid}")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Record the end of the session with pytest's exit status."""
    _progress(f"END {int(exitstatus)}")
