"""Fixtures of the GGUF tests (their helpers are in tests/gguf/_helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs each run (the seed is printed on failure by pytest's repr)."""
    seed = int(np.random.SeedSequence().entropy % (1 << 32))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
