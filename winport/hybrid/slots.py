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
