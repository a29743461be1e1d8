"""Fuzzing of header, metadata and tensor-info parsing: any malformed file gives GGUFError."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gguf._helpers import random_blocks, write_gguf
from winport.gguf import GGUFError
from winport.gguf.reader import GGUFFile

_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


def _seed_file(tmp: Path) -> bytes:
    rng = np.random.default_rng(1)
    p = write_gguf(
        tmp / "seed.gguf",
        "deepseek41",
        {
            "blk.0.attn_norm.weight": ("F32", rng.standard_normal(32).astype(np.float32)),
            "blk.0.attn_q_a.weight": ("Q8_0", random_blocks(rng, "Q8_0", 2).reshape(2, 34)),
        },
        {"s": "abc", "n": 5, "arr": [1, 2, 3], "sarr": ["a", "bc"]},
    )
    return p.read_bytes()


def _parse(tmp: Path, data: bytes) -> None:
    p = tmp / "fuzz.gguf"
    p.write_bytes(data)
    try:
        with GGUFFile(p) as f:
            for t in f.tensors.values():  # a file that parses must also read
                t.raw()
    except GGUFError as exc:
        assert str(p) in str(exc)


def test_fuzz_byte_mutations(tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    seed = _seed_file(tmp)
    # Mutations concentrate on the header, metadata and tensor-info region (before the data).
    meta_end = seed.index(b"blk.0.attn_q_a.weight") + 64

    @_SETTINGS
    @given(
        edits=st.lists(st.tuples(st.integers(0, meta_end), st.integers(0, 255)), min_size=1, max_size=6),
        cut=st.one_of(st.none(), st.integers(0, len(seed))),
    )
    def run(edits: list[tuple[int, int]], cut: int | None) -> None:
        b = bytearray(seed)
        for pos, val in edits:
            b[pos] = val
        if cut is not None:
            b = b[:cut]
        _parse(tmp, bytes(b))

    run()


def test_fuzz_big_fields(tmp_path_factory) -> None:
    """Overwrite 4/8-byte fields (counts, lengths, dims, offsets, type ids) with extreme values."""
    tmp = tmp_path_factory.mktemp("fuzz2")
    seed = _seed_file(tmp)
    meta_end = seed.index(b"blk.0.attn_q_a.weight") + 64
    extremes = st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, 1 << 40, 255, 4, 9])

    @_SETTINGS
    @given(pos=st.integers(0, meta_end), value=extremes, wide=st.booleans())
    def run(pos: int, value: int, wide: bool) -> None:
        b = bytearray(seed)
        fmt = "<Q" if wide else "<I"
        value &= (1 << (64 if wide else 32)) - 1
        field = struct.pack(fmt, value)
        b[pos : pos + len(field)] = field
        _parse(tmp, bytes(b[: len(seed)]))

    run()


def test_fuzz_random_headers(tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("fuzz3")

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        version=st.integers(0, 2**32 - 1) | st.sampled_from([2, 3]),
        n_t=st.integers(0, 2**64 - 1) | st.integers(0, 4),
        n_kv=st.integers(0, 2**64 - 1) | st.integers(0, 4),
        tail=st.binary(max_size=200),
    )
    def run(version: int, n_t: int, n_kv: int, tail: bytes) -> None:
        _parse(tmp, b"GGUF" + struct.pack("<IQQ", version, n_t, n_kv) + tail)

    run()
