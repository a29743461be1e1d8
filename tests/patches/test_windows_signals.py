"""winport.patches.windows_signals: SIGQUIT becomes SIGTERM where the platform lacks it."""

from __future__ import annotations

import signal

import pytest


def test_sigquit_becomes_sigterm_only_where_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import windows_signals

    assert windows_signals.apply() is False  # Linux has SIGQUIT: untouched
    monkeypatch.delattr(signal, "SIGQUIT")
    assert windows_signals.apply() is True
    assert signal.SIGQUIT == signal.SIGTERM
