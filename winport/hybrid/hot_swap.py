"""One layer's GPU slots following its routes: counting in the forward, swapping at a refresh.

`HotLayer` joins the pieces of winport.hybrid.hot_experts to one layer's SlotMap and GPU-side
weights:
- `observe` runs inside the layer's forward, before and after the slot remap: it folds the step's
  logical ids into the decayed counts and adds the routes the GPU served and all routes to two
  counters of the step's kind (prefill or decode). Fixed shapes, no host sync: it is captured in
  decode CUDA graphs with the layer. The kind is a one-element tensor the step clock fills before
  each forward (winport.hybrid.hot_registry), read when the step runs; SGLang's graph warm-ups and
  captures run outside a step and count as neither (their dummy batches are not the text).
- `refresh` runs on the host between steps (every `interval` of them): it reads the counts, plans
  the swaps, and makes each in the order SlotMap documents (retire, write the slot, admit), with
  the new expert's weights from `read_expert` (host memory: the checkpoint's memory map) written
  into the slot by `write_slot` in the GPU side's own format.

Without `streams` (the CPU server) a refresh is synchronous: it reads the counts, writes the slots
and admits the experts at once (SlotMap.admit waits for the stream). With `streams`
(winport.hybrid.swap_stream, the CUDA server) the scheduler never waits for the GPU: `refresh`
only takes a non-blocking snapshot of the counts, and `advance`, called after every decode step,
moves the layer's one batch of swaps on as far as the GPU allows (plan and retire once the
snapshot has arrived; write the slots on the side stream; map them once written; hand kt-kernel
the experts once the decode stream has passed the mapping). A layer starts no new batch while
one is in flight. A batch whose writes fail (a changed or truncated file, say) leaves its slots
empty, the CPU serving their experts, and stops that layer's swaps with one log line.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from kernels_triton.formats.codecs import e8m0_to_float
from winport.hybrid.hot_experts import DEFAULT_MARGIN, DEFAULT_MAX_SWAPS, RouteCounts, Swap, plan_swaps
from winport.hybrid.slots import SlotMap
from winport.hybrid.swap_stream import Marker, SwapStreams

MXFP4_BLOCK = 32  # inputs per E8M0 scale

# The phases of HotLayer's batch of swaps with streams: nothing in flight, the counts' snapshot on
# its way, the slots' writes on the side stream, the map written but kt-kernel not yet told; or
# stopped after a failed write.
IDLE, COUNTING, WRITING, MAPPING, FAILED = "idle", "counting", "writing", "mapping", "failed"

# What kind of step a route comes from: the rows of HotLayer.hits and the values of its step-kind tensor.
PREFILL, DECODE, UNCOUNTED = 0, 1, 2
STEP_KINDS = ("prefill", "decode")  # the counted kinds, by row


def step_kind_tensor(device: torch.device | str, kind: int = UNCOUNTED) -> torch.Tensor:
    """A step-kind tensor (int64 [1]) on `device`, holding `kind`."""
    return torch.full((1,), kind, dtype=torch.int64, device=device)


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

    def encode(self, ex: ExpertWeights,
               label: str = "the expert") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert `ex` in this format on the slots' device: (w13, w13 scale, w2, w2 scale) of one slot."""
        dev = self.w13.device
        gate_up = torch.cat([ex.w1, ex.w3], 0).to(dev, non_blocking=True)
        gate_up_scale = torch.cat([ex.w1_scale, ex.w3_scale], 0).to(dev, non_blocking=True)
        down, down_scale = ex.w2.to(dev, non_blocking=True), ex.w2_scale.to(dev, non_blocking=True)
        out: list[torch.Tensor] = []
        for (codes, scale), w, name in (((gate_up, gate_up_scale), self.w13, "w13"), ((down, down_scale), self.w2, "w2")):
            packed_shape = (w.shape[1], w.shape[2] // 2 if self.fp8 else w.shape[2])
            if tuple(codes.shape) != packed_shape or tuple(scale.shape) != (packed_shape[0], 2 * packed_shape[1] // MXFP4_BLOCK):
                raise ValueError(f"{name} of {label}: codes {tuple(codes.shape)}, scales "
                                 f"{tuple(scale.shape)} do not fit the slots' {tuple(w.shape[1:])}")
            # Scales take the slot's dtype, as write()'s copy_ would: mismatch() compares dtypes too.
            scale_dtype = (self.w13_scale if name == "w13" else self.w2_scale).dtype
            if self.fp8:
                q, s = _mxfp4_to_fp8_block(codes, scale)
                out.extend((q, s.to(scale_dtype)))
            else:
                out.extend((codes.view(w.dtype), e8m0_to_float(scale).to(scale_dtype)))
        return out[0], out[1], out[2], out[3]

    def write(self, slot: int, ex: ExpertWeights) -> None:
        """Put expert `ex` into slot `slot` (on the current stream; the caller keeps it unmapped until done)."""
        encoded = self.encode(ex, f"the expert for slot {slot}")
        for dst, src in zip((self.w13, self.w13_scale, self.w2, self.w2_scale), encoded, strict=True):
            dst[slot].copy_(src)

    def mismatch(self, slot: int, ex: ExpertWeights) -> str | None:
        """None if slot `slot` holds exactly what `write(slot, ex)` would put there, else which tensor
        differs: the check that the swap path encodes experts as loading did."""
        names = ("w13_weight", "w13_weight_scale_inv", "w2_weight", "w2_weight_scale_inv")
        for name, have, want in zip(names, (self.w13, self.w13_scale, self.w2, self.w2_scale), self.encode(ex), strict=True):
            have = have[slot]
            if have.shape != want.shape or have.dtype != want.dtype:
                return f"{name}: loaded {have.dtype} {tuple(have.shape)}, a swap writes {want.dtype} {tuple(want.shape)}"
            if not torch.equal(have.view(torch.uint8), want.contiguous().view(torch.uint8)):
                return f"{name}: the loaded bytes differ from the ones a swap writes"
        return None


ReadExpert = Callable[[int], ExpertWeights]


class HotLayer:
    """Decayed route counts, hit counters and the swaps of one hybrid MoE layer."""

    def __init__(self, slots: SlotMap, weights: SlotWeights, read_expert: ReadExpert, decay: float,
                 margin: float = DEFAULT_MARGIN, max_swaps: int = DEFAULT_MAX_SWAPS,
                 step_kind: torch.Tensor | None = None, streams: SwapStreams | None = None,
                 name: str = "a hybrid MoE layer") -> None:
        """`step_kind` is the step clock's shared tensor; without one every forward counts as decode.
        With `streams` the swaps run without blocking (module docstring); `name` is for the log."""
        if weights.w13.shape[0] != slots.num_slots:
            raise ValueError(f"{weights.w13.shape[0]} slot weights for {slots.num_slots} slots")
        device = slots.slot_of.device
        self.slots, self.weights, self.read_expert = slots, weights, read_expert
        self.margin, self.max_swaps = margin, max_swaps
        self.counts = RouteCounts(slots.num_experts, device, decay)
        self.step_kind = step_kind_tensor(device, DECODE) if step_kind is None else step_kind
        if self.step_kind.shape != (1,) or self.step_kind.dtype != torch.int64 or self.step_kind.device != device:
            raise ValueError(f"step kind must be int64 [1] on {device}, got {self.step_kind.dtype} "
                             f"{tuple(self.step_kind.shape)} on {self.step_kind.device}")
        # Per step kind (PREFILL, DECODE, UNCOUNTED): [routes the GPU served, routes] since start,
        # on the router's device (int64: never saturates).
        self.hits = torch.zeros(3, 2, dtype=torch.int64, device=device)
        self.swaps_done = 0
        self.streams, self.name = streams, name
        # The one batch of swaps in flight (with streams): its phase and what the phase waits for.
        self.phase = IDLE
        self._counts_host: torch.Tensor | None = None
        self._marker: Marker | None = None
        self._writes: Future[None] | None = None
        self._flight: list[Swap] = []

    def observe_routes(self, logical_ids: torch.Tensor) -> None:
        """Before the remap: fold the step's logical ids into the counts (if the step counts)."""
        self.counts.update(logical_ids, (self.step_kind < UNCOUNTED).float())

    def observe_split(self, slot_ids: torch.Tensor, cpu_ids: torch.Tensor) -> None:
        """After the remap: count the routes the GPU serves and all routes, under the step's kind."""
        gpu = (slot_ids >= 0).sum()
        row = torch.stack([gpu, gpu + (cpu_ids >= 0).sum()]).unsqueeze(0)
        self.hits.index_add_(0, self.step_kind, row)

    def refresh(self) -> list[Swap]:
        """Without streams: read the counts, make the swaps they call for, and return them.
        With streams: snapshot the counts for `advance` unless a batch is in flight; returns []."""
        if self.streams is not None:
            if self.phase == IDLE:
                self._counts_host, self._marker = self.streams.snapshot(self.counts.counts[: self.counts.num_experts])
                self.phase = COUNTING
            return []
        swaps = plan_swaps(self.counts.read(), self.slots.resident(), self.margin, self.max_swaps)
        for sw in swaps:
            self.slots.retire(sw.slot)
            self.weights.write(sw.slot, self.read_expert(sw.into))
            self.slots.admit(sw.slot, sw.into)
        self.swaps_done += len(swaps)
        return swaps

    def advance(self) -> list[Swap]:
        """With streams: move the batch in flight on as far as the GPU has got, without waiting;
        returns the swaps completed by this call (kt-kernel handed their experts)."""
        if self.streams is None:
            return []
        if self.phase == COUNTING and self._passed():
            assert self._counts_host is not None
            counts, self._counts_host = self._counts_host.tolist(), None
            self._flight = plan_swaps(counts, self.slots.resident(), self.margin, self.max_swaps)
            if not self._flight:
                self.phase = IDLE
                return []
            for sw in self._flight:
                self.slots.retire(sw.slot)
            writes = [(sw.slot, sw.into) for sw in self._flight]
            self._writes = self.streams.start(self.streams.mark(), lambda: self._write_slots(writes))
            self.phase = WRITING
        if self.phase == WRITING and self._writes is not None and self._writes.done():
            err = self._writes.exception()
            self._writes = None
            if err is not None:
                self.phase = FAILED
                print(f"winport: GPU expert swaps of {self.name} stopped: writing experts "
                      f"{[sw.into for sw in self._flight]} into their slots failed ({err}); the slots stay empty "
                      f"and the CPU serves those experts", flush=True)
                return []
            for sw in self._flight:
                self.slots.map_slot(sw.slot, sw.into)
            self._marker = self.streams.mark()
            self.phase = MAPPING
        if self.phase == MAPPING and self._passed():
            for sw in self._flight:
                self.slots.hand_to_gpu(sw.into)
            done, self._flight = self._flight, []
            self.swaps_done += len(done)
            self.phase = IDLE
            return done
        return []

    def _passed(self) -> bool:
        assert self._marker is not None
        return self._marker.query()

    def _write_slots(self, writes: list[tuple[int, int]]) -> None:
        # Runs in the swap worker on the side stream: each slot is unmapped until its write is done.
        for slot, expert in writes:
            self.weights.write(slot, self.read_expert(expert))

    def hit_counts(self) -> dict[str, tuple[int, int]]:
        """Per counted step kind ("prefill", "decode"): (routes the GPU served, routes) since start
        (one device-to-host copy)."""
        rows = self.hits.tolist()
        return {kind: (int(rows[i][0]), int(rows[i][1])) for i, kind in enumerate(STEP_KINDS)}
