"""The patch machinery (winport/patches/__init__.py, _base.py): every patch applies to the installed
SGLang, and a patch refuses to apply blindly when the upstream code it targets has changed."""

from __future__ import annotations

import types

import pytest

from tests.helpers import run_python
from winport import patches
from winport.patches import _base


def test_every_patch_matches_the_installed_sglang() -> None:
    # register_patch() checks each upstream fingerprint first; a changed SGLang stops here. In a
    # fresh interpreter, because the patches change module state for the rest of the process.
    proc = run_python("from winport import patches; patches.register_all(); print('applied', len(patches.PATCHES))")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"applied {len(patches.PATCHES)}"


def test_require_source_fails_loudly_on_changed_upstream() -> None:
    with pytest.raises(_base.UpstreamChangedError, match="changed upstream"):
        _base.require_source("sglang.srt.utils.common.parse_lscpu_topology", "this text is not there")
    with pytest.raises(_base.UpstreamChangedError, match="no longer exists"):
        _base.require_source("sglang.srt.utils.common.no_such_function_anywhere")


def test_register_all_turns_a_changed_upstream_into_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise _base.UpstreamChangedError("fake change")

    fake = types.ModuleType("winport.patches.fake_broken")
    fake.register_patch = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "winport.patches.fake_broken", fake)
    monkeypatch.setattr(patches, "PATCHES", ("fake_broken",))
    with pytest.raises(SystemExit, match="winport patch 'fake_broken' cannot be applied: fake change"):
        patches.register_all()
