"""Fixtures of the patch tests."""

from __future__ import annotations

import time

import pytest
import torch

# Fresh random inputs each run, seeded from the clock; the seed is printed so a failure can be replayed.
SEED = int(time.time() * 1e6) % (2**31)


@pytest.fixture
def gen() -> torch.Generator:
    """A torch generator seeded with this run's SEED (printed)."""
    print(f"seed {SEED}")
    return torch.Generator().manual_seed(SEED)
