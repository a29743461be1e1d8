"""Helpers for the GGUF tests: random quantized blocks, GGUF writers, engram tables (import as
`from tests.gguf._helpers import ...`).

Files of mainline types are written with gguf-py's GGUFWriter (the independent writer); files with
fork type ids gguf-py lacks, and deliberately malformed files, with the small raw writer below.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from winport.gguf.engram_rows import BLOCKS, EngramSource
from winport.gguf.types import GGML_TYPES_BY_NAME

# Byte offsets of the float16 fields in each block type: filled with finite values so random
# blocks never hold inf/NaN scales (a NaN must never make a comparison pass).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}


def random_blocks(rng: np.random.Generator, type_name: str, n_blocks: int) -> np.ndarray:
    """Random but valid blocks of a type: uint8 [n_blocks, type_size]."""
    info = GGML_TYPES_BY_NAME[type_name]
    raw = rng.integers(0, 256, (n_blocks, info.type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(type_name, []):
        d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if type_name == "MXFP4":
        raw[:, 0] %= 250  # 12 x 2^(e-128) overflows float32 above this
    if type_name in ("F8_E4M3_B128", "MXFP8"):
        # Avoid the e4m3 NaN codes and extreme exponents in value bytes / scale bytes.
        nscale = 1 if type_name == "F8_E4M3_B128" else 8
        vals = raw[:, nscale:]
        vals[(vals & 0x7F) == 0x7F] ^= 1
        raw[:, :nscale] = rng.integers(110, 140, (n_blocks, nscale), dtype=np.uint8)
    return raw


def _kv_bytes(key: str, value: Any, vtype: int | None = None) -> bytes:
    kb = key.encode()
    out = struct.pack("<Q", len(kb)) + kb
    if isinstance(value, str):
        vb = value.encode()
        return out + struct.pack("<I", 8) + struct.pack("<Q", len(vb)) + vb
    if isinstance(value, bool):
        return out + struct.pack("<IB", 7, int(value))
    if isinstance(value, int):
        return out + struct.pack("<II", vtype if vtype is not None else 4, value)
    if isinstance(value, float):
        return out + struct.pack("<If", 6, value)
    if isinstance(value, list):  # array of u32
        return out + struct.pack("<IIQ", 9, 4, len(value)) + struct.pack(f"<{len(value)}I", *value)
    raise TypeError(value)


def write_raw_gguf(
    path: Path,
    kv: dict[str, Any],
    tensors: list[tuple[str, str, tuple[int, ...], bytes]],
    *,
    alignment: int = 32,
    version: int = 3,
    magic: bytes = b"GGUF",
    offsets: list[int] | None = None,
) -> Path:
    """Write a GGUF by hand: tensors are (name, type name, numpy-order shape, raw bytes)."""
    head = magic + struct.pack("<IQQ", version, len(tensors), len(kv))
    body = b"".join(_kv_bytes(k, v) for k, v in kv.items())
    infos = b""
    data = b""
    offs = []
    for *_info, raw in tensors:
        pad = (-len(data)) % alignment
        data += b"\0" * pad
        offs.append(len(data))
        data += raw
    if offsets is not None:
        offs = offsets
    for (name, tname, shape, _raw), off in zip(tensors, offs, strict=True):
        nb = name.encode()
        dims = tuple(reversed(shape))
        infos += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", GGML_TYPES_BY_NAME[tname].id, off)
    meta = head + body + infos
    meta += b"\0" * ((-len(meta)) % alignment)
    path.write_bytes(meta + data)
    return path


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[str, np.ndarray]], kv: dict[str, Any] | None = None) -> Path:
    """Write with gguf-py's GGUFWriter. tensors: name -> (type name, array).

    Plain types take a typed array in logical shape; quantized types take uint8
    [..., row_bytes] (the writer derives the logical shape; for fork types such as MXFP8 this
    function does).
    """
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (kv or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            raise TypeError(v)
    for name, (tname, arr) in tensors.items():
        if tname in ("F32", "F16"):
            w.add_tensor(name, arr)
        elif tname == "BF16":  # uint16 bit patterns in logical shape -> bytes
            b = np.ascontiguousarray(arr).view(np.uint8)
            w.add_tensor(name, b, raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif tname in gguf.GGMLQuantizationType.__members__:
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType[tname])
        else:  # a fork type gguf-py lacks: give the logical shape, the writer stores the id as is
            info = GGML_TYPES_BY_NAME[tname]
            shape = (*arr.shape[:-1], arr.shape[-1] // info.type_size * info.block_size)
            # int8, not uint8: gguf-py would recompute the shape from a uint8 byte shape with its
            # own (fork-less) block table.
            w.add_tensor(name, np.ascontiguousarray(arr).view(np.int8), raw_shape=shape, raw_dtype=info.id)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def served_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor SGLang gets from a GGUF's folder: its safetensors shards, or for a folder served
    straight from the GGUF (winport.gguf.direct) the tensors its loader reads from there, plus the
    engram tables left in the GGUF (engram_gguf.json), read whole through the same memory map."""
    import torch
    from safetensors.torch import load_file

    from winport.gguf import direct
    from winport.gguf.engram_rows import SIDECAR, EngramRows, read_sources

    out: dict[str, Any] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    if direct.read_sidecar(folder) is not None:
        out.update(direct.weights(folder, progress=False))
    if (Path(folder) / SIDECAR).exists():
        for source in read_sources(Path(folder) / SIDECAR).values():
            table = EngramRows(source)
            out[source.target + ".weight"], out[source.target + ".scale"] = table.gather(torch.arange(source.rows))
            table.close()
    return out


