"""Which experts of a layer deserve its GPU slots: decayed route counts and the swaps they call for.

The counts live on the router's device and are updated in place by every forward (a decay and an
index_add over the step's routed ids: fixed shapes, no host sync, so the update is captured in
SGLang's decode CUDA graphs like the rest of the layer and runs at every replay). Every `interval`
steps the host reads them and `plan_swaps` names the few swaps worth making: an expert outside
the GPU set replaces the coldest resident one only when its count beats that one's by `margin`
(hysteresis: two experts of equal heat never trade places back and forth), at most `max_swaps` a
refresh, so the copy traffic stays bounded.

A swap is made in two steps so that no step ever reads a half-copied slot (SlotMap.retire, then
SlotMap.admit once the copy is done): first the slot's old expert goes back to the CPU (its id
maps to -1 and kt-kernel's mask turns it on again), then the new expert's weights are copied into
the slot, and only when that copy has completed is the new expert mapped to the slot. In between
the CPU serves both; kt-kernel holds every expert, so nothing is ever reloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Interval, decay and margin from scripts/bench/hot_experts_sweep.py (scripts/bench/RESULTS.md,
# 2026-12-04): on a synthetic V4.1-Flash stream (87 of 384 slots, the hot set shifting every 3,000
# tokens) 16 / 0.995 / 2.0 served 83.0% of routes (0.970 of the oracle) with 0.094 swaps a token,
# where the former 32 / 0.99 / 1.25 served 82.0% with 0.125 (every refresh made its 4 swaps: at
# a 100-step window the counts near the slot boundary are noise that a margin of 1.25 lets through).
DEFAULT_DECAY = 0.995  # per step: a route 138 steps old counts half
DEFAULT_INTERVAL = 16  # decode steps between refreshes
DEFAULT_MARGIN = 2.0  # a newcomer must be this much hotter than the resident it replaces
DEFAULT_MAX_SWAPS = 4  # a refresh's copy traffic: 4 x 18.8 MB of MXFP4 a layer


class RouteCounts:
    """Decayed route counts of one layer's experts ([E] float32 on the router's device)."""

    def __init__(self, num_experts: int, device: torch.device | str, decay: float = DEFAULT_DECAY) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"route-count decay {decay}: must be in (0, 1]")
        self.num_experts = num_experts
        self.decay = decay
        # One extra bin for the router's "no expert" id -1, dropped when read.
        self.counts = torch.zeros(num_experts + 1, dtype=torch.float32, device=device)

    def update(self, topk_ids: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """Fold one step's routed logical ids ([T, k], -1 = none) into the counts, in place.

        `weight` (float32 [1] on the counts' device, 1 or 0) says whether this step counts at all,
        read when the step runs: a captured graph replays the update with whatever it holds then,
        and a step that does not count (a graph's warm-up or capture) neither adds nor decays.
        """
        ids = torch.remainder(topk_ids.reshape(-1).long(), self.num_experts + 1)
        # Fresh tensors each call, never cached ones: a tensor cached across the captures of
        # several decode graphs would be freed into their shared pool and reused under them.
        if weight is None:
            self.counts.mul_(self.decay)
            ones = torch.ones(ids.shape[0], dtype=torch.float32, device=ids.device)
        else:
            self.counts.mul_(1.0 - weight * (1.0 - self.decay))
            ones = weight.expand(ids.shape[0]).contiguous()
        self.counts.index_add_(0, ids, ones)

    def read(self) -> list[float]:
        """The counts on the host (one device-to-host copy), expert 0 first."""
        return self.counts[: self.num_experts].tolist()


@dataclass(frozen=True)
class Swap:
    """Slot `slot` leaves expert `out` (back to the CPU) for expert `into`."""

    slot: int
    out: int
    into: int


def plan_swaps(counts: list[float], resident: list[int], margin: float = DEFAULT_MARGIN,
               max_swaps: int = DEFAULT_MAX_SWAPS) -> list[Swap]:
    """The swaps that bring the hottest experts onto the GPU: `resident[slot]` is the expert in
    each slot (-1 for an empty one); the hottest non-resident expert takes the coldest slot while
    it is more than `margin` times as hot (an empty slot takes any expert that was routed)."""
    if margin < 1.0:
        raise ValueError(f"swap margin {margin}: below 1 two experts would trade places forever")
    on_gpu = {e for e in resident if e >= 0}
    waiting = sorted((e for e in range(len(counts)) if e not in on_gpu), key=lambda e: -counts[e])
    slots = sorted(range(len(resident)), key=lambda s: -1.0 if resident[s] < 0 else counts[resident[s]])
    swaps: list[Swap] = []
    for newcomer, slot in zip(waiting, slots, strict=False):  # fewer newcomers than slots, or fewer slots
        if len(swaps) >= max_swaps:
            break
        old = resident[slot]
        heat = counts[newcomer]
        if old < 0 and heat <= 0.0 or old >= 0 and heat <= margin * counts[old]:
            break  # both lists are ordered: no later pair does better
        swaps.append(Swap(slot, old, newcomer))
    return swaps
