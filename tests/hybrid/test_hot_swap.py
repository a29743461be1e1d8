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


def _hot_moe(ex: dict[str, torch.Tensor], decay: float) -> tuple[HybridMoE, HotLayer]:
    kt = _kt(ex, LIMIT)
    slots = SlotMap(kt.mask, SLOTS, "cpu")
    weights = _slot_tensors()
    for slot, e in enumerate(slots.resident()):
        weights.write(slot, _expert(ex, e))

    def gpu_side(x: torch.Tensor, slot_ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return mxfp4_moe(x, weights.w13, weights.w13_scale, weights.w2, weights.w2_scale, w, slot_ids, LIMIT)

    moe = HybridMoE(kt, slots, gpu_side)
    moe.hot = HotLayer(slots, weights, lambda e: _expert(ex, e), decay)
    return moe, moe.hot


def _biased_routing(gen: torch.Generator, t: int, hot: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-2 routes where each token's first expert is one of `hot` and the second any other."""
    x = torch.randn(t, H, generator=gen).bfloat16()
    rows = []
    for _ in range(t):
        first = hot[int(torch.randint(len(hot), (1,), generator=gen))]
        rest = [e for e in torch.randperm(E, generator=gen).tolist() if e != first]
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
    served, routed = hot.hit_counts()
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
    """The ModelRunner.forward hook counts decode forwards only and refreshes every interval; the
    log line reports the share the GPU served and the swaps."""
    from types import SimpleNamespace

    from winport.hybrid import hot_registry
    from winport.patches import kt_hot_experts

    monkeypatch.setenv("WINPORT_HOT_EXPERTS_INTERVAL", "5")
    monkeypatch.setattr(hot_registry, "_registry", None)
    assert hot_registry.active() is None
    ex = _experts(gen)
    moe, hot = _hot_moe(ex, decay=0.9)
    hot_registry.registry().add(hot)

    def batch(decode: bool) -> SimpleNamespace:
        return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode))

    def step(_runner: object, fb: SimpleNamespace) -> str:
        x, ids, w = _biased_routing(gen, 4, [6, 7])
        moe.forward(x, ids, w, RSF)
        return "out"

    assert kt_hot_experts._forward(step, None, batch(False)) == "out"  # a prefill: not a decode step
    for _ in range(4):
        kt_hot_experts._forward(step, None, batch(True))
    assert hot.swaps_done == 0 and hot_registry.active().steps == 4  # type: ignore[union-attr]
    kt_hot_experts._forward(step, None, batch(True))
    assert hot.swaps_done == 2 and sorted(hot.slots.resident()) == [6, 7]
    line = hot_registry.active().report()  # type: ignore[union-attr]
    assert "of 48 routes" in line and "2 swaps" in line, line
    monkeypatch.setenv("WINPORT_HOT_EXPERTS_INTERVAL", "0")
    try:
        hot_registry.interval()
    except ValueError as err:
        assert "WINPORT_HOT_EXPERTS_INTERVAL" in str(err)
    else:
        raise AssertionError("an interval of 0 was taken")
