"""Two processes building the same demo model at once (two servers started together) both succeed and
leave one complete folder: each builds in a partial folder of its own (winport.demo.build)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from winport.demo.build import build_demo, is_current


def _build(folder: str) -> None:
    build_demo(Path(folder), "v4", quiet=True)


def test_concurrent_builds_leave_one_complete_folder(tmp_path: Path) -> None:
    folder = tmp_path / "demo-v4"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build, args=(str(folder),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert is_current(folder, "v4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-v4"]  # no partial folder left behind
