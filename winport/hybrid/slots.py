"""Which routed experts of one layer the GPU serves, and the id remap that follows from it.

Two tensors describe the placement, both changed in place only (never rebound), because others
hold their pointers: kt-kernel's C++ reads `mask` (bool [E]) at every forward, and a captured CUDA
graph reads `slot_of` (int32 [E + 1], on the GPU) at every replay. `slot_of[e]` is expert e's row in
the GPU method's weight tensors or -1 (CPU); the extra last entry is -1, so the router's "no
expert" id -1 gathers to -1 as well (torch.remainder maps -1 to E), with no branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SlotMap:
    """GPU placement of one MoE layer's experts: `num_slots` GPU rows for `num_experts` experts."""

    def __init__(self, mask: torch.Tensor, num_slots: int, device: torch.device | str) -> None:
        if mask.dtype != torch.bool or mask.dim() != 1:
            raise ValueError(f"gpu_experts_mask must be a bool [E] tensor, got {mask.dtype} {tuple(mask.shape)}")
        self.num_experts = int(mask.shape[0])
        if not 0 <= num_slots <= self.num_experts:
            raise ValueError(f"{num_slots} GPU expert slots for {self.num_experts} experts")
        self.num_slots = num_slots
        self.mask = mask
        self.slot_of = torch.full((self.num_experts + 1,), -1, dtype=torch.int32, device=device)
        self.host_slot_of: list[int] = [-1] * self.num_experts
        self.place(range(num_slots))

    def place(self, experts: Sequence[int]) -> None:
        """Put `experts` (logical ids, at most num_slots) in GPU slots 0, 1, ... in that order.

        Only the map changes: the caller moves the weights into those slots (at load time the
        weight loader does it from host_slot_of).
        """
        experts = [int(e) for e in experts]
        if len(experts) > self.num_slots or len(set(experts)) != len(experts):
            raise ValueError(f"placement {experts}: at most {self.num_slots} distinct experts")
        if any(not 0 <= e < self.num_experts for e in experts):
            raise ValueError(f"placement {experts}: expert ids must be in [0, {self.num_experts})")
        host = [-1] * self.num_experts
        for slot, e in enumerate(experts):
            host[e] = slot
        self.host_slot_of = host
        self.slot_of.copy_(torch.tensor([*host, -1], dtype=torch.int32))
        self.mask.copy_(torch.tensor([s >= 0 for s in host], dtype=torch.bool))

    def resident(self) -> list[int]:
        """The expert in each slot (-1 for an empty one), slot 0 first."""
        out = [-1] * self.num_slots
        for e, slot in enumerate(self.host_slot_of):
            if slot >= 0:
                out[slot] = e
        return out

    def retire(self, slot: int) -> int:
        """Hand slot `slot`'s expert back to the CPU (winport.hybrid.hot_experts); returns it, or -1.

        kt-kernel's mask first (the CPU may serve it from now on), then the map, which a step
        already enqueued on the stream still reads as before: that step's GPU side serves it.
        """
        old = self.resident()[slot]
        if old >= 0:
            self.mask[old] = False
            self.host_slot_of[old] = -1
            self.slot_of[old] = -1
        return old

    def admit(self, slot: int, expert: int) -> None:
        """Map `expert` to the empty slot `slot`, whose weights the caller has finished copying.

        The map first, then (once the stream has passed that write) kt-kernel's mask: a step still
        in flight computes the expert on the CPU, as its ids say; no step reads the slot before.
        This waits for the stream; HotLayer's CUDA swaps call the two halves apart instead.
        """
        self.map_slot(slot, expert)
        if self.slot_of.is_cuda:
            torch.cuda.current_stream(self.slot_of.device).synchronize()
        self.hand_to_gpu(expert)

    def map_slot(self, slot: int, expert: int) -> None:
        """The first half of `admit`: steps enqueued from now on send `expert`'s routes to slot `slot`.

        kt-kernel's mask still says CPU: call `hand_to_gpu` once the stream has passed this write.
        """
        if not 0 <= slot < self.num_slots or self.resident()[slot] >= 0:
            raise ValueError(f"slot {slot} is not an empty slot of {self.num_slots}")
        if self.host_slot_of[expert] >= 0:
            raise ValueError(f"expert {expert} already sits in slot {self.host_slot_of[expert]}")
        self.host_slot_of[expert] = slot
        self.slot_of[expert] = slot

    def hand_to_gpu(self, expert: int) -> None:
        """The second half of `admit`: kt-kernel's mask marks `expert` as the GPU's.

        Only safe once no step enqueued before `map_slot` is left to run: such a step still gives
        kt-kernel the expert's id, and a masked expert would then be served by neither side.
        """
        if self.host_slot_of[expert] < 0:
            raise ValueError(f"expert {expert} is in no GPU slot")
        self.mask[expert] = True

    def split_(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Remap `topk_ids` in place to GPU slots (-1 where the CPU serves the expert) and return
        the CPU's ids: the logical id where the CPU serves it, -1 where the GPU does (int64).

        A gather through slot_of: no host sync, no data-dependent shape (CUDA-graph safe).
        """
        logical = topk_ids.long()
        slots = self.slot_of[torch.remainder(logical, self.num_experts + 1)]
        cpu_ids = torch.where(slots >= 0, torch.full_like(logical, -1), logical)
        topk_ids.copy_(slots)
        return cpu_ids
