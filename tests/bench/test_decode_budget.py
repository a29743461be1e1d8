"""scripts/bench/decode_budget.py: the per-token decode budget's arithmetic, against hand sums and a
Monte Carlo reference, its inputs file, and its output."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.bench._script import load


@pytest.fixture(scope="module")
def db() -> ModuleType:
    return load("decode_budget")


@pytest.mark.parametrize(("pool", "per_token", "tokens"), [(297, 0.9, 1), (297, 0.9, 5), (87, 5.1, 5), (16, 3.0, 8)])
def test_distinct_experts_match_a_simulation(db: ModuleType, pool: int, per_token: float, tokens: int) -> None:
    # The reference: draw each token's routes into the pool (each expert independently with probability
    # per_token / pool), count the distinct experts over the block; 40,000 blocks.
    rng = np.random.default_rng(7)
    hits = rng.random((40_000, tokens, pool)) < per_token / pool
    simulated = hits.any(axis=1).sum(axis=1).mean()
    assert db.distinct(pool, per_token, tokens) == pytest.approx(simulated, rel=0.01)
    assert db.distinct(0, per_token, tokens) == 0.0 and db.distinct(pool, 0.0, tokens) == 0.0


def _inputs() -> dict[str, float]:
    return {"dense_layer_us_t1": 100.0, "dense_layer_us_t5": 200.0, "attention_layer_us_t1": 10.0,
            "attention_layer_us_t5": 30.0, "indexer_us": 50.0, "gpu_moe_copy_share_t1": 0.5,
            "gpu_moe_copy_share_t5": 0.5, "kt_round_trip_ms": 0.25, "overlap": 1.0, "sampling_ms": 0.05,
            "overhead_ms": 1.0, "head_copy_share": 0.5}


def test_a_decode_step_by_hand(db: ModuleType) -> None:
    model = db.Model(layers=10, index_layers=2, experts=100, top_k=4, expert_bytes=10_000_000, head_bytes=500_000_000)
    machine = db.Machine("m", gpu_gbs=1000.0, cores=10, pair_ms={1: 2.0, 8: 4.0}, threads_scaling=0.5, dram_gbs=50.0)
    step = db.budget(_inputs(), model, machine, hit=0.75, slots=20, tokens=1, scale=2.0)
    # GPU: 20 slots, 3 of the 4 routes a token: distinct 20 x (1 - (1 - 3/20)) = 3 experts x 10 MB at
    # 1000 GB/s x 0.5 = 0.06 ms. CPU: 1 pair x 2 ms / (10 x 0.5) = 0.4 ms (the DRAM floor, 1 x 10 MB / 50
    # GB/s = 0.2 ms, is lower). MoE = max(0.06, 0.4 + 0.25) = 0.65 ms a layer.
    assert step.gpu_experts_read == pytest.approx(3.0) and step.cpu_experts_read == pytest.approx(1.0)
    want = {"dense GEMMs": 10 * 0.1 * 2.0, "attention": 10 * 0.01, "indexer": 2 * 0.05, "routed experts": 10 * 0.65,
            "embedding and head": 500e6 / (1000e9 * 0.5) * 1e3, "engram rows": 0.0, "sampling": 0.05,
            "scheduler and launch": 1.0}
    assert step.lines == pytest.approx(want)
    assert step.moe == pytest.approx({"GPU experts": 0.6, "CPU experts": 4.0, "kt-kernel round trip": 2.5,
                                      "the wait (GPU idle for the CPU)": 10 * (0.65 - 0.06)})
    assert step.ms == pytest.approx(sum(want.values()))
    # Every expert on the GPU: no kt-kernel, so no round trip and no wait.
    allgpu = db.budget(_inputs(), model, machine, hit=1.0, slots=100, tokens=1, scale=2.0)
    assert allgpu.moe["kt-kernel round trip"] == 0.0 and allgpu.moe["the wait (GPU idle for the CPU)"] == 0.0
    # A verify block of 5 prices its pairs at the measured batch at or above 5 (8 here): 5 pairs x 4 ms / 5.
    verify = db.budget(_inputs(), model, machine, hit=0.75, slots=20, tokens=5, scale=2.0)
    assert verify.moe["CPU experts"] == pytest.approx(10 * 5 * 4.0 / 5)


def test_the_shipped_inputs_name_their_sources(db: ModuleType) -> None:
    doc = json.loads(Path(db.INPUTS).read_text())
    assert doc["format"] == db.FORMAT
    for name, entry in doc["measured"].items():
        assert isinstance(entry["source"], str) and "20" in entry["source"], name  # a date
        assert entry["unit"], name
    inp = db.load_inputs(db.INPUTS)
    model = db.v41_flash()
    assert (model.layers, model.experts, model.top_k, model.index_layers) == (40, 384, 6, 8)
    assert model.expert_bytes == 18_800_640
    full = db.derived(inp, model)
    assert 0 < full["head_copy_share"] <= 1 and full["overhead_ms"] >= 0
    # one core at batch 1: 19.5 ms for 6 pairs = 3.25 ms a pair = 18.8 MB / 3.25 ms = 5.8 GB/s, as recorded
    assert db.pair_ms(inp["kt_core_ms"], 6)[1] == pytest.approx(3.25)
    assert math.isclose(18_800_640 / 3.25e-3 / 1e9, 5.78, rel_tol=1e-2)


def test_bad_inputs_name_the_file(db: ModuleType, tmp_path: Path) -> None:
    bad = tmp_path / "inputs.json"
    bad.write_text(json.dumps({"format": "something else", "measured": {}}))
    with pytest.raises(SystemExit, match=f"{bad}: format 'something else'"):
        db.load_inputs(str(bad))
    bad.write_text(json.dumps({"format": db.FORMAT, "measured": {"copy_gbs": 4217}}))
    with pytest.raises(SystemExit, match="needs a 'value'"):
        db.load_inputs(str(bad))
    with pytest.raises(SystemExit, match="--hit-rates: 1.5"):
        db.main(["--hit-rates", "1.5"])
    with pytest.raises(SystemExit, match="--slots 400"):
        db.main(["--slots", "400"])


def test_the_budget_prints_its_assumptions_and_verdict(db: ModuleType, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "budget.json"
    db.main(["--workstation", "--json", str(out_json)])
    text = capsys.readouterr().out
    for needle in ("== H200 + its host ==", "== RTX PRO 6000 + Threadripper PRO 7965WX ==", "assumes: GPU 1792 GB/s",
                   "not on Zen 4", "DDR5-6000", "-- hit rate 85%", "kt-kernel round trip", "the wait",
                   "DSpark verify step",
                   "at 85% hits:", "largest lines of a decode step:", "levers on RTX PRO 6000",
                   "model check: one hybrid layer, 71 slots"):
        assert needle in text, needle
    assert re.search(r"engram rows +0\.00 ms  \(not measured: 0\)", text)
    rows = json.loads(out_json.read_text())["rows"]
    assert len(rows) == 2 * 3
    for r in rows:
        assert math.isfinite(r["decode_tok_s"]) and r["decode_tok_s"] > 0
        assert r["decode_ms"] == pytest.approx(sum(r["decode"].values()))
    # more hits, a faster step, on each machine
    for machine in {r["machine"] for r in rows}:
        speeds = [r["decode_tok_s"] for r in rows if r["machine"] == machine]
        assert speeds == sorted(speeds)
