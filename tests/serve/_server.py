"""Start, watch and stop a real `winport serve` for the live tests (one implementation for all).

The server runs exactly as a user runs it (`python -m winport serve ...`) under
WINPORT_EMULATE_WINDOWS=1, with the test cache, and without the caller's other WINPORT_/SGLANG_
settings (WINPORT_CUDA_GRAPH and WINPORT_GPU_MXFP4_MOE pass through, for the GPU runs of
scripts/gpu/final_check.sh; before 2026-11-30 the second did not, so that script's "MXFP4 MoE"
part ran the default FP8 path).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.helpers import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "winport-test"
START_TIMEOUT_S = 900  # a cold CI machine builds the demo model and imports SGLang first
READY = "winport serve: ready at"


@dataclass
class Server:
    """A running `winport serve` process and what it printed."""

    proc: subprocess.Popen[str]
    url: str
    argv: list[str]
    output: list[str] = field(default_factory=list)

    def text(self) -> str:
        """Everything printed so far."""
        return "".join(self.output)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The caller's settings that choose what a GPU run exercises.
PASSED_THROUGH = ("WINPORT_CUDA_GRAPH", "WINPORT_GPU_MXFP4_MOE", "WINPORT_HOT_EXPERTS", "WINPORT_HOT_EXPERTS_INTERVAL",
                  "WINPORT_HOT_EXPERTS_DECAY")


def start(args: list[str], env: dict[str, str] | None = None, command: tuple[str, ...] = ("serve",)) -> Server:
    """Start `winport serve --port <free> *args` (or another `command` that serves, such as
    `experts record`); `env` adds to the environment described above."""
    port = free_port()
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("WINPORT_", "SGLANG_")) or k in PASSED_THROUGH}
    full.update({"WINPORT_EMULATE_WINDOWS": "1", "WINPORT_CACHE": str(CACHE), "PYTHONUNBUFFERED": "1"})
    full.update(env or {})
    argv = [*command, "--port", str(port), *args]
    proc = subprocess.Popen([sys.executable, "-m", "winport", *argv], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    srv = Server(proc, f"http://127.0.0.1:{port}", argv)
    threading.Thread(target=lambda: srv.output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return srv


def record_experts(args: list[str]) -> str:
    """Run `winport experts record *args` to its end and return what it printed (the test fails,
    showing it, unless it exits 0)."""
    srv = start(args, command=("experts", "record"))
    try:
        rc = srv.proc.wait(START_TIMEOUT_S)
    finally:
        stop(srv)
    assert rc == 0, srv.text()[-6000:]
    return srv.text()


def wait_ready(srv: Server, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait for the ready line; fail the test with the server's output if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while READY not in srv.text():
        if srv.proc.poll() is not None or time.monotonic() > deadline:
            srv.proc.kill()
            pytest.fail(f"winport {' '.join(srv.argv)} did not become ready (exit {srv.proc.poll()}):\n"
                        f"{srv.text()[-6000:]}")
        time.sleep(1)


def listeners(srv: Server) -> list[tuple[int, str, str, str, int]]:
    """Every listening TCP socket and bound UDP socket of the server's whole process tree, as
    (pid, process name, "tcp"/"udp", address, port)."""
    import psutil

    root = psutil.Process(srv.proc.pid)
    found = []
    for p in [root, *root.children(recursive=True)]:
        try:
            name = p.name()
            for c in p.net_connections(kind="inet"):
                if c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN:
                    found.append((p.pid, name, "tcp", c.laddr.ip, c.laddr.port))
                elif c.type == socket.SOCK_DGRAM and c.laddr:
                    found.append((p.pid, name, "udp", c.laddr.ip, c.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return found


def stop(srv: Server) -> None:
    """Ctrl-C the server if it still runs (as a user would), then kill it after a minute."""
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGINT)
        try:
            srv.proc.wait(60)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
    # The GPU scripts collect each server's output (the client side alone cannot say why a request
    # failed): WINPORT_TEST_SERVER_LOG_DIR names the folder.
    log_dir = os.environ.get("WINPORT_TEST_SERVER_LOG_DIR")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        name = f"server-{srv.url.rsplit(':', 1)[1]}.log"
        with open(os.path.join(log_dir, name), "w", encoding="utf-8") as f:
            f.write(srv.text())


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[tuple[Server, ...]]:
    """Wait until every one of the started `servers` is ready, hand them over, and stop them all after."""
    try:
        for srv in servers:
            wait_ready(srv)
        yield servers
    finally:
        for srv in servers:
            stop(srv)


def post(srv: Server, path: str, body: bytes, key: str | None = None, timeout_s: float = 300) -> tuple[int, str]:
    """POST a JSON `body` to `path` (with `key` as the bearer token if given): (HTTP status, response text)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(srv.url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def generate(srv: Server, body: dict, timeout_s: float = 600) -> dict:
    """SGLang's native /generate: the decoded JSON answer (the test fails on an HTTP error)."""
    status, text = post(srv, "/generate", json.dumps(body).encode(), timeout_s=timeout_s)
    assert status == 200, f"/generate answered HTTP {status}: {text[:2000]}"
    return json.loads(text)


def assert_ctrl_c_stops_all(srv: Server, at_least: int, expected: str) -> None:
    """Ctrl-C `srv` and check that it exits 0, that each of its >= `at_least` processes (`expected`
    names them) is gone and that it says it stopped."""
    import psutil

    root = psutil.Process(srv.proc.pid)
    family = [root, *root.children(recursive=True)]
    assert len(family) >= at_least, f"expected {expected}"
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(120) == 0
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "winport serve: stopped" in srv.text()
