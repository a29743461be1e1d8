"""Hot experts that follow the text (winport.hybrid.hot_experts + SlotMap.retire/admit), on CPU.

A synthetic routing stream: each step routes top-6 distinct experts of 64 drawn from a Zipf-like
distribution (weight 1/(rank+1)) over a permutation of the experts; at step PHASE the permutation
changes (the text moved from, say, code to prose). 16 GPU slots follow the decayed counts. The
oracle is the best static placement for each phase: the 16 most probable experts of that phase,
its hit rate measured on the same stream. The bars (written down, from the stream's own spread):
after CONVERGE steps of a phase the tracker's hit rate over the rest of the phase is within 0.05
of the oracle's; right after the shift the static placement of phase 1 collapses, and the tracker
is back within 0.08 of the oracle within RECOVER steps.
"""

from __future__ import annotations

import pytest
import torch

from winport.hybrid.hot_experts import DEFAULT_MARGIN, RouteCounts, Swap, plan_swaps
from winport.hybrid.slots import SlotMap

E, SLOTS, K, PHASE = 64, 16, 6, 3000
CONVERGE, RECOVER = 800, 600


def _stream(seed: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    ranks = 1.0 / torch.arange(1, E + 1, dtype=torch.float64)
    steps, oracle = [], []
    for _phase in range(2):
        perm = torch.randperm(E, generator=g)
        probs = torch.empty(E, dtype=torch.float64)
        probs[perm] = ranks / ranks.sum()
        oracle.append(perm[:SLOTS].tolist())
        for _ in range(PHASE):
            steps.append(torch.multinomial(probs, K, replacement=False, generator=g).view(1, K))
    return steps, oracle


def _hits(ids: torch.Tensor, on_gpu: set[int]) -> int:
    return sum(int(e) in on_gpu for e in ids.flatten().tolist())


def _run(steps: list[torch.Tensor], interval: int = 32) -> tuple[list[float], int]:
    mask = torch.zeros(E, dtype=torch.bool)
    slots = SlotMap(mask, SLOTS, "cpu")
    counts = RouteCounts(E, "cpu")
    per_step, swaps = [], 0
    for i, ids in enumerate(steps):
        routed = ids.clone()
        cpu_ids = slots.split_(routed)
        gpu = {int(e) for e in ids.flatten().tolist()} - {int(e) for e in cpu_ids.flatten().tolist() if e >= 0}
        per_step.append(len(gpu) / K)
        counts.update(ids)
        if (i + 1) % interval == 0:
            plan = plan_swaps(counts.read(), slots.resident())
            assert len(plan) <= 4
            for sw in plan:
                assert slots.retire(sw.slot) == sw.out
                slots.admit(sw.slot, sw.into)
            swaps += len(plan)
    return per_step, swaps


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.parametrize("seed", [0, 1])
def test_gpu_share_follows_a_shifting_hot_set(seed: int) -> None:
    steps, oracle = _stream(seed)
    tracked, swaps = _run(steps)
    for phase in range(2):
        lo, hi = phase * PHASE, (phase + 1) * PHASE
        best = set(oracle[phase])
        oracle_rate = _mean([_hits(s, best) / K for s in steps[lo + CONVERGE:hi]])
        rate = _mean(tracked[lo + CONVERGE:hi])
        assert rate >= oracle_rate - 0.05, (phase, rate, oracle_rate)
    # The first phase's best placement, kept static, loses most of its share after the shift...
    stale = _mean([_hits(s, set(oracle[0])) / K for s in steps[PHASE + CONVERGE:]])
    new_oracle = _mean([_hits(s, set(oracle[1])) / K for s in steps[PHASE + CONVERGE:]])
    assert stale < new_oracle - 0.15
    # ...while the tracker recovers within RECOVER steps.
    window = 200
    recovered = next(i for i in range(PHASE, 2 * PHASE - window)
                     if _mean(tracked[i:i + window]) >= new_oracle - 0.08)
    assert recovered - PHASE <= RECOVER, recovered - PHASE
    assert swaps < 2 * PHASE / 32 * 4  # bounded traffic: never every slot every refresh


def test_equal_heat_never_trades_places() -> None:
    assert DEFAULT_MARGIN == 2.0  # the bars below are written for it
    counts = [10.0] * 8
    assert plan_swaps(counts, [0, 1, 2, 3]) == []
    counts[5] = 20.1  # more than 2 x 10
    assert plan_swaps(counts, [0, 1, 2, 3]) == [Swap(0, 0, 5)]
    counts[6] = 19.9  # not enough
    assert plan_swaps(counts, [0, 1, 2, 3]) == [Swap(0, 0, 5)]
    assert plan_swaps(counts, [0, 1, 2, 3], margin=1.25) == [Swap(0, 0, 5), Swap(1, 1, 6)]
    assert plan_swaps([0.0, 3.0, 0.0], [-1, -1]) == [Swap(0, -1, 1)]  # empty slots take routed experts only
    with pytest.raises(ValueError, match="forever"):
        plan_swaps(counts, [0], margin=0.9)


def test_counts_decay_and_ignore_no_expert_ids() -> None:
    c = RouteCounts(4, "cpu", decay=0.5)
    c.update(torch.tensor([[0, 1], [1, -1]]))
    assert c.read() == [1.0, 2.0, 0.0, 0.0]
    c.update(torch.tensor([[3, -1]]))
    assert c.read() == [0.5, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="decay"):
        RouteCounts(4, "cpu", decay=0.0)


def test_a_swap_never_serves_a_half_copied_slot() -> None:
    """Between retire and admit the CPU serves both experts; the slot is read again only once the
    new expert's weights are in it (a fake weight tensor stands for the copy)."""
    mask = torch.zeros(8, dtype=torch.bool)
    slots = SlotMap(mask, 2, "cpu")
    weights = torch.arange(8, dtype=torch.float32)  # expert e's "weights" are the number e
    slot_weights = torch.tensor([0.0, 1.0])  # slots 0 and 1 hold experts 0 and 1

    def served() -> dict[int, str]:
        ids = torch.arange(8).view(1, 8)
        routed = ids.clone()
        cpu = slots.split_(routed)
        out = {}
        for e in range(8):
            slot = int(routed[0, e])
            if slot >= 0:
                assert slot_weights[slot] == weights[e], f"expert {e} read from a slot holding another"
                out[e] = "gpu"
            else:
                assert int(cpu[0, e]) == e
                out[e] = "cpu"
        return out

    assert served()[0] == "gpu" and mask[0]
    assert slots.retire(0) == 0
    assert served()[0] == "cpu" and served()[5] == "cpu" and not mask[0]
    slot_weights[0] = float("nan")  # the copy is under way: the slot holds nothing valid
    served()  # nothing reads slot 0 now
    slot_weights[0] = weights[5]  # copy done
    slots.admit(0, 5)
    assert served()[5] == "gpu" and mask[5] and slots.resident() == [5, 1]
    with pytest.raises(ValueError, match="not an empty slot"):
        slots.admit(0, 6)
    with pytest.raises(ValueError, match="already sits"):
        slots.retire(0)
        slots.admit(0, 1)
