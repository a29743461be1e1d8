"""winport.patches.cpu_topology_without_lscpu: the CPU topology from psutil where lscpu is missing."""

from __future__ import annotations

import pytest


def test_topology_without_lscpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from winport.patches import cpu_topology_without_lscpu as topo

    rows = topo.topology_from_psutil()
    assert [r[0] for r in rows] == list(range(psutil.cpu_count(logical=True)))
    assert {r[3] for r in rows} == {0}
    monkeypatch.setattr(topo.shutil, "which", lambda name: None)
    assert topo._parse(lambda: pytest.fail("lscpu must not run")) == rows
    monkeypatch.setattr(topo.shutil, "which", lambda name: "/usr/bin/lscpu")
    assert topo._parse(lambda: "upstream") == "upstream"
