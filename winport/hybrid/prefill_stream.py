"""Prefill that streams a layer's CPU-resident experts through the GPU, group by group.

A long prompt's MoE is far too much work for the CPU experts (about 7.5-8 GB/s of MXFP4 weights a
core), while the GPU computes a whole chunk's tokens against one expert's weights in the time PCIe
takes to bring them. So above a token threshold the experts the chunk routes to on the CPU side
are copied to the GPU in groups and computed there:

    y = zeros [T * top_k, H]                      (one bf16 row per (token, slot))
    for group g of the routed CPU experts, G at a time:
        copy stream:    wait until buffer g % 2 is free, copy the group's experts host -> buffer
        compute stream: wait for that copy; ids of the group -> 0..G-1, every other id -> -1;
                        mxfp4_moe_slots(x, buffer, local ids, ..., y, zero_invalid=False);
                        mark buffer g % 2 free
    out = sum over top_k of y                     (kernels_triton.mxfp4_moe.sum_topk)

Two buffers, so group g + 1's copy runs under group g's compute; the staging VRAM is those two
buffers (`staging_bytes`). Each (token, slot) row is written by exactly one group's launch, with
the tiles one launch over all the layer's experts would use, so `out` is bit for bit what
mxfp4_moe gives with every expert resident (the test checks it). The host experts must be pinned
for the copies to overlap anything; pageable ones are copied correctly, synchronously.

The host side holds the experts in the kernel's layout (`HostExperts`). Where a server gets them
without a second host copy of the experts (kt-kernel's own buffers, or the model's memory map
read ahead into pinned staging) is not decided here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels_triton.mxfp4_moe import MoeConfig, mxfp4_moe_slots, pick_config, sum_topk


@dataclass(frozen=True)
class HostExperts:
    """One layer's routed experts in host memory, in kernels_triton.mxfp4_moe's layout: w13 [E, 2I, H/2]
    and w2 [E, H, I/2] packed E2M1 codes (uint8), w13_scale [E, 2I, H/32] and w2_scale [E, H, I/32]
    E8M0 bytes (uint8)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor

    def __post_init__(self) -> None:
        e, n2, hh = self.w13.shape
        i, h = n2 // 2, 2 * hh
        want = {"w13": (e, 2 * i, h // 2), "w13_scale": (e, 2 * i, h // 32),
                "w2": (e, h, i // 2), "w2_scale": (e, h, i // 32)}
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != torch.uint8 or t.device.type != "cpu":
                raise ValueError(f"HostExperts.{name}: want uint8 {shape} in host memory, got {t.dtype} "
                                 f"{tuple(t.shape)} on {t.device}")

    @property
    def num_experts(self) -> int:
        """E."""
        return self.w13.shape[0]

    def expert_bytes(self) -> int:
        """Bytes one expert's codes and scales take (what a group copies per expert)."""
        return sum(t[0].numel() for t in self.fields())

    def fields(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w13, w13_scale, w2, w2_scale): the order the kernel takes them in."""
        return self.w13, self.w13_scale, self.w2, self.w2_scale


class _Buffer:
    """One group's worth of experts on the device, and the events that hand it between the streams."""

    def __init__(self, host: HostExperts, group: int, device: torch.device) -> None:
        self.fields = [torch.empty((group, *t.shape[1:]), dtype=torch.uint8, device=device)
                       for t in host.fields()]
        cuda = device.type == "cuda"
        self.ready = torch.cuda.Event() if cuda else None  # copy done (recorded on the copy stream)
        self.free = torch.cuda.Event() if cuda else None  # last compute reading it done
        self.used = False


class Staging:
    """Two group buffers and a copy stream on one device, shared by every layer whose experts have
    the same shapes (layers run one after another on the compute stream, and each use of a buffer
    waits for its last reader, so sharing costs nothing and the VRAM is paid once)."""

    def __init__(self, host: HostExperts, group: int, device: torch.device) -> None:
        self.group, self.device = group, device
        self.buffers = [_Buffer(host, group, device) for _ in range(2)]
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.nbytes = 2 * group * host.expert_bytes()


_staging: dict[tuple, Staging] = {}


def shared_staging(host: HostExperts, group: int, device: torch.device | str) -> Staging:
    """The process's Staging for `device`, `group` and `host`'s expert shapes (made on first use)."""
    device = torch.device(device)
    key = (str(device), group, tuple(tuple(t.shape[1:]) for t in host.fields()))
    if key not in _staging:
        _staging[key] = Staging(host, group, device)
    return _staging[key]


class ExpertStreamer:
    """Runs one layer's MoE for a long chunk on the GPU with its experts streamed from `host`."""

    def __init__(self, host: HostExperts, device: torch.device | str, group: int = 16,
                 threshold: int = 1024, swiglu_limit: float | None = None, staging: Staging | None = None) -> None:
        if group < 1:
            raise ValueError(f"ExpertStreamer: group must be at least 1 expert, not {group}")
        self.host, self.device = host, torch.device(device)
        self.group, self.threshold, self.swiglu_limit = min(group, host.num_experts), threshold, swiglu_limit
        self.staging = staging or shared_staging(host, self.group, self.device)
        if self.staging.group != self.group:
            raise ValueError(f"ExpertStreamer: staging for groups of {self.staging.group}, not {self.group}")
        self.buffers, self.copy_stream = self.staging.buffers, self.staging.copy_stream

    def staging_bytes(self) -> int:
        """Device bytes the two group buffers hold: the streaming's whole extra VRAM (once per device,
        not per layer), besides the per-chunk activations any MoE launch allocates."""
        return self.staging.nbytes

    def wants(self, x: torch.Tensor) -> bool:
        """Whether a chunk of x.shape[0] tokens streams (at or above the threshold, never while a CUDA
        graph is being captured: decode batches stay on the hybrid path)."""
        if x.shape[0] < self.threshold:
            return False
        return not (x.is_cuda and torch.cuda.is_current_stream_capturing())

    def config(self, num_pairs: int) -> MoeConfig:
        """The tiles: those one launch over all the layer's experts would pick, so streaming changes no bit."""
        return pick_config(num_pairs, self.host.num_experts)

    def forward(self, x: torch.Tensor, cpu_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """Unscaled routed output [T, H] bf16 of the (token, slot) pairs whose logical id in `cpu_ids`
        [T, k] is in [0, E); -1 (served elsewhere) contributes zero."""
        t, k = cpu_ids.shape
        e_all = self.host.num_experts
        y = torch.zeros(t * k, x.shape[1], dtype=torch.bfloat16, device=x.device)
        cfg = self.config(t * k)
        ids = cpu_ids.to(torch.int64)
        valid = (ids >= 0) & (ids < e_all)
        routed = torch.unique(ids[valid])
        # The host needs the list of experts to copy: one sync per layer, in eager prefill only.
        experts = routed.tolist()
        # Each pair's group number and its expert's place in that group (invalid ids: group -1).
        rank = torch.arange(len(experts), device=x.device)
        group_of = torch.full((e_all + 1,), -1, dtype=torch.int64, device=x.device)  # index e_all: invalid ids
        group_of[routed] = rank // self.group
        local_of = torch.full((e_all + 1,), -1, dtype=torch.int32, device=x.device)
        local_of[routed] = (rank % self.group).to(torch.int32)
        idx = torch.where(valid, ids, e_all)
        pair_group, pair_local = group_of[idx], local_of[idx]
        compute = torch.cuda.current_stream(self.device) if self.copy_stream is not None else None
        for n, g0 in enumerate(range(0, len(experts), self.group)):
            buf = self.copy_group(n, experts[g0:g0 + self.group])
            local = torch.where(pair_group == n, pair_local, -1)
            mxfp4_moe_slots(x, *buf.fields, local, topk_weights, y, self.swiglu_limit, cfg, zero_invalid=False)
            if buf.free is not None:
                buf.free.record(compute)
        out = torch.empty(t, x.shape[1], dtype=torch.bfloat16, device=x.device)
        sum_topk(y.view(t, k, -1), out, 1.0)
        return out

    def copy_group(self, n: int, group: list[int]) -> _Buffer:
        """Group number `n`'s experts into buffer n % 2: on the copy stream behind that buffer's last
        reader, with the current (compute) stream made to wait for the copy; synchronous without CUDA.
        The caller records the buffer's `free` event once its reads are enqueued."""
        buf = self.buffers[n % 2]
        hosts = self.host.fields()
        if self.copy_stream is None:
            for dst, src in zip(buf.fields, hosts, strict=True):
                for j, e in enumerate(group):
                    dst[j].copy_(src[e])
            return buf
        compute = torch.cuda.current_stream(self.device)
        assert buf.ready is not None and buf.free is not None
        with torch.cuda.stream(self.copy_stream):
            if buf.used:
                self.copy_stream.wait_event(buf.free)
            for dst, src in zip(buf.fields, hosts, strict=True):
                for j, e in enumerate(group):
                    dst[j].copy_(src[e], non_blocking=True)
            buf.ready.record(self.copy_stream)
        buf.used = True
        compute.wait_event(buf.ready)
        return buf