def engram_table(rng: np.random.Generator, type_name: str, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block stream bytes, e4m3 bytes [rows, dim], E8M0 bytes per 32 values [rows, dim/32]) from the
    layout's definition: blocks of (scales, values), value i of row r at stream position r*dim+i."""
    f = BLOCKS[type_name]
    n_blocks = -(-rows * dim // f.values)
    vals = rng.integers(0, 0x7F, (n_blocks, f.values), dtype=np.uint8)  # finite e4m3, either sign below
    vals |= rng.integers(0, 2, vals.shape, dtype=np.uint8) << 7
    scales = rng.integers(110, 145, (n_blocks, f.scale_bytes), dtype=np.uint8)
    stream = np.concatenate([scales, vals], axis=1).reshape(-1)
    flat_vals = vals.reshape(-1)[: rows * dim].reshape(rows, dim)
    per32 = np.repeat(scales, f.values_per_scale // 32, axis=1).reshape(-1)[: rows * dim // 32]
    return stream, flat_vals, per32.reshape(rows, dim // 32)


def write_engram_table(tmp_path: Path, stream: np.ndarray, type_name: str, rows: int, dim: int, layer: int = 2,
                       lead: int = 70_001) -> EngramSource:
    """Write `stream` into a file after `lead` random bytes; its EngramSource names it as layer `layer`."""
    path = tmp_path / f"model-{type_name}-{dim}.gguf"
    head = np.random.default_rng(1).integers(0, 256, lead, dtype=np.uint8)  # offset off any map boundary
    path.write_bytes(head.tobytes() + stream.tobytes() + b"\0" * 17)
    return EngramSource(layer=layer, target=f"layers.{layer}.engram.embed", path=str(path), tensor=f"blk.{layer}.x",
                        offset=lead, nbytes=stream.size, type=type_name, rows=rows, dim=dim,
                        file_size=path.stat().st_size)


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under folder (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).exists() else 0


def assert_served_without_a_copy(log: str, gguf: Path, cache_growth: int) -> Path:
    """A GGUF served straight from its file: the cached folder the server printed holds no weight
    file, and the cache grew by far less than the GGUF (config, tokenizer, sidecars only)."""
    import re

    from winport.gguf.direct import SIDECAR

    match = re.search(r"config and tokenizer go to (\S+)", log) or re.search(r"using the cached folder in (\S+)", log)
    assert match, f"the server did not say where the GGUF's small cache is:\n{log[-3000:]}"
    folder = Path(match.group(1))
    assert (folder / SIDECAR).is_file() and (folder / "config.json").is_file()
    weights = [p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt") or "index" in p.name]
    assert weights == [], f"{folder} holds weight files: {weights}"
    size = Path(gguf).stat().st_size
    assert cache_growth < min(size // 20, 100 << 20), f"the cache grew by {cache_growth} bytes for a {size}-byte GGUF"
    return folder
