"""Hot-expert swaps off the decode path: points on the decode stream, slot writes on a side stream.

A swap on CUDA (winport.hybrid.hot_swap.HotLayer with a `SwapStreams`) never makes the scheduler
wait for the GPU. Each of its steps only enqueues work or asks whether earlier work has finished:
- the route counts go to pinned host memory with a non-blocking copy (`snapshot`), read once its
  marker has passed, so planning reads counts a step or two old instead of stalling a step;
- the slots' old experts are retired (on the decode stream), then `start` runs the writes of the
  new experts in a worker thread on a side stream that first waits for the retirement's marker:
  no step enqueued before can still read a slot the side stream writes;
- the new experts are mapped to their slots (on the decode stream) only once the side stream's
  writes have completed, and kt-kernel's mask follows once the decode stream has passed the
  mapping (SlotMap.map_slot, SlotMap.hand_to_gpu).

`SwapStreams` is the interface; `CudaSwapStreams` implements it with CUDA events, one side stream
and one worker thread per device. The tests drive HotLayer with a hand-cranked implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch


class Marker(Protocol):
    """A point in a stream's work: `query()` is True once the GPU has passed it (no waiting)."""

    def query(self) -> bool: ...


class SwapStreams(Protocol):
    """What HotLayer needs from the device to swap without blocking the decode stream."""

    def mark(self) -> Marker:
        """A marker at the current end of the decode stream's work."""
        ...

    def snapshot(self, t: torch.Tensor) -> tuple[torch.Tensor, Marker]:
        """A host copy of `t` as the decode stream will hold it, readable once the marker has passed."""
        ...

    def start(self, after: Marker, job: Callable[[], None]) -> Future[None]:
        """Run `job` (slot writes) on the side stream once the decode stream has passed `after`; the
        future is done once the job's GPU work has completed (or holds the job's exception)."""
        ...


class CudaSwapStreams:
    """`SwapStreams` on one CUDA device: events on its current stream, a side stream, one worker thread."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.side = torch.cuda.Stream(self.device)
        # One thread: the swaps of all layers are written one after another, which bounds the copy
        # traffic that competes with decode and keeps the host staging memory to one expert.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="winport-expert-swap")

    def mark(self) -> torch.cuda.Event:
        """An event recorded on the device's current stream."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def snapshot(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        """`t` copied into fresh pinned host memory behind the current stream's work."""
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host, self.mark()

    def start(self, after: Marker, job: Callable[[], None]) -> Future[None]:
        """`job` on the side stream behind `after`, in the worker thread."""
        if not isinstance(after, torch.cuda.Event):
            raise TypeError(f"a CUDA swap waits for a torch.cuda.Event, not {type(after).__name__}")

        def run() -> None:
            with torch.cuda.device(self.device), torch.cuda.stream(self.side):
                self.side.wait_event(after)
                job()
                # The job's temporaries and the host memory its copies read are released when it
                # returns; the future reports done only once the GPU has finished with them.
                self.side.synchronize()

        return self.worker.submit(run)


_streams: dict[str, CudaSwapStreams] = {}


def cuda_swap_streams(device: torch.device | str) -> CudaSwapStreams:
    """The process's CudaSwapStreams for `device` (made on first use; the layers of a device share it)."""
    key = str(torch.device(device))
    if key not in _streams:
        _streams[key] = CudaSwapStreams(device)
    return _streams[key]
