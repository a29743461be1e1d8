"""Reader: files written by gguf-py's writer, split shards, and every error case."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.gguf._helpers import random_blocks, write_gguf, write_raw_gguf
from winport.gguf import GGUFError, open_gguf
from winport.gguf.reader import GGUFFile, drop_file_page_cache


def _sample(rng: np.random.Generator) -> dict:
    return {
        "a.f32": ("F32", rng.standard_normal((3, 5)).astype(np.float32)),
        "a.f16": ("F16", rng.standard_normal((7,)).astype(np.float16)),
        "a.bf16": ("BF16", rng.integers(0, 0x7F00, (2, 4), dtype=np.uint16)),
        "a.q8": ("Q8_0", random_blocks(rng, "Q8_0", 4).reshape(2, 68)),
        "a.q4k": ("Q4_K", random_blocks(rng, "Q4_K", 2).reshape(2, 144)),
        "a.mxfp4": ("MXFP4", random_blocks(rng, "MXFP4", 12).reshape(3, 2, 34)),
    }


def test_roundtrip_gguf_py_writer(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = _sample(rng)
    kv = {"t.str": "héllo", "t.u32": 7, "t.f32": 0.5, "t.bool": True, "t.arr": [1, 2, 3], "t.sarr": ["x", "yz"]}
    p = write_gguf(tmp_path / "m.gguf", "deepseek41", tensors, kv)
    with open_gguf(p) as m:
        assert m.arch == "deepseek41"
        assert m.get("t.str") == "héllo" and m.get("t.u32") == 7 and m.get("t.bool") is True
        assert m.get("t.f32") == 0.5 and m.get("t.sarr") == ["x", "yz"]
        assert m.get("t.arr").tolist() == [1, 2, 3]
        # Cross-check names, types, shapes, offsets against gguf-py's own reader.
        ref = gguf.GGUFReader(str(p))
        for rt in ref.tensors:
            t = m[rt.name]
            assert t.type.id == int(rt.tensor_type)
            assert t.ggml_dims == tuple(int(d) for d in rt.shape)
            assert t.offset == rt.data_offset and t.nbytes == rt.n_bytes
            np.testing.assert_array_equal(t.raw(), np.asarray(rt.data).view(np.uint8).reshape(-1))
        f32 = m["a.f32"]
        assert f32.shape == (3, 5)
        np.testing.assert_array_equal(f32.plain(), tensors["a.f32"][1])
        assert not f32.raw().flags.writeable  # a view of the read-only map, not a copy
        assert m["a.mxfp4"].shape == (3, 2, 64)
        np.testing.assert_array_equal(m["a.bf16"].plain(), tensors["a.bf16"][1])


def test_split_shards(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = _sample(rng)
    w = gguf.GGUFWriter(str(tmp_path / "s.gguf"), "deepseek4", split_max_tensors=2)
    w.add_uint32("deepseek4.block_count", 0)
    for name, (tname, arr) in tensors.items():
        if tname in ("F32", "F16"):
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr).view(np.uint8), raw_dtype=gguf.GGMLQuantizationType[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(tmp_path.glob("s-*-of-*.gguf"))
    assert len(shards) == 3
    with open_gguf(shards[1]) as m:  # any shard opens the whole model
        assert len(m.paths) == 3 and set(m.tensors) == set(tensors)
        assert m.get("deepseek4.block_count") == 0
        for name, (tname, arr) in tensors.items():
            if tname == "F32":
                np.testing.assert_array_equal(m[name].plain(), arr)
            else:
                np.testing.assert_array_equal(m[name].raw(), np.ascontiguousarray(arr).view(np.uint8).reshape(-1))
    shards[2].unlink()
    with pytest.raises(GGUFError, match="missing 1 of 3 shards.*00003-of-00003"):
        open_gguf(shards[0])


def _ok_tensors() -> list:
    return [("w", "F32", (2, 8), b"\1" * 64), ("v", "Q8_0", (1, 32), b"\0" * 34)]


def _err(p: Path, *patterns: str) -> str:
    with pytest.raises(GGUFError) as ei:
        GGUFFile(p)
    msg = str(ei.value)
    assert str(p) in msg, msg
    for pat in patterns:
        assert pat in msg, msg
    return msg


def test_valid_raw_file(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "ok.gguf", {"general.architecture": "deepseek4"}, _ok_tensors())
    with GGUFFile(p) as f:
        assert f.tensors["w"].plain().shape == (2, 8)


def test_error_bad_magic(tmp_path: Path) -> None:
    _err(write_raw_gguf(tmp_path / "m.gguf", {}, _ok_tensors(), magic=b"GGML"), "bad magic")


def test_error_bad_version(tmp_path: Path) -> None:
    _err(write_raw_gguf(tmp_path / "v.gguf", {}, _ok_tensors(), version=9), "unsupported version 9")
    _err(write_raw_gguf(tmp_path / "be.gguf", {}, _ok_tensors(), version=3 << 24), "big-endian")


def test_error_unknown_type(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "t.gguf", {}, _ok_tensors())
    b = bytearray(p.read_bytes())
    i = b.index(b"\x01\x00\x00\x00\x00\x00\x00\x00v")  # tensor 'v' info: name, n_dims, dims, type
    type_pos = i + 9 + 4 + 16
    b[type_pos : type_pos + 4] = struct.pack("<I", 77)
    p.write_bytes(bytes(b))
    _err(p, "tensor 'v'", "unknown GGML type id 77")


def test_error_truncated(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "tr.gguf", {"k": "value"}, _ok_tensors())
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    _err(p, "tensor 'v'", "past the end")
    p.write_bytes(data[:30])
    _err(p, "truncated")


def test_error_offset_past_end(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "o.gguf", {}, _ok_tensors(), offsets=[0, 1 << 40])
    _err(p, "tensor 'v'", "past the end")


def test_error_overlap(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "ov.gguf", {}, _ok_tensors(), offsets=[0, 32])
    _err(p, "overlaps tensor 'w'")


def test_error_misaligned_and_duplicate(tmp_path: Path) -> None:
    _err(write_raw_gguf(tmp_path / "a.gguf", {}, _ok_tensors(), offsets=[0, 65]), "not a multiple of the alignment")
    dup = [("w", "F32", (8,), b"\0" * 32), ("w", "F32", (8,), b"\0" * 32)]
    _err(write_raw_gguf(tmp_path / "d.gguf", {}, dup), "tensor 'w'", "duplicate")
    _err(write_raw_gguf(tmp_path / "al.gguf", {"general.alignment": 3}, _ok_tensors()), "general.alignment")


def test_error_block_size(tmp_path: Path) -> None:
    _err(write_raw_gguf(tmp_path / "b.gguf", {}, [("q", "Q8_0", (1, 33), b"\0" * 36)]), "tensor 'q'", "block size")


def _patch_header(p: Path, n_tensors: int | None = None, n_kv: int | None = None) -> None:
    b = bytearray(p.read_bytes())
    if n_tensors is not None:
        b[8:16] = struct.pack("<Q", n_tensors)
    if n_kv is not None:
        b[16:24] = struct.pack("<Q", n_kv)
    p.write_bytes(bytes(b))


def test_error_absurd_counts(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "c.gguf", {"k": 1}, _ok_tensors())
    _patch_header(p, n_tensors=1 << 60)
    _err(p, "absurd tensor count")
    p = write_raw_gguf(tmp_path / "c2.gguf", {"k": 1}, _ok_tensors())
    _patch_header(p, n_kv=1 << 62)
    _err(p, "absurd kv count")


def test_error_absurd_lengths(tmp_path: Path) -> None:
    # String length: the key's length field says 2^50.
    p = write_raw_gguf(tmp_path / "s.gguf", {"key": 1}, [])
    b = bytearray(p.read_bytes())
    b[24:32] = struct.pack("<Q", 1 << 50)
    p.write_bytes(bytes(b))
    _err(p, "metadata key #0", "absurd string length")
    # Array length.
    p = write_raw_gguf(tmp_path / "a.gguf", {"arr": [1, 2]}, [])
    b = bytearray(p.read_bytes())
    i = b.index(b"arr") + 3 + 4 + 4
    b[i : i + 8] = struct.pack("<Q", 1 << 61)
    p.write_bytes(bytes(b))
    _err(p, "metadata key 'arr'", "absurd array length")
    # n_dims.
    p = write_raw_gguf(tmp_path / "n.gguf", {}, [("w", "F32", (8,), b"\0" * 32)])
    b = bytearray(p.read_bytes())
    i = b.index(b"w\x01\x00\x00\x00") + 1
    b[i : i + 4] = struct.pack("<I", 1000)
    p.write_bytes(bytes(b))
    _err(p, "tensor 'w'", "absurd n_dims 1000")


def test_error_unknown_value_type(tmp_path: Path) -> None:
    p = write_raw_gguf(tmp_path / "u.gguf", {"k": 5}, [])
    b = bytearray(p.read_bytes())
    i = b.index(b"k") + 1
    b[i : i + 4] = struct.pack("<I", 99)
    p.write_bytes(bytes(b))
    _err(p, "metadata key 'k'", "unknown value type id 99")


def test_error_empty_and_missing(tmp_path: Path) -> None:
    (tmp_path / "e.gguf").write_bytes(b"")
    _err(tmp_path / "e.gguf", "empty")
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
    assert issubclass(GGUFError, ValueError)


def _resident_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (util-linux fincore)."""
    import subprocess

    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_release_drops_a_tensors_pages_from_the_page_cache(tmp_path: Path, rng: np.random.Generator) -> None:
    """Once a tensor's bytes are in their final place, release() drops them from the page cache too
    (the machine then holds them once), leaving the other tensors cached and the data readable."""
    import os
    import shutil
    import sys

    if not sys.platform.startswith("linux") or shutil.which("fincore") is None:
        pytest.skip("page-cache residency is read with Linux's fincore")
    big = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB each
    p = write_gguf(tmp_path / "m.gguf", "deepseek41", {"a.first": ("F32", big), "a.second": ("F32", big * 2)})
    with open(p, "rb+") as f:  # written pages stay dirty until written back, and dirty pages stay cached
        os.fsync(f.fileno())
    p.read_bytes()  # into the page cache
    if _resident_bytes(p) < p.stat().st_size * 0.9:
        pytest.skip(f"{tmp_path}'s filesystem does not keep this file in the page cache")
    with open_gguf(p) as m:
        first, second = m["a.first"], m["a.second"]
        np.testing.assert_array_equal(first.raw().view(np.float32).reshape(1024, 1024), big)
        before = _resident_bytes(p)
        first.release()
        after = _resident_bytes(p)
        assert before - after >= first.nbytes - 2 * 4096, (before, after, first.nbytes)
        assert after >= second.nbytes - 4096  # the other tensor stays cached
        # Still readable: the next touch reads the disk.
        np.testing.assert_array_equal(first.raw().view(np.float32).reshape(1024, 1024), big)


