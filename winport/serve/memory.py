"""--vram-gib N -> SGLang's static memory fraction, with clear errors for impossible N.

SGLang sizes its GPU memory by `--mem-fraction-static` (weights + KV cache as a share of the
card's total). winport takes an absolute budget instead, because users think in GiB and share the
card with a desktop. Expert placement by budget is a later step; today the budget caps SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
# Left to the CUDA context, the allocator's fragmentation and activations outside the static
# pools; SGLang's own default fractions leave 10-15% of the card for the same reasons.
MIN_HEADROOM_GIB = 1.5
MIN_BUDGET_GIB = 1.0


class VramError(ValueError):
    """An impossible --vram-gib (the message carries the numbers)."""


@dataclass(frozen=True)
class VramPlan:
    """The budget and what it becomes for SGLang."""

    budget_gib: float
    total_gib: float
    mem_fraction_static: float

    def describe(self) -> str:
        """One line for the log."""
        return (f"--vram-gib {self.budget_gib:g}: {self.budget_gib:g} of {self.total_gib:.1f} GiB "
                f"-> --mem-fraction-static {self.mem_fraction_static:.4f}")


def plan_vram(budget_gib: float, total_bytes: int) -> VramPlan:
    """Translate a budget in GiB into SGLang's static memory fraction of a card with total_bytes."""
    total_gib = total_bytes / GIB
    if budget_gib != budget_gib or budget_gib <= 0:  # NaN or not positive
        raise VramError(f"--vram-gib must be a positive number of GiB, got {budget_gib}")
    if budget_gib < MIN_BUDGET_GIB:
        raise VramError(f"--vram-gib {budget_gib:g} is below the {MIN_BUDGET_GIB:g} GiB the server needs at least")
    usable = total_gib - MIN_HEADROOM_GIB
    if budget_gib > usable:
        raise VramError(
            f"--vram-gib {budget_gib:g} is more than this GPU can give: it has {total_gib:.1f} GiB, "
            f"of which {usable:.1f} GiB are usable after {MIN_HEADROOM_GIB:g} GiB of headroom"
        )
    return VramPlan(budget_gib, total_gib, budget_gib / total_gib)
