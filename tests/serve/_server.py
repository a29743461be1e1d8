"""Start, watch and stop a real `winport serve` for the live tests (one implementation for all).

The server runs exactly as a user runs it (`python -m winport serve ...`) under
WINPORT_EMULATE_WINDOWS=1, with the test cache, and without the caller's other WINPORT_/SGLANG_
settings (WINPORT_CUDA_GRAPH and WINPORT_GPU_MXFP4_MOE pass through, for the GPU runs of
scripts/gpu/final_check.sh; before 2026-11-30 the second did not, so that script's "MXFP4 MoE"
part ran the default FP8 path).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
PASSED_THROUGH = ("WINPORT_CUDA_GRAPH", "WINPORT_GPU_MXFP4_MOE")


def start(args: list[str], env: dict[str, str] | None = None) -> Server:
    """Start `winport serve --port <free> *args`; `env` adds to the environment described above."""
    port = free_port()
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("WINPORT_", "SGLANG_")) or k in PASSED_THROUGH}
    full.update({"WINPORT_EMULATE_WINDOWS": "1", "WINPORT_CACHE": str(CACHE), "PYTHONUNBUFFERED": "1"})
    full.update(env or {})
    argv = ["serve", "--port", str(port), *args]
    proc = subprocess.Popen([sys.executable, "-m", "winport", *argv], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    srv = Server(proc, f"http://127.0.0.1:{port}", argv)
    threading.Thread(target=lambda: srv.output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return srv


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
