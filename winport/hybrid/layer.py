"""One hybrid MoE layer's forward: CPU experts in kt-kernel, resident experts on the GPU side.

    cpu_ids = logical ids, -1 where the GPU serves the expert;  topk_ids -> GPU slots in place
    kt-kernel submit(x, cpu_ids)           (CUDA: enqueued on the current stream; CPU: done here)
    gpu = gpu_experts(x, slot ids)         (unscaled; skipped when the layer has no GPU slots)
    cpu = kt-kernel sync                   (CUDA: a host function on the stream, then an H2D copy)
    (a chunk at or above the streamer's threshold instead streams the CPU experts through the
     GPU: cpu = ExpertStreamer.forward, kt-kernel untouched; winport.hybrid.prefill_stream)
    out = bf16(scale * (fp32(cpu) + fp32(gpu)))   routed_scaling_factor once, on the sum

Under SGLang's decode CUDA graphs DeepSeek-V4's shared expert runs on its alternate stream
(DeepseekV2MoE.forward_normal_dual_stream), so it overlaps the CPU experts too; in eager prefill
it runs after the sync on the same stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from winport.hybrid.hot_swap import HotLayer
from winport.hybrid.kt_experts import KTExperts
from winport.hybrid.route_record import RouteTally
from winport.hybrid.slots import SlotMap

if TYPE_CHECKING:  # importing it loads the Triton kernels, which must wait for TRITON_INTERPRET in tests
    from winport.hybrid.prefill_stream import ExpertStreamer

# (hidden [T, H], slot ids [T, k] with -1 = not resident, router weights [T, k]) -> unscaled [T, H]
GpuExperts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class HybridMoE:
    """The routed experts of one layer split between kt-kernel (CPU) and a GPU-side method."""

    def __init__(self, kt: KTExperts, slots: SlotMap, gpu_experts: GpuExperts | None) -> None:
        if slots.mask is not kt.mask:
            raise ValueError("the slot map must change kt-kernel's own mask tensor (in place)")
        self.kt, self.slots, self.gpu_experts = kt, slots, gpu_experts
        self.hot: HotLayer | None = None  # set to let the slots follow the routes (winport.hybrid.hot_swap)
        self.tally: RouteTally | None = None  # set to record the routes (winport.hybrid.route_record)
        self.streamer: ExpertStreamer | None = None  # set to stream long chunks' CPU experts through the GPU

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                routed_scaling_factor: float = 1.0, gpu_experts: GpuExperts | None = None) -> torch.Tensor:
        """Routed-expert output [T, H] in x's dtype; `topk_ids` is remapped to slots in place.
        `gpu_experts` overrides the constructor's for this call (SGLang's method binds the layer)."""
        run_gpu = gpu_experts or self.gpu_experts
        if self.slots.num_slots and run_gpu is None:
            raise ValueError(f"{self.slots.num_slots} GPU expert slots but no GPU-side expert method")
        if self.tally is not None:
            self.tally.observe(topk_ids)
        if self.hot is not None:
            self.hot.observe_routes(topk_ids)
        cpu_ids = self.slots.split_(topk_ids)
        if self.hot is not None:
            self.hot.observe_split(topk_ids, cpu_ids)
        gpu_work = run_gpu is not None and self.slots.num_slots > 0
        cpu: torch.Tensor | None = None
        if gpu_work and self.slots.num_slots == self.slots.num_experts:
            # Every expert resident: no CPU work, and kt-kernel's two host functions and copy would
            # still cost ~0.3 ms a layer on the stream (H200, scripts/bench/hybrid_layer.py). Fixed
            # per layer, so the same branch is taken at CUDA-graph capture and replay.
            gpu = run_gpu(x, topk_ids, topk_weights)
        elif self.streamer is not None and self.streamer.wants(x):
            # A long prefill chunk: kt-kernel is skipped, its experts computed on the GPU as they stream in.
            cpu = self.streamer.forward(x, cpu_ids, topk_weights)
            gpu = run_gpu(x, topk_ids, topk_weights) if gpu_work else None
        elif not self.kt.fits(x):
            # A prefill longer than kt-kernel's buffers (never under CUDA graphs): chunked, synchronous.
            cpu = self.kt.forward(x, cpu_ids, topk_weights)
            gpu = run_gpu(x, topk_ids, topk_weights) if gpu_work else None
        else:
            self.kt.submit(x, cpu_ids, topk_weights)
            gpu = run_gpu(x, topk_ids, topk_weights) if gpu_work else None
            cpu = self.kt.sync(x)
        parts = [t.float() for t in (cpu, gpu) if t is not None]
        acc = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        if routed_scaling_factor != 1.0:
            acc = acc * routed_scaling_factor
        return acc.to(x.dtype)
