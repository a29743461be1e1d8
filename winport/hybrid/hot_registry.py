"""The process's hot-swapping hybrid layers and the decode-step clock that refreshes them.

SGLang's decode steps replay CUDA graphs, so no Python code of a layer runs at a step: the
refresh is driven from outside, by winport.patches.kt_hot_experts around each forward. Before a
forward the registry fills the layers' step-kind tensor (prefill or decode, read by the captured
counters when the step runs) and after it puts back "uncounted", so SGLang's graph warm-ups and
captures, which run outside a step, count as neither. Every `interval` decode steps each layer's
slots are refreshed (winport.hybrid.hot_swap.HotLayer), and after every decode step the swaps
in flight on CUDA move on (HotLayer.advance, which never waits for the GPU); at most every
LOG_INTERVAL_S seconds one line reports the share of routes the GPU served in decode and in prefill, the swaps and their
bytes since the last line, and with `--enable-metrics` the same totals go to SGLang's /metrics
(winport.hybrid.hot_metrics). With `--record-experts` the same clock drives the route record
(winport.hybrid.route_record), written when the scheduler goes idle after a counted forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from winport import envs
from winport.hybrid.hot_experts import DEFAULT_DECAY, DEFAULT_INTERVAL
from winport.hybrid.hot_metrics import HotMetrics
from winport.hybrid.hot_swap import DECODE, PREFILL, STEP_KINDS, UNCOUNTED, HotLayer, step_kind_tensor
from winport.hybrid.route_record import RouteRecorder

LOG_INTERVAL_S = 30.0


def enabled(cuda: bool | None = None) -> bool:
    """Whether the hybrid layers' GPU slots follow the routes: WINPORT_HOT_EXPERTS where set, else
    on with CUDA (`cuda`, default: whether torch sees a GPU) and off on the CPU, whose server has
    no GPU slots unless asked for them."""
    value = envs.WINPORT_HOT_EXPERTS.get()
    if value is None:
        return torch.cuda.is_available() if cuda is None else cuda
    return bool(value)


def interval() -> int:
    """Decode steps between refreshes (WINPORT_HOT_EXPERTS_INTERVAL, else the measured default)."""
    value = envs.WINPORT_HOT_EXPERTS_INTERVAL.get()
    n = DEFAULT_INTERVAL if value is None else int(value)
    if n < 1:
        raise ValueError(f"{envs.WINPORT_HOT_EXPERTS_INTERVAL.name}={n}: must be at least 1 decode step")
    return n


def decay() -> float:
    """Per-step decay of the route counts (WINPORT_HOT_EXPERTS_DECAY, else the default)."""
    value = envs.WINPORT_HOT_EXPERTS_DECAY.get()
    return DEFAULT_DECAY if value is None else float(value)


@dataclass
class HotRegistry:
    """The hot-swapping layers of this process, with their step clock and log counters."""

    every: int
    metrics: HotMetrics | None = None
    recorder: RouteRecorder | None = None
    layers: list[HotLayer] = field(default_factory=list)
    steps: int = 0
    _kinds: dict[str, torch.Tensor] = field(default_factory=dict)
    _last_log: float = field(default_factory=time.monotonic)
    _logged_hits: dict[str, tuple[int, int]] = field(default_factory=lambda: {k: (0, 0) for k in STEP_KINDS})
    _logged_swaps: int = 0
    _announced: bool = False

    def step_kind(self, device: torch.device | str) -> torch.Tensor:
        """The step-kind tensor the layers on `device` share (filled by `begin`, `end`)."""
        key = str(torch.device(device))
        if key not in self._kinds:
            self._kinds[key] = step_kind_tensor(device)
        return self._kinds[key]

    def add(self, layer: HotLayer) -> None:
        """Take part in the refreshes (the layer must count by this registry's step-kind tensor)."""
        if layer.step_kind is not self.step_kind(layer.step_kind.device):
            raise ValueError("a hot layer must count by its registry's step-kind tensor (HotRegistry.step_kind)")
        self.layers.append(layer)

    def begin(self, decode: bool) -> None:
        """A forward is about to be enqueued: its routes count as decode or as prefill."""
        for t in self._kinds.values():
            t.fill_(DECODE if decode else PREFILL)
        if self.recorder is not None:
            self.recorder.dirty = True

    def end(self) -> None:
        """The forward is enqueued: later forwards count only once `begin` says what they are."""
        for t in self._kinds.values():
            t.fill_(UNCOUNTED)

    def idle(self) -> None:
        """The scheduler has nothing to run: write the route record if a counted forward ran since."""
        if self.recorder is not None:
            self.recorder.flush()

    def step(self) -> None:
        """One decode forward has been enqueued: move swaps in flight on (CUDA), refresh every
        `every` steps, log now and then."""
        self.steps += 1
        if not self.layers:
            return
        swapped = sum(len(layer.advance()) for layer in self.layers)
        refresh = self.steps % self.every == 0
        if refresh:
            swapped += sum(len(layer.refresh()) for layer in self.layers)
        if swapped and not self._announced:
            self._announced = True  # one line at the first swap, then the periodic report
            print(f"winport: first GPU expert swaps ({swapped}) after {self.steps} decode steps", flush=True)
        if not refresh:
            return
        if self.metrics is not None:
            self.metrics.publish(self.hit_counts(), self.swaps_done(), self.bytes_per_swap())
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            print(self.report(now), flush=True)

    def hit_counts(self) -> dict[str, tuple[int, int]]:
        """Per step kind, (routes the GPU served, routes) of all layers since start."""
        total = {kind: (0, 0) for kind in STEP_KINDS}
        for layer in self.layers:
            for kind, (s, r) in layer.hit_counts().items():
                total[kind] = (total[kind][0] + s, total[kind][1] + r)
        return total

    def swaps_done(self) -> int:
        """Swaps made by all layers since start."""
        return sum(layer.swaps_done for layer in self.layers)

    def bytes_per_swap(self) -> int:
        """Bytes one swap writes into a slot (the layers share one format)."""
        return self.layers[0].weights.expert_bytes() if self.layers else 0

    def report(self, now: float | None = None) -> str:
        """The hit rates, swaps and swap bytes since the last report, as one log line."""
        now = time.monotonic() if now is None else now
        hits, swaps = self.hit_counts(), self.swaps_done()
        span = max(now - self._last_log, 1e-9)
        shares = []
        for kind in STEP_KINDS:
            d_served = hits[kind][0] - self._logged_hits[kind][0]
            d_routed = hits[kind][1] - self._logged_hits[kind][1]
            share = d_served / d_routed if d_routed else 0.0
            shares.append(f"{share:.1%} of {d_routed} {kind} routes")
        d_swaps = swaps - self._logged_swaps
        self._last_log, self._logged_hits, self._logged_swaps = now, hits, swaps
        return (f"winport: GPU experts served {' and '.join(shares)} over {span:.0f} s; "
                f"{d_swaps} swaps ({d_swaps / span:.2f}/s, {d_swaps * self.bytes_per_swap() / span / 1e6:.1f} MB/s) "
                f"in {len(self.layers)} layers")


_registry: HotRegistry | None = None


def active() -> HotRegistry | None:
    """This process's registry if a layer made one, else None (nothing to refresh)."""
    return _registry


def registry() -> HotRegistry:
    """This process's registry (made on first use, with the configured interval)."""
    global _registry
    if _registry is None:
        from winport.hybrid import hot_metrics

        _registry = HotRegistry(interval(), hot_metrics.for_server())
    return _registry
