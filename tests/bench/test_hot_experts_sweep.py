"""scripts/bench/hot_experts_sweep.py: its routing stream and hit accounting against direct counts."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.bench._script import load


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    return load("hot_experts_sweep")


def test_the_stream_routes_distinct_experts_by_the_phase_permutation(sweep: ModuleType) -> None:
    p = sweep.popularity(1.0, 1.2)
    assert torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64)) and bool((p[:-1] > p[1:]).all())
    routes, perms = sweep.stream(p, 400, 100, seed=5)
    assert routes.shape == (400, sweep.TOP_K) and len(perms) == 4
    assert all(len(set(r.tolist())) == sweep.TOP_K for r in routes)
    # Each phase's most popular expert (rank 0 of its permutation) is its most routed one.
    for i, perm in enumerate(perms):
        ids = routes[i * 100:(i + 1) * 100].flatten()
        assert int(torch.bincount(ids, minlength=sweep.EXPERTS).argmax()) == int(perm[0])


def test_without_refreshes_the_share_is_the_start_placement(sweep: ModuleType) -> None:
    """An interval longer than the stream never swaps: the share is the routes to experts 0..slots-1,
    counted directly; the oracle is the routes to each phase's top `slots`."""
    p = sweep.popularity(1.0, 1.2)
    routes, perms = sweep.stream(p, 300, 150, seed=2)
    r = sweep.simulate(routes, perms, 150, 40, interval=10_000, decay=0.99, lag=4, settle=50)
    n = routes.numel()
    assert r["swaps_per_token"] == 0
    assert r["share"] == pytest.approx(float((routes < 40).sum()) / n)
    oracle = sum(int(torch.isin(routes[i * 150:(i + 1) * 150], perms[i][:40]).sum()) for i in range(2))
    assert r["oracle"] == pytest.approx(oracle / n)


def test_following_slots_approach_the_oracle_and_pay_in_swaps(sweep: ModuleType) -> None:
    """Refreshing slots end near each phase's best static placement (share / oracle above 0.8 over a
    3,000-token phase, where the start placement serves a random 40 of 384) and count their swaps."""
    p = sweep.popularity(1.0, 1.2)
    routes, perms = sweep.stream(p, 3000, 3000, seed=3)
    r = sweep.simulate(routes, perms, 3000, 40, interval=16, decay=0.99, lag=4, settle=100)
    start = float((routes < 40).sum()) / routes.numel()
    assert r["share"] / r["oracle"] > 0.8 and r["share"] > start + 0.2, (r, start)
    assert 0 < r["swaps_per_token"] <= 4 / 16
