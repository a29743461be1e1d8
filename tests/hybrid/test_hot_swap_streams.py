"""Hot-expert swaps that never block decode (HotLayer with SwapStreams), on CPU torch.

The CUDA server's swaps go through winport.hybrid.swap_stream: markers on the decode stream and
slot writes on a side stream. Here a hand-cranked SwapStreams lets each marker pass and each write
run only when the test says, so every state a decode step can meet in between is served and
checked: the layer's output must never touch a slot being written (the slots are poisoned with NaN
while their writes are pending) and must equal a static layer's placed as the map says at that
moment. The layer, weights and references are test_hot_swap's.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
import torch

from tests.hybrid.test_hot_swap import SLOTS, _biased_routing, _expert, _hot_moe
from tests.hybrid.test_hot_swap import gen as gen  # noqa: F401  (the seeded generator fixture)
from tests.hybrid.test_kt_moe_layer import LIMIT, RSF, E, _experts, _kt, _torch_side
from winport.hybrid import hot_swap
from winport.hybrid.hot_registry import HotRegistry
from winport.hybrid.hot_swap import HotLayer
from winport.hybrid.layer import HybridMoE
from winport.hybrid.slots import SlotMap


@dataclass
class HandMarker:
    passed: bool = False

    def query(self) -> bool:
        return self.passed


@dataclass
class HandStreams:
    """SwapStreams whose markers pass and whose side-stream jobs run when the test says."""

    markers: list[HandMarker] = field(default_factory=list)
    jobs: list[tuple[HandMarker, Callable[[], None], Future[None]]] = field(default_factory=list)

    def mark(self) -> HandMarker:
        m = HandMarker()
        self.markers.append(m)
        return m

    def snapshot(self, t: torch.Tensor) -> tuple[torch.Tensor, HandMarker]:
        return t.clone(), self.mark()

    def start(self, after: HandMarker, job: Callable[[], None]) -> Future[None]:
        f: Future[None] = Future()
        self.jobs.append((after, job, f))
        return f

    def pass_markers(self) -> None:
        for m in self.markers:
            m.passed = True

    def run_jobs(self) -> None:
        for after, job, f in self.jobs:
            assert after.passed, "a side-stream job ran before the decode stream passed its marker"
            try:
                job()
            except Exception as err:  # noqa: BLE001 - handed to the future, as the worker does
                f.set_exception(err)
            else:
                f.set_result(None)
        self.jobs.clear()


def _static(ex: dict[str, torch.Tensor], slots: SlotMap) -> HybridMoE:
    """A layer whose GPU side holds exactly the experts `slots` maps (by slot), kt-kernel the rest."""
    kt = _kt(ex, LIMIT)
    static = SlotMap(kt.mask, SLOTS, "cpu")
    resident = slots.resident()
    static.slot_of.copy_(slots.slot_of)
    static.host_slot_of = list(slots.host_slot_of)
    static.mask.copy_(torch.tensor([s >= 0 for s in slots.host_slot_of]))
    # Empty slots hold expert 0's weights in the reference: no id maps to them, so none is read.
    return HybridMoE(kt, static, _torch_side(ex, [e if e >= 0 else 0 for e in resident], LIMIT))


def _poison(weights: hot_swap.SlotWeights, slots: list[int]) -> None:
    for s in slots:
        weights.w13_scale[s].fill_(float("nan"))
        weights.w2_scale[s].fill_(float("nan"))


def _serve_and_compare(moe: HybridMoE, ex: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    """One step through the hot layer against a static layer placed as its map is now."""
    x, ids, w = _biased_routing(gen, 8, [6, 7])
    static = _static(ex, moe.slots)
    out = moe.forward(x, ids.clone(), w, RSF)
    assert not out.isnan().any(), "a step read a slot whose write was pending"
    assert torch.equal(out, static.forward(x, ids.clone(), w, RSF))


def test_each_phase_serves_only_written_slots(gen: torch.Generator) -> None:
    """Counts snapshot, retire, side-stream write, map, hand to kt-kernel: the layer waits for each
    marker and write, a decode step between any two phases reads no slot being written and matches
    a static placement of the map at that moment, and no second batch starts while one is in flight."""
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9)
    streams = HandStreams()
    hot.streams = streams
    for _ in range(6):
        x, ids, w = _biased_routing(gen, 4, [6, 7])
        moe.forward(x, ids, w, RSF)
    assert hot.refresh() == [] and hot.phase == hot_swap.COUNTING
    assert hot.advance() == [] and hot.slots.resident() == [0, 1]  # the snapshot has not arrived
    streams.pass_markers()
    assert hot.advance() == [] and hot.phase == hot_swap.WRITING
    assert hot.slots.resident() == [-1, -1]  # both retired: the CPU serves 0 and 1 again
    assert not hot.slots.mask.any() and hot.slots.slot_of.tolist() == [-1] * (E + 1)
    assert len(streams.jobs) == 1 and not streams.jobs[0][0].passed  # the write waits for the retirement
    _poison(hot.weights, [0, 1])  # what a half-written slot may hold
    _serve_and_compare(moe, ex, gen)
    assert hot.refresh() == [] and hot.phase == hot_swap.WRITING  # no second batch in flight
    streams.pass_markers()
    assert hot.advance() == []  # the write has not run
    streams.run_jobs()
    assert hot.advance() == [] and hot.phase == hot_swap.MAPPING
    assert sorted(hot.slots.resident()) == [6, 7]
    assert not hot.slots.mask.any(), "kt-kernel was told before the decode stream passed the mapping"
    _serve_and_compare(moe, ex, gen)
    done = hot.advance()
    assert done == [] and hot.phase == hot_swap.MAPPING  # the mapping's marker has not passed
    streams.pass_markers()
    done = hot.advance()
    assert sorted(sw.into for sw in done) == [6, 7] and hot.swaps_done == 2 and hot.phase == hot_swap.IDLE
    assert hot.slots.mask.tolist() == [e in (6, 7) for e in range(E)]
    _serve_and_compare(moe, ex, gen)


def test_a_failed_write_leaves_the_slots_empty_and_the_layer_serving(
        gen: torch.Generator, capsys: pytest.CaptureFixture[str]) -> None:
    """A write that raises (the expert's file changed under the server) stops the layer's swaps with
    one line; its slots stay empty and the CPU serves every expert, with the same outputs as a
    static layer of that placement."""
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9)
    streams = HandStreams()
    hot.streams, hot.name = streams, "layer 3's MoE"

    def broken(e: int) -> hot_swap.ExpertWeights:
        if e in (6, 7):
            raise OSError(f"expert {e}: the GGUF changed under the server")
        return _expert(ex, e)

    hot.read_expert = broken
    for _ in range(6):
        x, ids, w = _biased_routing(gen, 4, [6, 7])
        moe.forward(x, ids, w, RSF)
    hot.refresh()
    streams.pass_markers()
    hot.advance()
    _poison(hot.weights, [0, 1])
    streams.pass_markers()
    streams.run_jobs()
    assert hot.advance() == [] and hot.phase == hot_swap.FAILED
    line = capsys.readouterr().out
    assert "GPU expert swaps of layer 3's MoE stopped" in line and "the GGUF changed" in line, line
    assert hot.slots.resident() == [-1, -1] and not hot.slots.mask.any()
    _serve_and_compare(moe, ex, gen)
    assert hot.refresh() == [] and hot.phase == hot_swap.FAILED and streams.jobs == []


def test_the_step_clock_advances_every_step_and_refreshes_every_interval() -> None:
    """HotRegistry.step moves the swaps in flight on after every decode step, refreshes every
    `every` steps, and counts the swaps `advance` completes towards the first-swap line."""

    @dataclass
    class Layer:
        calls: list[str] = field(default_factory=list)

        def advance(self) -> list[int]:
            self.calls.append("advance")
            return [1] if len(self.calls) == 9 else []  # step 7's advance completes a swap

        def refresh(self) -> list[int]:
            self.calls.append("refresh")
            return []

    layer = Layer()
    reg = HotRegistry(every=3)
    reg.layers.append(layer)  # type: ignore[arg-type]  # a stand-in with the two methods the clock calls
    for _ in range(6):
        reg.step()
    assert layer.calls == ["advance", "advance", "advance", "refresh", "advance", "advance", "advance", "refresh"]
    assert not reg._announced
    reg.step()
    assert reg._announced and layer.calls[-1] == "advance"


def test_cpu_layers_swap_in_place() -> None:
    """Without streams (the CPU server) advance does nothing and nothing is ever in flight (its
    refresh swaps at once: test_hot_swap.py)."""
    ex = _experts(torch.Generator().manual_seed(3))
    kt = _kt(ex, LIMIT)
    slots = SlotMap(kt.mask, SLOTS, "cpu")
    weights = hot_swap.SlotWeights(torch.zeros(SLOTS, 1, 1, dtype=torch.int8), torch.zeros(SLOTS, 1, 1),
                                   torch.zeros(SLOTS, 1, 1, dtype=torch.int8), torch.zeros(SLOTS, 1, 1))
    hot = HotLayer(slots, weights, lambda e: _expert(ex, e), 0.9)
    assert hot.streams is None and hot.advance() == [] and hot.phase == hot_swap.IDLE


@pytest.mark.gpu
def test_cuda_swap_streams_wait_for_the_decode_stream() -> None:
    """CudaSwapStreams on a real GPU: a snapshot and a side-stream job queued behind a busy decode
    stream see its last write, the markers report it without waiting, the future is done only once
    the job's GPU work has completed, and a job's exception reaches the future."""
    from winport.hybrid.swap_stream import CudaSwapStreams

    dev = torch.device("cuda")
    streams = CudaSwapStreams(dev)
    src = torch.zeros(1 << 22, device=dev)
    dst = torch.full_like(src, float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # a few hundred ms of a busy decode stream
    src.fill_(7.0)
    snap, snap_marker = streams.snapshot(src[:4])
    after = streams.mark()
    assert not after.query() and not snap_marker.query()

    def job() -> None:
        torch.cuda._sleep(100_000_000)  # the side stream is slow too: done must mean done
        dst.copy_(src * 2)

    fut = streams.start(after, job)
    fut.result(timeout=60)
    assert after.query() and snap_marker.query()
    assert snap.tolist() == [7.0] * 4
    side_done = torch.cuda.Event()
    side_done.record(streams.side)
    assert side_done.query(), "the future was done before the side stream's work"
    assert torch.equal(dst.cpu(), torch.full((1 << 22,), 14.0))
    failed = streams.start(streams.mark(), lambda: [][1])
    assert isinstance(failed.exception(timeout=60), IndexError)
