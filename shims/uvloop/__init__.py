"""Shim for `uvloop`, which has no Windows build: asyncio's own default loop stands in.

SGLang 0.5.23 imports uvloop unconditionally (entrypoints/engine.py, http_server.py,
managers/tokenizer_manager.py) to set the event-loop policy and to run the server. On Windows
the default policy gives the Proactor loop, which is what pyzmq's asyncio support and uvicorn use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from shims._missing import missing_getattr

T = TypeVar("T")

EventLoopPolicy = asyncio.DefaultEventLoopPolicy
Loop = asyncio.AbstractEventLoop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """Replaces uvloop.new_event_loop: a new loop of asyncio's default kind."""
    return asyncio.new_event_loop()


def install() -> None:
    """Replaces uvloop.install: keeps asyncio's default policy (nothing to install)."""
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None, **_: Any) -> T:
    """Replaces uvloop.run: asyncio.run on the default loop."""
    return asyncio.run(main, debug=debug)


__getattr__ = missing_getattr("uvloop", "uvloop")
