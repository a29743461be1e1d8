"""winport.serve.command.stop_server: one stop signal to the launcher, then force for what is left."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from winport.serve import command

# A stand-in launcher with one child: on SIGINT it stops (exit 0), leaving its child running unless told
# to stop it, or it ignores SIGINT altogether.
LAUNCHER = """
import signal, subprocess, sys, time
mode = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
def on_int(signum, frame):
    if mode == "orderly":
        child.kill()
        child.wait()
    sys.exit(0)
signal.signal(signal.SIGINT, signal.SIG_IGN if mode == "deaf" else on_int)
print(child.pid, flush=True)
time.sleep(120)
"""


def _launch(mode: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, mode], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    return proc, child


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in launcher is stopped by SIGINT, Windows sends CTRL_BREAK")
def test_orderly_launcher_stops_by_itself_quickly() -> None:
    proc, child = _launch("orderly")
    t0 = time.monotonic()
    pids = command.stop_server(proc, grace_s=30)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 0, "the launcher must have stopped on the signal, not been killed"
    assert set(pids) == {proc.pid, child} and _gone(child)


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in launcher is stopped by SIGINT, Windows sends CTRL_BREAK")
def test_what_outlives_the_launcher_is_killed() -> None:
    proc, child = _launch("leave-child")
    command.stop_server(proc, grace_s=30)
    assert proc.returncode == 0
    assert _gone(child)


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in launcher is stopped by SIGINT, Windows sends CTRL_BREAK")
def test_a_launcher_that_ignores_the_signal_is_forced_after_the_grace() -> None:
    proc, child = _launch("deaf")
    t0 = time.monotonic()
    command.stop_server(proc, grace_s=1.0)
    assert 1.0 <= time.monotonic() - t0 < 15
    assert _gone(proc.pid) and _gone(child)


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in launcher is stopped by SIGINT, Windows sends CTRL_BREAK")
def test_a_second_ctrl_c_cuts_the_wait_short() -> None:
    proc, child = _launch("deaf")
    again = threading.Event()
    threading.Timer(0.5, again.set).start()
    t0 = time.monotonic()
    command.stop_server(proc, again, grace_s=60)
    assert time.monotonic() - t0 < 15
    assert _gone(child)


def test_stop_signal_is_ctrl_break_on_windows_and_sigint_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    assert command.stop_signal() == (signal.CTRL_BREAK_EVENT if sys.platform == "win32" else signal.SIGINT)  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(signal, "CTRL_BREAK_EVENT", 1, raising=False)
    assert command.stop_signal() == 1
