"""GPU slots that follow the routes (winport.hybrid.hot_swap) in one hybrid layer, on CPU torch.

kt-kernel serves the CPU experts (its synchronous path); the GPU side is the torch W4A16 path over
slot tensors that the swaps rewrite (the format the CPU server and WINPORT_GPU_MXFP4_MOE keep).
Shapes, weights and the float64 reference are those of test_kt_moe_layer.
"""

from __future__ import annotations

import torch

from tests.hybrid.test_kt_moe_layer import (
    INTER,
    LIMIT,
    RSF,
    TOPK,
    E,
    H,
    _check,
    _dequant64,
    _experts,
    _kt,
    _reference,
    _torch_side,
)
from tests.hybrid.test_kt_moe_layer import gen as gen  # noqa: F401  (the seeded generator fixture)
from winport.hybrid.hot_swap import ExpertWeights, HotLayer, SlotWeights
from winport.hybrid.layer import HybridMoE
from winport.hybrid.slots import SlotMap
from winport.patches.cpu_mxfp4_moe import mxfp4_moe

SLOTS = 2


def _expert(ex: dict[str, torch.Tensor], e: int) -> ExpertWeights:
    # The checkpoint's bytes: E8M0 scales as uint8, as a memory-mapped file hands them over.
    return ExpertWeights(ex["w1"][e], ex["w1s"][e].view(torch.uint8), ex["w3"][e], ex["w3s"][e].view(torch.uint8),
                         ex["w2"][e], ex["w2s"][e].view(torch.uint8))


