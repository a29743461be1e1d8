"""Shim for `uvloop`, which has no Windows build: an asyncio selector loop stands in.

SGLang 0.5.23 imports uvloop unconditionally (entrypoints/engine.py, http_server.py,
managers/tokenizer_manager.py) and installs `uvloop.EventLoopPolicy()` at import. Two things the
stand-in loop must give SGLang that Windows' default (Proactor) loop lacks:
- `add_reader`/`add_writer`: pyzmq's asyncio sockets need them (without tornado installed pyzmq
  refuses the Proactor loop), so the loop is a SelectorEventLoop;
- `add_signal_handler`: SGLang's tokenizer manager registers SIGTERM on the loop; Windows loops
  raise NotImplementedError, so the handler is installed with signal.signal and scheduled onto the
  loop thread-safely, which is what the Unix loop does internally.
On Linux the same classes work; asyncio's own loop already does both there.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shims._missing import missing_getattr

T = TypeVar("T")


class Loop(asyncio.SelectorEventLoop):
    """Selector event loop whose signal handlers also work on Windows."""

    def add_signal_handler(self, sig: int, callback: Callable[..., object], *args: Any) -> None:
        """Replaces uvloop.Loop.add_signal_handler: run callback(*args) on this loop when sig arrives."""
        try:
            super().add_signal_handler(sig, callback, *args)
            return
        except NotImplementedError:
            pass
        signal.signal(sig, lambda _signum, _frame: self.call_soon_threadsafe(callback, *args))

    def remove_signal_handler(self, sig: int) -> bool:
        """Replaces uvloop.Loop.remove_signal_handler."""
        try:
            return super().remove_signal_handler(sig)
        except NotImplementedError:
            signal.signal(sig, signal.SIG_DFL)
            return True


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type]
    """Replaces uvloop.EventLoopPolicy: new loops are `Loop` (selector-based, signals on Windows)."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """A new `Loop`."""
        return Loop()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """Replaces uvloop.new_event_loop."""
    return Loop()


def install() -> None:
    """Replaces uvloop.install: make `EventLoopPolicy` the process-wide policy."""
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None, **_: Any) -> T:
    """Replaces uvloop.run: run main on a new `Loop`."""
    if sys.version_info >= (3, 12):
        with asyncio.Runner(debug=debug, loop_factory=Loop) as runner:
            return runner.run(main)
    loop = Loop()
    try:
        asyncio.set_event_loop(loop)
        if debug is not None:
            loop.set_debug(debug)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


__getattr__ = missing_getattr("uvloop", "uvloop")
