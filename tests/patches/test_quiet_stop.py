"""winport.patches.quiet_stop: the launcher's stop signal stops its children in order and exits 0."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from tests.helpers import run_python


def test_stop_signals_are_sigint_and_sigbreak_where_it_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import quiet_stop

    assert quiet_stop.stop_signals() == [signal.SIGINT]
    monkeypatch.setattr(signal, "SIGBREAK", 21, raising=False)
    assert quiet_stop.stop_signals() == [signal.SIGINT, 21]


def test_children_ignore_the_stop_signal() -> None:
    from winport.patches import quiet_stop

    before = signal.getsignal(signal.SIGINT)
    try:
        quiet_stop.ignore_stop_signals()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_watchdog_stands_down_once_a_stop_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import quiet_stop

    calls: list[int] = []
    monkeypatch.setattr(quiet_stop, "_stopping", threading.Event())
    assert quiet_stop._around_check_processes(lambda *a: calls.append(1) or False, object()) is False
    quiet_stop._stopping.set()
    assert quiet_stop._around_check_processes(lambda *a: calls.append(1) or False, object()) is True
    assert calls == [1], "while stopping, the liveness check (and its crash report) must not run"


def test_wait_for_port_waits_for_the_listener() -> None:
    from winport.patches.quiet_stop import wait_for_port

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    t0 = time.monotonic()
    assert wait_for_port(f"http://127.0.0.1:{port}", timeout_s=0.5) is False
    assert time.monotonic() - t0 >= 0.5

    server = socket.socket()

    def listen_later() -> None:
        time.sleep(0.4)
        server.bind(("127.0.0.1", port))
        server.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        t0 = time.monotonic()
        assert wait_for_port(f"http://127.0.0.1:{port}", timeout_s=30) is True
        assert 0.3 < time.monotonic() - t0 < 10
    finally:
        thread.join()
        server.close()


# A launcher that is still loading (no tokenizer manager yet) with one child, stopped by SIGINT.
LAUNCHER = """
import os, signal, subprocess, sys, time
from winport.patches import quiet_stop
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("child", child.pid, flush=True)
def launch():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
    print("not stopped", flush=True)
try:
    quiet_stop._around_launch_server(launch)
finally:
    print("child exit", child.poll(), flush=True)
"""


def test_sigint_while_loading_kills_the_children_and_exits_0() -> None:
    proc = run_python(LAUNCHER, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not stopped" not in proc.stdout  # the handler interrupted the "loading", it did not wait
    assert "child exit -9" in proc.stdout, proc.stdout  # killed by the stop, not left running
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_targets_still_look_as_expected() -> None:
    proc = run_python("from winport.patches import quiet_stop as p; p.register_patch(); print('ok')")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_a_repeated_stop_signal_is_the_same_stop_not_uvicorns_force_exit() -> None:
    import uvicorn

    from winport.patches import quiet_stop

    server = uvicorn.Server(uvicorn.Config(app=None))
    quiet_stop._around_handle_exit(uvicorn.Server.handle_exit, server, signal.SIGINT, None)
    assert server.should_exit and not server.force_exit
    quiet_stop._around_handle_exit(uvicorn.Server.handle_exit, server, signal.SIGINT, None)
    assert not server.force_exit, "a second SIGINT would skip the app's shutdown"
    assert server._captured_signals == [signal.SIGINT], "the stop is re-raised into the launcher's handler once"
    uvicorn.Server.handle_exit(server, signal.SIGINT, None)  # the control: stock uvicorn forces
    assert server.force_exit
