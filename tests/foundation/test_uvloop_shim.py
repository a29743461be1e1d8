"""The uvloop stand-in: a selector loop (pyzmq needs add_reader) whose signal handlers work on Windows."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from shims import uvloop


def test_policy_makes_selector_loops() -> None:
    loop = uvloop.EventLoopPolicy().new_event_loop()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert hasattr(loop, "add_reader")
    finally:
        loop.close()


def test_run_returns_the_coroutine_result() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert uvloop.run(answer()) == 42


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs a POSIX signal to deliver to ourselves")
def test_signal_handler_falls_back_to_signal_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows loops raise NotImplementedError from add_signal_handler; imitate that here.
    def not_implemented(self, sig, callback, *args):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    monkeypatch.setattr(asyncio.SelectorEventLoop, "add_signal_handler", not_implemented)
    previous = signal.getsignal(signal.SIGUSR1)
    loop = uvloop.new_event_loop()
    seen: list[str] = []
    try:
        loop.add_signal_handler(signal.SIGUSR1, seen.append, "got it")
        assert signal.getsignal(signal.SIGUSR1) not in (previous, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGUSR1)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert seen == ["got it"]
    finally:
        loop.close()
        signal.signal(signal.SIGUSR1, previous)
