"""One layer's GPU slots following its routes: counting in the forward, swapping at a refresh.

`HotLayer` joins the pieces of winport.hybrid.hot_experts to one layer's SlotMap and GPU-side
weights:
- `observe` runs inside the layer's forward, before and after the slot remap: it folds the step's
  logical ids into the decayed counts and adds the routes the GPU served and all routes to two
  counters. Fixed shapes, no host sync: it is captured in decode CUDA graphs with the layer.
- `refresh` runs on the host between steps (every `interval` of them): it reads the counts, plans
  the swaps, and makes each in the order SlotMap documents (retire, write the slot, admit), with
  the new expert's weights from `read_expert` (host memory: the checkpoint's memory map) written
  into the slot by `write_slot` in the GPU side's own format.

This refresh is synchronous: the host waits for the slot writes (SlotMap.admit synchronizes the
stream before kt-kernel's mask changes), so on CUDA a refresh that swaps costs the decode step it
runs between about the copy time of the swapped experts (4 x 18.8 MB of MXFP4 a layer at most).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels_triton.formats.codecs import e8m0_to_float
from winport.hybrid.hot_experts import DEFAULT_MARGIN, DEFAULT_MAX_SWAPS, RouteCounts, Swap, plan_swaps
from winport.hybrid.slots import SlotMap

MXFP4_BLOCK = 32  # inputs per E8M0 scale


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert as the checkpoint holds it: packed E2M1 codes (int8, two a byte, low nibble
    first) and E8M0 scales (one per 32 inputs) of gate (w1), up (w3) and down (w2)."""

    w1: torch.Tensor
    w1_scale: torch.Tensor
    w3: torch.Tensor
    w3_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def _mxfp4_to_fp8_block(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # SGLang's own load-time conversion (Fp8MoEMethod.process_weights_after_loading_block_quant with
    # SGLANG_DSV4_FP4_DEQUANT=1), so a swapped-in expert holds the bytes loading would have given it.
    from sglang.srt.layers.quantization.fp8 import cast_e2m1fn_to_e4m3fn

    return cast_e2m1fn_to_e4m3fn(codes.view(torch.int8), e8m0_to_float(scale))


class SlotWeights:
    """The GPU side's expert weight tensors of one layer ([slots, ...]) and how to fill one slot.

    Two formats, told apart by the weight dtype: packed MXFP4 (int8 codes [S, 2I, H/2] with float32
    scales [S, 2I, H/32]: the CPU torch path and WINPORT_GPU_MXFP4_MOE) and block FP8 (float8_e4m3fn
    [S, 2I, H] with float32 [128, 128]-block scales: SGLang's dequantized CUDA default).
    """

    def __init__(self, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        if w13.dim() != 3 or w2.dim() != 3 or w13.shape[0] != w2.shape[0]:
            raise ValueError(f"expert slot weights must be [S, N, K] with one S: got w13 {tuple(w13.shape)}, "
                             f"w2 {tuple(w2.shape)}")
        self.w13, self.w13_scale, self.w2, self.w2_scale = w13, w13_scale, w2, w2_scale
        self.fp8 = w13.dtype == torch.float8_e4m3fn
        if not self.fp8 and w13.dtype not in (torch.int8, torch.uint8):
            raise ValueError(f"expert slot weights in {w13.dtype}: neither packed MXFP4 nor block FP8")

    @classmethod
    def of_layer(cls, layer: torch.nn.Module) -> SlotWeights:
        """The tensors SGLang's FusedMoE holds after loading (w13_weight, w13_weight_scale_inv, ...)."""
        return cls(layer.w13_weight.data, layer.w13_weight_scale_inv.data,  # type: ignore[union-attr]
                   layer.w2_weight.data, layer.w2_weight_scale_inv.data)  # type: ignore[union-attr]

    def expert_bytes(self) -> int:
        """Bytes one slot's expert takes in this format (what a swap writes)."""
        return sum(t[0].numel() * t.element_size() for t in (self.w13, self.w13_scale, self.w2, self.w2_scale))

    def write(self, slot: int, ex: ExpertWeights) -> None:
        """Put expert `ex` into slot `slot` (on the current stream; the caller keeps it unmapped until done)."""
        dev = self.w13.device
        gate_up = torch.cat([ex.w1, ex.w3], 0).to(dev, non_blocking=True)
        gate_up_scale = torch.cat([ex.w1_scale, ex.w3_scale], 0).to(dev, non_blocking=True)
        down, down_scale = ex.w2.to(dev, non_blocking=True), ex.w2_scale.to(dev, non_blocking=True)
        for (codes, scale), w, s, name in (((gate_up, gate_up_scale), self.w13, self.w13_scale, "w13"),
                                           ((down, down_scale), self.w2, self.w2_scale, "w2")):
            packed_shape = (w.shape[1], w.shape[2] // 2 if self.fp8 else w.shape[2])
            if tuple(codes.shape) != packed_shape or tuple(scale.shape) != (packed_shape[0], 2 * packed_shape[1] // MXFP4_BLOCK):
                raise ValueError(f"{name} of the expert for slot {slot}: codes {tuple(codes.shape)}, scales "
                                 f"{tuple(scale.shape)} do not fit the slots' {tuple(w.shape[1:])}")
            if self.fp8:
                q, qs = _mxfp4_to_fp8_block(codes, scale)
                w[slot].copy_(q)
                s[slot].copy_(qs)
            else:
                w[slot].copy_(codes.view(w.dtype))
                s[slot].copy_(e8m0_to_float(scale))


ReadExpert = Callable[[int], ExpertWeights]


class HotLayer:
    """Decayed route counts, hit counters and the swaps of one hybrid MoE layer."""

    def __init__(self, slots: SlotMap, weights: SlotWeights, read_expert: ReadExpert, decay: float,
                 margin: float = DEFAULT_MARGIN, max_swaps: int = DEFAULT_MAX_SWAPS) -> None:
        if weights.w13.shape[0] != slots.num_slots:
            raise ValueError(f"{weights.w13.shape[0]} slot weights for {slots.num_slots} slots")
        self.slots, self.weights, self.read_expert = slots, weights, read_expert
        self.margin, self.max_swaps = margin, max_swaps
        self.counts = RouteCounts(slots.num_experts, slots.slot_of.device, decay)
        # [routes the GPU served, routes] since start, on the router's device (int64: never saturates).
        self.hits = torch.zeros(2, dtype=torch.int64, device=slots.slot_of.device)
        self.swaps_done = 0

    def observe_routes(self, logical_ids: torch.Tensor) -> None:
        """Before the remap: fold the step's logical ids into the counts."""
        self.counts.update(logical_ids)

    def observe_split(self, slot_ids: torch.Tensor, cpu_ids: torch.Tensor) -> None:
        """After the remap: count the routes the GPU serves and all routes."""
        gpu = (slot_ids >= 0).sum()
        self.hits[0].add_(gpu)
        self.hits[1].add_(gpu + (cpu_ids >= 0).sum())

    def refresh(self) -> list[Swap]:
        """Read the counts, make the swaps they call for, and return them."""
        swaps = plan_swaps(self.counts.read(), self.slots.resident(), self.margin, self.max_swaps)
        for sw in swaps:
            self.slots.retire(sw.slot)
            self.weights.write(sw.slot, self.read_expert(sw.into))
            self.slots.admit(sw.slot, sw.into)
        self.swaps_done += len(swaps)
        return swaps

    def hit_counts(self) -> tuple[int, int]:
        """(routes the GPU served, routes) since start (one device-to-host copy)."""
        served, routed = self.hits.tolist()
        return int(served), int(routed)
