"""The process's hot-swapping hybrid layers and the decode-step clock that refreshes them.

SGLang's decode steps replay CUDA graphs, so no Python code of a layer runs at a step: the
refresh is driven from outside, by winport.patches.kt_hot_experts after each decode forward.
Every `interval` steps each layer's slots are refreshed (winport.hybrid.hot_swap.HotLayer), and
at most every LOG_INTERVAL_S seconds one line reports the share of routes the GPU served, the
swaps and their bytes since the last line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from winport import envs
from winport.hybrid.hot_experts import DEFAULT_DECAY, DEFAULT_INTERVAL
from winport.hybrid.hot_swap import HotLayer

LOG_INTERVAL_S = 30.0


def enabled() -> bool:
    """Whether WINPORT_HOT_EXPERTS=1 asks the hybrid layers' GPU slots to follow the routes."""
    return bool(envs.WINPORT_HOT_EXPERTS.get())


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
    layers: list[HotLayer] = field(default_factory=list)
    steps: int = 0
    _last_log: float = field(default_factory=time.monotonic)
    _logged_hits: tuple[int, int] = (0, 0)
    _logged_swaps: int = 0
    _announced: bool = False

    def add(self, layer: HotLayer) -> None:
        """Take part in the refreshes."""
        self.layers.append(layer)

    def step(self) -> None:
        """One decode forward has been enqueued: refresh every `every` steps, log now and then."""
        self.steps += 1
        if not self.layers or self.steps % self.every:
            return
        swapped = sum(len(layer.refresh()) for layer in self.layers)
        if swapped and not self._announced:
            self._announced = True  # one line at the first swap, then the periodic report
            print(f"winport: first GPU expert swaps ({swapped}) after {self.steps} decode steps", flush=True)
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            print(self.report(now), flush=True)

    def report(self, now: float | None = None) -> str:
        """The hit rate, swaps and swap bytes since the last report, as one log line."""
        now = time.monotonic() if now is None else now
        served = routed = 0
        for layer in self.layers:
            s, r = layer.hit_counts()
            served, routed = served + s, routed + r
        swaps = sum(layer.swaps_done for layer in self.layers)
        d_served, d_routed = served - self._logged_hits[0], routed - self._logged_hits[1]
        d_swaps = swaps - self._logged_swaps
        span = max(now - self._last_log, 1e-9)
        per_swap = self.layers[0].weights.expert_bytes() if self.layers else 0
        self._last_log, self._logged_hits, self._logged_swaps = now, (served, routed), swaps
        share = d_served / d_routed if d_routed else 0.0
        return (f"winport: GPU experts served {share:.1%} of {d_routed} routes over {span:.0f} s; "
                f"{d_swaps} swaps ({d_swaps / span:.2f}/s, {d_swaps * per_swap / span / 1e6:.1f} MB/s) "
                f"in {len(self.layers)} layers")


_registry: HotRegistry | None = None


def active() -> HotRegistry | None:
    """This process's registry if a layer made one, else None (nothing to refresh)."""
    return _registry


def registry() -> HotRegistry:
    """This process's registry (made on first use, with the configured interval)."""
    global _registry
    if _registry is None:
        _registry = HotRegistry(interval())
    return _registry