def _slot_tensors(fill_nan: bool = True) -> SlotWeights:
    w13 = torch.randint(-128, 128, (SLOTS, 2 * INTER, H // 2), dtype=torch.int8)
    w2 = torch.randint(-128, 128, (SLOTS, H, INTER // 2), dtype=torch.int8)
    # poison: a slot read before its expert is written gives NaN
    s13 = torch.full((SLOTS, 2 * INTER, H // 32), float("nan"))
    s2 = torch.full((SLOTS, H, INTER // 32), float("nan"))
    return SlotWeights(w13, s13, w2, s2)


def _hot_moe(ex: dict[str, torch.Tensor], decay: float,
             step_kind: torch.Tensor | None = None) -> tuple[HybridMoE, HotLayer]:
    kt = _kt(ex, LIMIT)
    slots = SlotMap(kt.mask, SLOTS, "cpu")
    weights = _slot_tensors()
    for slot, e in enumerate(slots.resident()):
        weights.write(slot, _expert(ex, e))

    def gpu_side(x: torch.Tensor, slot_ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return mxfp4_moe(x, weights.w13, weights.w13_scale, weights.w2, weights.w2_scale, w, slot_ids, LIMIT)

    moe = HybridMoE(kt, slots, gpu_side)
    moe.hot = HotLayer(slots, weights, lambda e: _expert(ex, e), decay, step_kind=step_kind)
    return moe, moe.hot


def _biased_routing(gen: torch.Generator, t: int, hot: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-2 routes where each token's first expert is one of `hot` and the second any other but the
    start placement's 0..SLOTS-1: those stay unrouted, the coldest, so which swaps a refresh makes
    never hinges on count noise near the swap margin (the seed is fresh every run)."""
    x = torch.randn(t, H, generator=gen).bfloat16()
    rows = []
    for _ in range(t):
        first = hot[int(torch.randint(len(hot), (1,), generator=gen))]
        rest = [e for e in torch.randperm(E, generator=gen).tolist() if e != first and e >= SLOTS]
        rows.append([first, rest[0]])
    w = torch.rand(t, TOPK, generator=gen) + 0.1
    return x, torch.tensor(rows, dtype=torch.int32), w / w.sum(-1, keepdim=True)


def test_slots_follow_the_routes_and_serve_as_a_static_placement(gen: torch.Generator) -> None:
    """Routes favouring experts 6 and 7 pull them into the two slots (which start with 0 and 1); the
    swapped layer's output is then bit for bit a static layer's holding the same experts, and both
    pass the float64 bound."""
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9)
    assert hot.slots.resident() == [0, 1]
    for step in range(1, 31):
        x, ids, w = _biased_routing(gen, 4, [6, 7])
        moe.forward(x, ids, w, RSF)
        if step % 5 == 0:
            hot.refresh()
    assert sorted(hot.slots.resident()) == [6, 7], hot.slots.resident()
    assert hot.swaps_done == 2
    assert hot.slots.mask.tolist() == [e in (6, 7) for e in range(E)]
    hits = hot.hit_counts()
    assert hits["prefill"] == (0, 0)  # without a step clock every forward counts as decode
    served, routed = hits["decode"]
    assert routed == 30 * 4 * TOPK
    assert 0.3 < served / routed < 0.75, (served, routed)  # the first expert of most tokens after the swap

    resident = hot.slots.resident()
    kt = _kt(ex, LIMIT)
    static_slots = SlotMap(kt.mask, SLOTS, "cpu")
    static_slots.place(resident)
    static = HybridMoE(kt, static_slots, _torch_side(ex, resident, LIMIT))
    x, ids, w = _biased_routing(gen, 16, [6, 7])
    out_hot = moe.forward(x, ids.clone(), w, RSF)
    out_static = static.forward(x, ids.clone(), w, RSF)
    assert not out_hot.isnan().any()
    assert torch.equal(out_hot, out_static)
    gpu_rows = torch.tensor([any(int(e) in resident for e in row) for row in ids])
    _check(out_hot, _reference(ex, x, ids, w, LIMIT), gpu_rows)


def test_no_swap_without_a_hotter_expert(gen: torch.Generator) -> None:
    """Routes spread over all experts leave the start placement alone (hysteresis)."""
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9)
    for _ in range(4):  # each expert exactly once a step: equal heat everywhere
        x = torch.randn(4, H, generator=gen).bfloat16()
        ids = torch.arange(E, dtype=torch.int32).view(4, TOPK)
        moe.forward(x, ids, torch.full((4, TOPK), 0.5), RSF)
    assert hot.refresh() == [] and hot.slots.resident() == [0, 1]


def test_fp8_slots_hold_the_expert_exactly(gen: torch.Generator) -> None:
    """The block-FP8 slot format (SGLang's dequantized CUDA layout): the written slot, times its
    [128, 128]-block scales, is the expert's MXFP4 value exactly (float64, no tolerance)."""
    ex = _experts(gen)
    w13 = torch.full((SLOTS, 2 * INTER, H), float("nan")).to(torch.float8_e4m3fn)
    s13 = torch.full((SLOTS, 2 * INTER // 128, H // 128), float("nan"))
    w2 = torch.full((SLOTS, H, INTER), float("nan")).to(torch.float8_e4m3fn)
    s2 = torch.full((SLOTS, H // 128, INTER // 128), float("nan"))
    weights = SlotWeights(w13, s13, w2, s2)
    weights.write(1, _expert(ex, 5))

    def value(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return w.double() * s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)

    want13 = torch.cat([_dequant64(ex["w1"][5], ex["w1s"][5]), _dequant64(ex["w3"][5], ex["w3s"][5])], 0)
    assert torch.equal(value(w13[1], s13[1]), want13)
    assert torch.equal(value(w2[1], s2[1]), _dequant64(ex["w2"][5], ex["w2s"][5]))
    assert value(w13[0], s13[0]).isnan().all()  # the other slot untouched
    # the load-time check: the slot holds what a swap writes, and another expert is told apart
    assert weights.mismatch(1, _expert(ex, 5)) is None
    assert "w13_weight:" in (weights.mismatch(1, _expert(ex, 4)) or "")
    assert weights.mismatch(0, _expert(ex, 5)) is not None


def test_packed_slots_pass_the_load_time_check(gen: torch.Generator) -> None:
    ex = _experts(gen)
    _moe, hot = _hot_moe(ex, decay=0.9)
    assert [hot.weights.mismatch(s, _expert(ex, e)) for s, e in enumerate(hot.slots.resident())] == [None, None]
    hot.weights.w2_scale[1, 3, 0] *= 2  # one scale off
    assert "w2_weight_scale_inv" in (hot.weights.mismatch(1, _expert(ex, 1)) or "")


def test_an_expert_of_the_wrong_shape_is_refused(gen: torch.Generator) -> None:
    ex = _experts(gen)
    weights = _slot_tensors()
    bad = _expert(ex, 0)
    bad = ExpertWeights(bad.w1[:, :-1], bad.w1_scale, bad.w3[:, :-1], bad.w3_scale, bad.w2, bad.w2_scale)
    try:
        weights.write(0, bad)
    except ValueError as err:
        assert "w13" in str(err) and "slot 0" in str(err)
    else:
        raise AssertionError("a wrong-shaped expert was written")


def test_experts_are_read_back_from_the_checkpoint(gen: torch.Generator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """CheckpointExperts finds each expert's six tensors across shards and hands back their bytes;
    a missing tensor is named."""
    from safetensors.torch import save_file

    from winport.hybrid.expert_source import CheckpointExperts, expert_names

    ex = _experts(gen)
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    for e in range(E):
        names = expert_names(3, e)
        for proj in ("w1", "w3", "w2"):
            shards[e % 2][names[proj]] = ex[proj][e].contiguous()
            shards[e % 2][names[f"{proj}_scale"]] = ex[proj + "s"][e].contiguous()
    save_file(shards[0], str(tmp_path / "a.safetensors"))
    save_file(shards[1], str(tmp_path / "b.safetensors"))
    read = CheckpointExperts(tmp_path, 3, E)
    for e in (0, 5):
        got, want = read(e), _expert(ex, e)
        for field in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
            assert torch.equal(getattr(got, field).view(torch.uint8), getattr(want, field).view(torch.uint8)), field
    try:
        CheckpointExperts(tmp_path, 3, E + 1)
    except KeyError as err:
        assert "layers.3.ffn.experts.8.w1.weight" in str(err)
    else:
        raise AssertionError("a missing expert went unnoticed")


def test_decode_steps_drive_the_refreshes(gen: torch.Generator, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The ModelRunner.forward hook tells prefill from decode routes, counts neither outside a step
    (SGLang's graph warm-ups and captures), refreshes every interval of decode steps (DSpark's
    verify steps among them), and the log line and the /metrics counters report both shares."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from winport.hybrid import hot_registry
    from winport.hybrid.hot_metrics import HotMetrics
    from winport.patches import kt_hot_experts

    monkeypatch.setenv("WINPORT_HOT_EXPERTS_INTERVAL", "5")
    monkeypatch.setattr(hot_registry, "_registry", None)
    assert hot_registry.active() is None
    reg = hot_registry.registry()
    prom = CollectorRegistry()
    reg.metrics = HotMetrics(prom)
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9, step_kind=reg.step_kind("cpu"))
    reg.add(hot)
    stray = HotLayer(hot.slots, hot.weights, hot.read_expert, 0.9)  # counting by a tensor of its own
    try:
        reg.add(stray)
    except ValueError as err:
        assert "step-kind tensor" in str(err)
    else:
        raise AssertionError("a layer outside the step clock was taken")

    def step(_runner: object, fb: SimpleNamespace, tokens: int = 4) -> str:
        x, ids, w = _biased_routing(gen, tokens, [6, 7])
        moe.forward(x, ids, w, RSF)
        return "out"

    def batch(mode: ForwardMode) -> SimpleNamespace:
        return SimpleNamespace(forward_mode=mode)

    step(None, batch(ForwardMode.DECODE), tokens=8)  # outside any step, as a graph warm-up runs
    assert hot.counts.read() == [0.0] * E and hot.hit_counts() == {"prefill": (0, 0), "decode": (0, 0)}
    assert kt_hot_experts._forward(step, None, batch(ForwardMode.EXTEND)) == "out"  # prefill: no step
    kt_hot_experts._forward(step, None, batch(ForwardMode.IDLE))  # neither counted nor a step
    for _ in range(3):
        kt_hot_experts._forward(step, None, batch(ForwardMode.DECODE))
    kt_hot_experts._forward(step, None, batch(ForwardMode.TARGET_VERIFY))
    assert hot.swaps_done == 0 and reg.steps == 4
    assert int(reg.step_kind("cpu")) == hot_registry.UNCOUNTED  # put back after each forward
    kt_hot_experts._forward(step, None, batch(ForwardMode.DECODE))
    assert hot.swaps_done == 2 and sorted(hot.slots.resident()) == [6, 7]
    hits = hot.hit_counts()
    assert hits["prefill"][1] == 4 * TOPK and hits["decode"][1] == 5 * 4 * TOPK, hits
    line = reg.report()
    decode_share, prefill_share = (hits[k][0] / hits[k][1] for k in ("decode", "prefill"))
    assert f"{decode_share:.1%} of {5 * 4 * TOPK} decode routes" in line, line
    assert f"{prefill_share:.1%} of {4 * TOPK} prefill routes" in line, line
    assert "2 swaps" in line, line

    def sample(name: str, **labels: str) -> float | None:
        return prom.get_sample_value(name, labels)

    assert sample("winport:expert_routes_total", step="decode") == 5 * 4 * TOPK
    assert sample("winport:expert_routes_total", step="prefill") == 4 * TOPK
    assert sample("winport:expert_routes_gpu_total", step="decode") == hits["decode"][0]
    assert sample("winport:expert_swaps_total") == 2
    assert sample("winport:expert_swap_bytes_total") == 2 * hot.weights.expert_bytes()
    monkeypatch.setenv("WINPORT_HOT_EXPERTS_INTERVAL", "0")
    try:
        hot_registry.interval()
    except ValueError as err:
        assert "WINPORT_HOT_EXPERTS_INTERVAL" in str(err)
    else:
        raise AssertionError("an interval of 0 was taken")
