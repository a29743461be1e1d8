"""The hot experts' counters in SGLang's /metrics (Prometheus), when the server exposes metrics.

With `--enable-metrics` SGLang sets PROMETHEUS_MULTIPROC_DIR before it starts the scheduler
processes and its HTTP server's /metrics reads every process's counters from that folder
(sglang/srt/utils/common.py set_prometheus_multiproc_dir, add_prometheus_middleware). Counters made
in the scheduler process are therefore served with SGLang's own; without the variable there is no
/metrics to feed and nothing is made.

    winport:expert_routes_total{step="prefill"|"decode"}      routes of the hot-swapping layers
    winport:expert_routes_gpu_total{step="prefill"|"decode"}  of them, served by a GPU slot
    winport:expert_swaps_total                                experts moved into GPU slots
    winport:expert_swap_bytes_total                           bytes those moves wrote

The share of routes the GPU serves is rate(routes_gpu) / rate(routes).
"""

from __future__ import annotations

from typing import Any

from winport import envs
from winport.hybrid.hot_swap import STEP_KINDS


class HotMetrics:
    """Monotonic counters fed from the registry's running totals (only the growth is added)."""

    def __init__(self, registry: Any = None) -> None:
        """`registry`: a prometheus_client CollectorRegistry (default: the process's own)."""
        from prometheus_client import REGISTRY, Counter

        reg = REGISTRY if registry is None else registry
        self.routes = Counter("winport:expert_routes", "Routes of the hot-swapping MoE layers, by step kind.",
                              ["step"], registry=reg)
        self.routes_gpu = Counter("winport:expert_routes_gpu", "Routes served by a GPU expert slot, by step kind.",
                                  ["step"], registry=reg)
        self.swaps = Counter("winport:expert_swaps", "Experts moved into GPU slots.", registry=reg)
        self.swap_bytes = Counter("winport:expert_swap_bytes", "Bytes written into GPU slots by swaps.", registry=reg)
        self._seen: dict[str, tuple[int, int]] = {kind: (0, 0) for kind in STEP_KINDS}
        self._seen_swaps = 0

    def publish(self, hits: dict[str, tuple[int, int]], swaps: int, bytes_per_swap: int) -> None:
        """Bring the counters up to the totals: `hits` per step kind (GPU-served, all), `swaps` in all."""
        for kind, (served, routed) in hits.items():
            old_served, old_routed = self._seen[kind]
            self.routes_gpu.labels(step=kind).inc(served - old_served)
            self.routes.labels(step=kind).inc(routed - old_routed)
            self._seen[kind] = (served, routed)
        self.swaps.inc(swaps - self._seen_swaps)
        self.swap_bytes.inc((swaps - self._seen_swaps) * bytes_per_swap)
        self._seen_swaps = swaps


def for_server() -> HotMetrics | None:
    """Counters for SGLang's /metrics when the server exposes metrics (`--enable-metrics`), else None."""
    if not envs.PROMETHEUS_MULTIPROC_DIR.raw():
        return None
    return HotMetrics()
