"""winport.patches.engram_host_table_file_map: engram host tables as files in winport's cache."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch

from tests.helpers import run_python
from winport.patches import engram_host_table_file_map as patch


class FakeGroup:
    """A TP group of one process standing in for several ranks (what _HostTable asks of it)."""

    def __init__(self, rank: int, shared_path: list[str]) -> None:
        self.rank_in_group = rank
        self.shared_path = shared_path
        self.barriers = 0

    def broadcast_object(self, obj: object, src: int = 0) -> object:
        if self.rank_in_group == src:
            self.shared_path.append(obj)  # type: ignore[arg-type]
            return obj
        return self.shared_path[-1]

    def barrier(self) -> None:
        self.barriers += 1


@pytest.fixture()
def host_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type:
    from sglang.srt.layers import engram

    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path))
    monkeypatch.setattr(engram._HostTable, "__init__", patch._init)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_memfd(*_a: object, **_k: object) -> None:
        raise AssertionError("memfd_create must not be used")

    monkeypatch.setattr(os, "memfd_create", no_memfd, raising=False)
    return engram._HostTable


def test_shared_table_is_one_file_every_rank_maps(host_table: type, tmp_path: Path) -> None:
    paths: list[str] = []
    g0, g1 = FakeGroup(0, paths), FakeGroup(1, paths)
    t0 = host_table("shared", 3 * 4096 + 5, "sglang_engram_2", g0)
    t1 = host_table("shared", 3 * 4096 + 5, "sglang_engram_2", g1)
    assert Path(paths[0]).parent == tmp_path / "engram" and t0.path == t1.path
    assert t0.bytes.numel() == 3 * 4096 + 5 and g0.barriers == g1.barriers == 1
    data = torch.randint(0, 256, (3 * 4096 + 5,), dtype=torch.uint8)
    t0.bytes.copy_(data)  # what rank 0's loader writes ...
    assert torch.equal(t1.bytes, data)  # ... every rank reads through its own mapping
    t0.mm.flush()
    assert Path(t0.path).read_bytes() == data.numpy().tobytes()
    assert t0.device_ptr == t0.bytes.data_ptr()


def test_per_rank_tables_are_separate_files(host_table: type) -> None:
    a = host_table("per_rank", 4096, "sglang_engram_2", FakeGroup(0, []))
    b = host_table("per_rank", 4096, "sglang_engram_2", FakeGroup(1, []))
    assert a.path != b.path
    a.bytes.fill_(7)
    assert int(b.bytes.sum()) == 0


def test_bad_layout_is_named(host_table: type) -> None:
    with pytest.raises(ValueError, match="SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT='numa'"):
        host_table("numa", 4096, "x", FakeGroup(0, []))


def test_finish_load_runs_on_the_file_mapping(host_table: type) -> None:
    t = host_table("shared", 8192, "sglang_engram_5", FakeGroup(0, []))
    t.dirty = True
    t.finish_load("layer 5")  # upstream's own finish: barrier + huge-page report, no memfd/proc fd use
    assert t.dirty is False


@pytest.mark.parametrize("emulate", [True, False])
def test_patch_applies_where_there_is_no_memfd(emulate: bool) -> None:
    # Under Windows emulation os.memfd_create is gone: the file mapping replaces the constructor.
    # On plain Linux upstream's memfd + huge pages stay.
    code = ("from winport.patches import engram_host_table_file_map as p; p.register_patch()\n"
            "from sglang.srt.layers import engram\n"
            "print(engram._HostTable.__init__ is p._init)")
    proc = run_python(code, env={"WINPORT_EMULATE_WINDOWS": "1"} if emulate else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(str(emulate))


def test_upstream_without_memfd_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers import engram

    from winport.patches._base import UpstreamChangedError

    def changed(self: object, nbytes: int, name: str) -> int:  # no memfd any more
        return 0

    monkeypatch.setattr(engram._HostTable, "_open_shared_fd", changed)
    with pytest.raises(UpstreamChangedError, match="memfd_create"):
        patch.register_patch()
    assert isinstance(engram._HostTable.__init__, types.FunctionType)
