"""A stop request (Ctrl-C, CTRL_BREAK) ends SGLang's server in its own shutdown order, without a crash report.

Targets sglang 0.5.23 `srt/entrypoints/http_server.py` (`launch_server`, `_freeze_gc_after_server_warmup`),
`srt/managers/tokenizer_manager.py` (`TokenizerManager.sigterm_watchdog`, the shutdown order this
patch follows), `srt/utils/watchdog.py` (`SubprocessWatchdog`), the scheduler and detokenizer process
entries, and uvicorn's `Server.capture_signals` (which re-raises the signal it stopped on) and
`Server.handle_exit` (where a second SIGINT forces the exit).

Upstream, a stop signal reaches SGLang's launcher process in one of three ways, none of them quiet:
- SIGINT (and SIGBREAK on Windows): uvicorn stops the HTTP server, then re-raises the signal into
  the default handler, and the schedulers and detokenizer are killed under a live subprocess
  watchdog (`Subprocess ... crashed with exit code -9/-15. Triggering SIGQUIT`).
- A child stopped first (what a process-tree kill does): the watchdog reports the crash and raises
  SIGQUIT, whose handler sleeps 5 s "before crash diagnostics" (py-spy dumps, on by default) and
  then kills the tree: most of an 8-9 s stop, and alarming.
- SIGTERM: the tokenizer manager drains requests, polling every 5 s (and only once it has served
  a request; before that uvicorn takes SIGTERM as it takes SIGINT).
On Windows a console's Ctrl-C / CTRL_BREAK goes to every process of the group, the schedulers included.

Here the launcher's SIGINT and SIGBREAK handler runs upstream's own graceful order at once: the
subprocess watchdog is stopped (a child that exits during a stop is no crash), the schedulers get a
ShutdownReq (they leave their loop and release their resources, as on upstream's SIGTERM path) and
are waited for (upstream's bound), the remaining children (detokenizer) are killed, and the
process exits with 0. While uvicorn serves, it takes the signal first, closes the HTTP side
(in-flight requests finish), and re-raises it into this handler. Scheduler and detokenizer
processes ignore SIGINT and SIGBREAK: the launcher stops them, in order; and the launcher takes a
repeated stop signal (the console's and `winport serve`'s) as the same stop, not as uvicorn's force
exit. `winport serve` sends its child exactly one signal (winport/serve/command.py) and forces the
stop itself on a second Ctrl-C or after its grace.

Also: with --skip-server-warmup (winport's CPU default) SGLang's warm-up thread posts /freeze_gc
as soon as the app starts, often before uvicorn listens, and logs a ConnectionRefusedError
traceback; the post now waits until the port accepts connections (upstream's warm-up waits the
same way, up to 120 s).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from winport.patches._base import register, require_source

LAUNCH_TARGET = "sglang.srt.entrypoints.http_server.launch_server"
FREEZE_TARGET = "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup"
WATCHDOG_TARGET = "sglang.srt.utils.watchdog.SubprocessWatchdog._check_processes"
SCHEDULER_TARGET = "sglang.srt.managers.scheduler.configure_scheduler_process"
DETOKENIZER_TARGET = "sglang.srt.managers.detokenizer_manager.DetokenizerManager.__init__"
UVICORN_EXIT_TARGET = "uvicorn.server.Server.handle_exit"
PORT_WAIT_S = 120.0  # what upstream's warm-up waits for the server to answer
logger = logging.getLogger(__name__)

_stopping = threading.Event()


def stop_signals() -> list[int]:
    """The signals that ask this platform's launcher to stop: SIGINT, and SIGBREAK where it exists
    (Windows' CTRL_BREAK, the one console event a process group can be sent)."""
    sigs = [signal.SIGINT]
    if hasattr(signal, "SIGBREAK"):
        sigs.append(signal.SIGBREAK)
    return sigs


def stopping() -> bool:
    """Whether this process is stopping on request (children exiting now are not crashes)."""
    return _stopping.is_set()


def _tokenizer_manager() -> Any:
    from sglang.srt.entrypoints import http_server

    state = getattr(http_server, "_global_state", None)
    return getattr(state, "tokenizer_manager", None)


def stop_engine() -> None:
    """Stop this launcher's children in SGLang's graceful order (see the module docstring)."""
    from sglang.srt.managers import tokenizer_manager as tm_module
    from sglang.srt.managers.io_struct import ShutdownReq
    from sglang.srt.utils import kill_process_tree
    from sglang.srt.utils.cudacore_pyspy_dump_utils import collect_scheduler_processes

    _stopping.set()
    tm = _tokenizer_manager()
    watchdog = getattr(tm, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    if tm is not None and collect_scheduler_processes():
        try:
            tm._dispatch_to_scheduler(ShutdownReq())
        except Exception as exc:  # noqa: BLE001 - a closed channel: the kill below still stops them
            logger.warning("winport: could not ask the schedulers to stop (%r); stopping them by force", exc)
        else:
            deadline = time.monotonic() + tm_module._SCHEDULER_EXIT_TIMEOUT_SECS
            while time.monotonic() < deadline and collect_scheduler_processes():
                time.sleep(0.05)
            stragglers = [p.pid for p in collect_scheduler_processes()]
            if stragglers:
                logger.warning("winport: schedulers %s still running %d s after the stop request; killing them",
                               stragglers, tm_module._SCHEDULER_EXIT_TIMEOUT_SECS)
    kill_process_tree(os.getpid(), include_parent=False, wait_timeout=30)


def _on_stop_signal(signum: int, _frame: object) -> None:
    if _stopping.is_set():
        return  # a second Ctrl-C while the stop runs: the stop is already under way
    logger.info("winport: stopping the server (signal %s)", signal.Signals(signum).name)
    stop_engine()
    # Out of whatever the launcher was doing (loading the model, or the end of uvicorn's serve
    # after it re-raised the signal); launch_server.py's own cleanup runs on the way out.
    raise SystemExit(0)


def _around_launch_server(original: Any, *args: Any, **kwargs: Any) -> Any:
    if threading.current_thread() is threading.main_thread():
        for sig in stop_signals():
            signal.signal(sig, _on_stop_signal)
    return original(*args, **kwargs)


def _around_handle_exit(original: Any, server: Any, sig: int, frame: Any) -> Any:
    if server.should_exit and sig in stop_signals():
        # The same stop asked twice (a console's Ctrl-C/CTRL_BREAK reaches this process and `winport
        # serve`, which passes it on): no force exit, which would skip the app's shutdown and log
        # its cancellation. `winport serve` forces the stop itself on a second Ctrl-C or after its grace.
        return None
    return original(server, sig, frame)


def _around_check_processes(original: Any, *args: Any, **kwargs: Any) -> Any:
    if _stopping.is_set():
        return True  # ends the watchdog's loop: children exit because they were told to
    return original(*args, **kwargs)


def ignore_stop_signals() -> None:
    """In a scheduler or detokenizer process: leave SIGINT/SIGBREAK to the launcher, which stops this
    process in order (a console's Ctrl-C or CTRL_BREAK reaches every process of its group)."""
    if threading.current_thread() is threading.main_thread():
        for sig in stop_signals():
            signal.signal(sig, signal.SIG_IGN)


def _before_child(*args: Any, **kwargs: Any) -> None:
    ignore_stop_signals()


def wait_for_port(url: str, timeout_s: float = PORT_WAIT_S) -> bool:
    """Wait until the server at `url` accepts TCP connections; return whether it did in time."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def _before_freeze_gc(server_args: Any, *args: Any, **kwargs: Any) -> None:
    # The HTTP server starts listening only after the app's start-up (where this thread begins).
    wait_for_port(server_args.url())


def register_patch() -> None:
    """Check upstream (the order followed, the signals' routes) and register the hooks."""
    require_source("sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog",
                   "_subprocess_watchdog.stop()", "self._dispatch_to_scheduler(ShutdownReq())",
                   "_SCHEDULER_EXIT_TIMEOUT_SECS", "collect_scheduler_processes()",
                   "kill_process_tree(os.getpid(), include_parent=False")
    require_source("sglang.srt.managers.scheduler.Scheduler.handle_shutdown", "self.gracefully_exit = True")
    require_source("sglang.srt.managers.scheduler.run_scheduler_process", "configure_scheduler_process(",
                   "scheduler.run_event_loop()")
    require_source("sglang.srt.managers.detokenizer_manager.run_detokenizer_process",
                   "detokenizer_manager_class(server_args, port_args)")
    require_source(WATCHDOG_TARGET, "crashed", "signal.SIGQUIT")
    require_source(LAUNCH_TARGET, "_setup_and_run_http_server(")
    require_source("sglang.srt.entrypoints.http_server._wait_and_warmup", "_freeze_gc_after_server_warmup(server_args)",
                   "skip_server_warmup")
    require_source(FREEZE_TARGET, 'server_args.url() + "/freeze_gc"')
    # uvicorn hands the signal on once the HTTP side is down: that is how this handler runs while it serves.
    require_source("uvicorn.server.Server.capture_signals", "signal.raise_signal(captured_signal)")
    require_source(UVICORN_EXIT_TARGET, "self._captured_signals.append(sig)", "self.force_exit = True")
    register(LAUNCH_TARGET, _around_launch_server, "AROUND")
    register(UVICORN_EXIT_TARGET, _around_handle_exit, "AROUND")
    register(WATCHDOG_TARGET, _around_check_processes, "AROUND")
    register(SCHEDULER_TARGET, _before_child, "BEFORE")
    register(DETOKENIZER_TARGET, _before_child, "BEFORE")
    register(FREEZE_TARGET, _before_freeze_gc, "BEFORE")