def test_prefetch_reads_a_dropped_tensor_back_into_the_page_cache(tmp_path: Path, rng: np.random.Generator) -> None:
    """prefetch() brings a tensor's pages into the page cache without the caller touching them
    (POSIX_FADV_WILLNEED on the prefetch thread)."""
    import shutil
    import sys
    import time

    if not sys.platform.startswith("linux") or shutil.which("fincore") is None:
        pytest.skip("page-cache residency is read with Linux's fincore")
    big = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB each
    p = write_gguf(tmp_path / "m.gguf", "deepseek41", {"a.first": ("F32", big), "a.second": ("F32", big * 2)})
    with open_gguf(p) as m:
        first = m["a.first"]
        # Dropped after opening: parsing the header may have read ahead into the data.
        drop_file_page_cache(p)
        if _resident_bytes(p) > 256 * 1024:
            pytest.skip(f"{tmp_path}'s filesystem does not drop this file's pages on request")
        first.prefetch()
        deadline = time.monotonic() + 10
        while _resident_bytes(p) < first.nbytes - 4096 and time.monotonic() < deadline:
            time.sleep(0.01)
        have = _resident_bytes(p)
        assert have >= first.nbytes - 4096, (have, first.nbytes)
        np.testing.assert_array_equal(first.raw().view(np.float32).reshape(1024, 1024), big)
