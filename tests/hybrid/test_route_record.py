"""Route records (winport.hybrid.route_record): counting in the forward, the file, and the placement
a later server starts from. References are numpy's bincount and lexsort, not the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from winport.hybrid import hot_registry, route_record
from winport.hybrid.hot_swap import DECODE, PREFILL, UNCOUNTED, step_kind_tensor
from winport.hybrid.route_record import LayerRoutes, RecordError, RouteRecord, RouteTally

E, K = 16, 3


@pytest.fixture()
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261203)


def _ids(gen: torch.Generator, tokens: int) -> torch.Tensor:
    ids = torch.randint(0, E, (tokens, K), generator=gen)
    ids[torch.rand(tokens, K, generator=gen) < 0.1] = -1  # the router's "no expert"
    return ids


def test_tally_counts_each_step_kind_and_nothing_outside_a_step(gen: torch.Generator) -> None:
    kind = step_kind_tensor("cpu")
    tally = RouteTally(E, kind)
    want = {PREFILL: np.zeros(E, np.int64), DECODE: np.zeros(E, np.int64)}
    rows = {PREFILL: 0, DECODE: 0}
    for step, k in enumerate([UNCOUNTED, PREFILL, DECODE, DECODE, UNCOUNTED, PREFILL, DECODE]):
        kind.fill_(k)
        ids = _ids(gen, 5 + step)
        if step == 3:
            ids[-2:] = -1  # a captured batch's padding, masked by SGLang's top-k: no tokens
        tally.observe(ids)
        if k != UNCOUNTED:
            flat = ids.reshape(-1).numpy()
            want[k] += np.bincount(flat[flat >= 0], minlength=E)
            rows[k] += int((ids >= 0).any(dim=1).sum())
    entry = tally.read()
    assert entry["prefill"] == want[PREFILL].tolist() and entry["decode"] == want[DECODE].tolist()
    assert entry["tokens"] == {"prefill": rows[PREFILL], "decode": rows[DECODE]}
    assert sum(want[DECODE]) > 0 and sum(want[PREFILL]) > 0


def _record(gen: torch.Generator, layers: tuple[int, ...] = (0, 1, 2, 3)) -> RouteRecord:
    def counts() -> list[int]:
        return torch.randint(0, 6, (E,), generator=gen).tolist()  # small range: ties happen

    return RouteRecord(E, K, {i: LayerRoutes(counts(), counts(), {"prefill": 40, "decode": 30}) for i in layers})


def test_file_round_trip_and_the_placement_it_gives(gen: torch.Generator, tmp_path: Path) -> None:
    rec = _record(gen)
    path = tmp_path / "routes.json"
    route_record.save(rec, path)
    assert [p.name for p in tmp_path.iterdir()] == ["routes.json"]  # no temporary file left
    back = route_record.load(path, E)
    assert back == rec
    for layer, r in rec.layers.items():
        # most decode routes first, then most prefill routes, then the lower id
        order = np.lexsort((np.arange(E), -np.array(r.prefill), -np.array(r.decode))).tolist()
        for n in (0, 1, 5, E):
            assert back.placement(layer, n) == order[:n]
    with pytest.raises(RecordError, match="no route counts for MoE layer 9"):
        back.placement(9, 2)
    with pytest.raises(RecordError, match=f"{E + 1} GPU slots for {E} experts"):
        back.placement(0, E + 1)


def _entry() -> dict[str, object]:
    return {"prefill": [1] * E, "decode": [2] * E, "tokens": {"prefill": 1, "decode": 1}}


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(format="other/1"), "field 'format' is 'other/1'"),
    (lambda d: d.update(num_experts=E + 1), f"field 'num_experts' is {E + 1}, but the model has {E}"),
    (lambda d: d.update(top_k=0), "fields 'num_experts'"),
    (lambda d: d.update(layers={}), "field 'layers'"),
    (lambda d: d["layers"]["0"].update(decode=[1] * (E - 1)), "layers.0.decode: must be a list of 16"),
    (lambda d: d["layers"]["0"].update(prefill=[-1] * E), "layers.0.prefill: must be a list"),
    (lambda d: d["layers"]["0"].update(tokens={"prefill": 1}), "layers.0.tokens"),
    (lambda d: d["layers"].update(x=_entry()), "layers.x: a layer id must be an integer"),
])
def test_a_bad_record_is_refused_naming_file_and_field(tmp_path: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = {"format": route_record.FORMAT, "num_experts": E, "top_k": K, "layers": {"0": _entry(), "1": _entry()}}
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(RecordError, match=message) as err:
        route_record.load(path, E)
    assert str(path) in str(err.value)


def test_unreadable_and_non_json_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="cannot read it"):
        route_record.load(tmp_path / "missing.json")
    (tmp_path / "cut.json").write_text('{"format": "winport-expert', encoding="utf-8")
    with pytest.raises(RecordError, match="not JSON"):
        route_record.load(tmp_path / "cut.json")


def test_the_model_check_wants_every_moe_layer_and_the_expert_count(gen: torch.Generator) -> None:
    rec = _record(gen)
    config = {"n_routed_experts": E, "num_hidden_layers": 4, "first_k_dense_replace": 0, "moe_layer_freq": 1}
    route_record.check_model(rec, config, "r.json")
    with pytest.raises(RecordError, match="recorded from another model"):
        route_record.check_model(rec, {**config, "num_hidden_layers": 5}, "r.json")
    with pytest.raises(RecordError, match="but the model has 8 routed experts"):
        route_record.check_model(rec, {**config, "n_routed_experts": 8}, "r.json")
    route_record.check_model(_record(gen, (1, 2, 3)), {**config, "first_k_dense_replace": 1}, "r.json")


def test_placement_env_starts_the_slots_from_the_record(gen: torch.Generator, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.hybrid.slots import SlotMap

    monkeypatch.delenv("WINPORT_EXPERT_PLACEMENT", raising=False)
    assert route_record.initial_experts(0, 4, E) is None  # without the file: SlotMap's 0..N-1
    rec = _record(gen)
    path = tmp_path / "routes.json"
    route_record.save(rec, path)
    monkeypatch.setenv("WINPORT_EXPERT_PLACEMENT", str(path))
    route_record._placement_record.cache_clear()
    mask = torch.zeros(E, dtype=torch.bool)
    slots = SlotMap(mask, 4, "cpu")
    slots.place(route_record.initial_experts(2, 4, E) or [])
    assert slots.resident() == rec.placement(2, 4)
    assert mask.nonzero().flatten().tolist() == sorted(rec.placement(2, 4))
    with pytest.raises(RecordError, match="the model has 8 routed experts"):
        route_record.initial_experts(2, 4, 8)


def test_the_record_is_written_when_the_scheduler_idles_after_counted_steps(
        gen: torch.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step clock marks the record changed at each counted forward; Scheduler.on_idle's hook
    writes it then, and only then."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from winport.patches import kt_hot_experts

    monkeypatch.setattr(hot_registry, "_registry", None)
    reg = hot_registry.registry()
    path = tmp_path / "routes.json"
    reg.recorder = route_record.RouteRecorder(path, E, K)
    tallies = [RouteTally(E, reg.step_kind("cpu")) for _ in range(2)]
    for i, t in enumerate(tallies):
        reg.recorder.add(i, t)
    idled: list[int] = []

    def on_idle(_scheduler: object) -> None:
        idled.append(1)

    kt_hot_experts._on_idle(on_idle, None)
    assert not path.exists() and idled == [1]  # nothing counted yet: nothing written

    seen: list[torch.Tensor] = []

    def forward(_runner: object, _fb: object) -> None:
        seen.append(_ids(gen, 6))
        for t in tallies:
            t.observe(seen[-1])

    for t in tallies:
        t.observe(_ids(gen, 9))  # outside a step (a graph warm-up): not counted
    kt_hot_experts._forward(forward, None, SimpleNamespace(forward_mode=ForwardMode.EXTEND))
    kt_hot_experts._forward(forward, None, SimpleNamespace(forward_mode=ForwardMode.DECODE))
    kt_hot_experts._on_idle(on_idle, None)
    rec = route_record.load(path, E)
    assert sorted(rec.layers) == [0, 1] and reg.recorder.writes == 1
    assert all(r.tokens == {"prefill": 6, "decode": 6} for r in rec.layers.values())
    for kind, ids in zip(("prefill", "decode"), seen, strict=True):
        flat = ids.reshape(-1).numpy()
        want = np.bincount(flat[flat >= 0], minlength=E).tolist()
        assert all(getattr(r, kind) == want for r in rec.layers.values()), kind
    kt_hot_experts._on_idle(on_idle, None)
    assert reg.recorder.writes == 1 and len(idled) == 3  # idle again, nothing new: no second write


def test_serve_flags_are_checked_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--record-experts and --expert-placement: passed to the server's processes when they can work,
    refused with the reason (and the file and field at fault) when they cannot."""
    from winport.demo.config import demo_config
    from winport.serve import command

    config = demo_config()
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: folder)
    for name in ("WINPORT_KT_MOE", "WINPORT_EXPERTS_RECORD", "WINPORT_EXPERT_PLACEMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(command, "_cuda_available", lambda: False)
    out = tmp_path / "routes.json"
    plan = command.build_plan(["--demo", "--record-experts", str(out)])
    assert plan.env["WINPORT_EXPERTS_RECORD"] == str(out.resolve())
    with pytest.raises(command.ServeError, match="is not a folder this user can write to"):
        command.build_plan(["--demo", "--record-experts", str(tmp_path / "no" / "routes.json")])
    monkeypatch.setenv("WINPORT_KT_MOE", "0")
    with pytest.raises(command.ServeError, match="this server does not use them"):
        command.build_plan(["--demo", "--record-experts", str(out)])
    monkeypatch.delenv("WINPORT_KT_MOE")

    experts, layers = config["n_routed_experts"], range(config["num_hidden_layers"])
    good = RouteRecord(experts, 2, {i: LayerRoutes([1] * experts, [2] * experts, {"prefill": 1, "decode": 1})
                                    for i in layers})
    route_record.save(good, out)
    with pytest.raises(command.ServeError, match="places GPU expert slots, and this server has none"):
        command.build_plan(["--demo", "--expert-placement", str(out)])  # the CPU: no slots
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    with pytest.raises(command.ServeError, match="has none"):
        command.build_plan(["--demo", "--expert-placement", str(out)])  # CUDA, all experts on the GPU
    plan = command.build_plan(["--demo", "--gpu-experts", "2", "--expert-placement", str(out)])
    assert plan.env["WINPORT_EXPERT_PLACEMENT"] == str(out.resolve())
    other = tmp_path / "other.json"
    route_record.save(RouteRecord(experts * 2, 2, {i: LayerRoutes([1] * experts * 2, [1] * experts * 2,
                                                                  {"prefill": 1, "decode": 1}) for i in layers}), other)
    with pytest.raises(command.ServeError, match=f"{other}: field 'num_experts' is {experts * 2}"):
        command.build_plan(["--demo", "--gpu-experts", "2", "--expert-placement", str(other)])
