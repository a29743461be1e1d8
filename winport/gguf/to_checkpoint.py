"""A DeepSeek-V4 GGUF (file, any shard, or folder) -> a checkpoint folder SGLang loads.

`winport serve --model X.gguf` goes through here: SGLang 0.5.23's DeepSeek-V4 loader reads a
folder (config.json, tokenizer files, safetensors in DeepSeek's original tensor names), so the GGUF
is converted once into such a folder under ``winport.paths.cache_dir()/"gguf"/<key>``, the key
being a hash of every shard's resolved path, size and mtime plus the conversion options and
:data:`FORMAT_VERSION`. The folder is written as ``<key>.partial`` and renamed after its stamp
file is written, so an interrupted conversion is never taken for a finished one.

- config.json: from the GGUF hparams through the name table (winport.gguf.hparams, the inverse of
  what winport.gguf.export writes), plus generation_config.json with the special token ids.
- Tokenizer: rebuilt from ``tokenizer.ggml.*`` metadata (LoadedGGUF.tokenizer_dir) and copied in.
- Weights: streamed from LoadedGGUF.weights() into safetensors shards written by a small writer
  of our own that writes each tensor's bytes straight from the tensor (safetensors' save_file
  first serializes a whole shard into one bytes object, a second copy). At most one shard of
  converted tensors (``shard_bytes``, or one tensor larger than that) is in memory.

Sidecars (``draft=`` / ``mmproj=``: a path, None to look next to the model, False to skip):
- A DSpark draft GGUF is bundled the way SGLang 0.5.23 loads DeepSeek-V4 drafts: its stage
  tensors go into the same shards as ``mtp.<stage>.*`` and config.json gets the ``dspark_*`` keys
  (LoadedGGUF.draft_config), so ``--speculative-algorithm DSPARK`` finds it at the model path.
- A vision projector (mmproj) GGUF is bundled the way SGLang 0.5.23 loads DeepSeek-V4.1's vision
  tower: its tensors go into the model's shards under SGLang's names (vision.*, aligner.*,
  image_*; deepseek41_mmproj_names.toml) and config.json gets the vision keys (vision_n_layers,
  vision_dim, ..., image_token_id), from the projector's clip.vision.* hparams or documented
  defaults, printed (winport.gguf.vision). The projector must fit the model (a V4.1 model, aligner
  output = hidden size, VL routing biases present): checked before anything is converted.
- V4.1 engram tables (role ``engram``, MXFP8 or F8_E4M3_B128) stay in the GGUF by default
  (``engram="map"``): the folder gets ``engram_gguf.json`` naming each table's file, byte range and
  format, and the served model reads the rows it needs through a read-only memory map
  (winport.gguf.engram_rows, patch engram_rows_from_gguf). ``engram="copy"`` writes them as
  ``layers.N.engram.embed.weight`` / ``.scale`` (:class:`EngramStream`), byte copies streamed from
  the memory map into the shard in chunks (``engram_chunk_bytes``): a 100 GB table never sits in
  memory. Each table is one shard entry pair (a shard may exceed ``shard_bytes`` to hold it).
Both are checked before any tensor data is read; what was bundled is recorded in the stamp file
(:func:`sidecars`). The cache key covers the sidecar files too.

Dense weights: with ``dense_fp8=False`` Q8_0 and other quantized dense weights are dequantized to
bfloat16, and BF16/F32 tensors are copied bit for bit. ``dense_fp8=True``: dense weights become
block FP8 (winport.gguf.convert.to_fp8_blocks) and config.json gets the matching
quantization_config. Routed MXFP4 experts are written in DeepSeek's FP4 layout either way.
``dense_fp8=None`` (what `winport serve` asks for) picks True exactly when the routed experts are
MXFP4 (:func:`needs_fp8_config`): SGLang 0.5.23 loads DeepSeek's packed FP4 experts only through
its FP8 quantization method (Fp8MoEMethod with is_fp4_experts, detected from the experts' uint8
dtype), which exists only under an ``fp8`` quantization_config, and that config makes every dense
linear an FP8 block linear. Without it SGLang builds bf16 experts and fails at load on the packed
[N, K/2] rows. On a CPU without AMX those FP8 linears run W8A16 (winport.patches.cpu_fp8_block_linear)
and the FP4 experts W4A16 (winport.patches.cpu_mxfp4_moe): the serving path of DeepSeek's own
FP8 + MXFP4 checkpoint. Q8_0 -> FP8 adds e4m3 rounding (see to_fp8_blocks); BF16 dense weights that
already are block-FP8 values with power-of-two scales (the demo's) come back as the same values.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .reader import GGUFError

FORMAT_VERSION = 3  # bump when the converter writes something different
STAMP = "winport-gguf.json"
SHARD_BYTES = 2 << 30
# Bytes of source blocks read per step when streaming an engram table: bounds the extra memory of
# the conversion (one chunk of values + scales) whatever the table's size (~100 GB in V4.1-Flash).
ENGRAM_CHUNK_BYTES = 64 << 20

_ST_DTYPES = {
    "bfloat16": "BF16", "float32": "F32", "float16": "F16", "float64": "F64", "int32": "I32",
    "int64": "I64", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
}


def is_gguf_path(path: Path) -> bool:
    """Whether ``--model`` names a GGUF: a ``.gguf`` file or a folder holding some."""
    return path.suffix.lower() == ".gguf" or (path.is_dir() and any(path.glob("*.gguf")))


def _say(msg: str) -> None:
    print(f"winport gguf: {msg}", flush=True)


def _st_dtype(t: Any) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _ST_DTYPES:
        raise GGUFError(f"no safetensors dtype for torch {name}")
    return _ST_DTYPES[name]


class StreamedGroup:
    """Tensors whose bytes are produced chunk by chunk straight into the output file, never held whole.

    ``parts``: (name, safetensors dtype, shape, nbytes) of each tensor, stored next to each other
    in one shard. :meth:`write` gets the absolute file position of every part and fills them all
    (in any order; the engram tables fill their weight and scale parts in one pass over the source).
    """

    parts: list[tuple[str, str, list[int], int]]

    @property
    def nbytes(self) -> int:
        """Bytes of all parts together."""
        return sum(p[3] for p in self.parts)

    def write(self, fh: BinaryIO, positions: list[int]) -> None:  # pragma: no cover - interface
        """Write every part's bytes at ``positions`` (absolute offsets in ``fh``)."""
        raise NotImplementedError


def _entry(obj: Any) -> tuple[str, list[int], int]:
    """(safetensors dtype, shape, nbytes) of a torch tensor or of one part of a StreamedGroup."""
    if isinstance(obj, tuple) and isinstance(obj[0], StreamedGroup):
        _, dtype, shape, n = obj[0].parts[obj[1]]
        return dtype, shape, n
    return _st_dtype(obj), list(obj.shape), obj.numel() * obj.element_size()


def write_safetensors(path: Path, tensors: list[tuple[str, Any]], metadata: dict[str, str] | None = None) -> int:
    """Write (name, torch tensor) pairs as one safetensors file, each tensor straight from memory.

    A value may also be ``(StreamedGroup, part index)``: its bytes are written by the group, chunk
    by chunk (all parts of a group must be in the same file).
    Format: u64 header length, JSON header (name -> dtype, shape, data_offsets; padded with spaces
    to 8 bytes), then the tensors' bytes back to back. Returns the data bytes written.
    """
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    starts = []
    for name, t in tensors:
        dtype, shape, n = _entry(t)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        starts.append(off)
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    base = 8 + len(hb)
    groups: dict[int, tuple[StreamedGroup, list[int | None]]] = {}
    for (_, t), start in zip(tensors, starts, strict=True):
        if isinstance(t, tuple) and isinstance(t[0], StreamedGroup):
            pos = groups.setdefault(id(t[0]), (t[0], [None] * len(t[0].parts)))[1]
            pos[t[1]] = base + start
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)))
        fh.write(hb)
        for (name, t), start in zip(tensors, starts, strict=True):
            if isinstance(t, tuple) and isinstance(t[0], StreamedGroup):
                group, pos = groups[id(t[0])]
                if t[1] == 0:
                    if any(p is None for p in pos):
                        raise GGUFError(f"{path}: streamed tensor {name!r}: not all parts of its group are in this file")
                    group.write(fh, [int(p) for p in pos if p is not None])
                continue
            fh.seek(base + start)
            _write_bytes(fh, t)
        end = fh.seek(0, os.SEEK_END)
    if end != base + off:
        raise GGUFError(f"{path}: wrote {end} bytes, the header says {base + off}")
    return off


def _write_bytes(fh: BinaryIO, t: Any) -> None:
    import torch

    flat = t.contiguous().reshape(-1)
    if flat.numel():
        fh.write(memoryview(flat.view(torch.uint8).numpy()))


class _ShardWriter:
    """Collects converted tensors and writes a shard whenever ``limit`` bytes are held.

    Streamed groups count their full size against the limit but hold no memory.
    """

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self.held: list[tuple[str, Any]] = []
        self.held_bytes = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, t: Any) -> None:
        n = t.numel() * t.element_size()
        if self.held and self.held_bytes + n > self.limit:
            self.flush()
        self.held.append((name, t))
        self.held_bytes += n

    def add_group(self, group: StreamedGroup) -> None:
        """Add every part of a streamed group (kept together in one shard)."""
        if self.held and self.held_bytes + group.nbytes > self.limit:
            self.flush()
        self.held += [(part[0], (group, i)) for i, part in enumerate(group.parts)]
        self.held_bytes += group.nbytes

    def flush(self) -> None:
        if not self.held:
            return
        path = self.folder / f"shard-{len(self.files):05d}.safetensors.tmp"
        self.total += write_safetensors(path, self.held)
        self.files.append((path, [n for n, _ in self.held]))
        self.held, self.held_bytes = [], 0

    def finish(self) -> list[str]:
        """Name the shards as Hugging Face does (plus an index when there are several)."""
        self.flush()
        if len(self.files) == 1:
            self.files[0][0].rename(self.folder / "model.safetensors")
            return ["model.safetensors"]
        count = len(self.files)
        weight_map: dict[str, str] = {}
        out = []
        for i, (path, names) in enumerate(self.files, 1):
            final = f"model-{i:05d}-of-{count:05d}.safetensors"
            path.rename(self.folder / final)
            weight_map.update(dict.fromkeys(names, final))
            out.append(final)
        index = {"metadata": {"total_size": self.total}, "weight_map": weight_map}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
        return out + ["model.safetensors.index.json"]


def cache_key(paths: Iterable[Path], **options: Any) -> str:
    """Hash of every shard's resolved path, size and mtime, the options and FORMAT_VERSION."""
    h = hashlib.sha256(f"winport-gguf-v{FORMAT_VERSION}".encode())
    for p in paths:
        st = Path(p).stat()
        h.update(f"{Path(p).resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def _is_complete(folder: Path) -> bool:
    try:
        info = json.loads((folder / STAMP).read_text())
        return info.get("format") == FORMAT_VERSION and all((folder / f).exists() for f in info["files"])
    except (OSError, ValueError, KeyError):
        return False


def sidecars(folder: str | Path) -> dict[str, Any]:
    """What a converted folder bundles: {"draft": {...}} and/or {"mmproj": {...}} from its stamp."""
    try:
        info = json.loads((Path(folder) / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return {k: info[k] for k in ("draft", "mmproj") if info.get(k)}


def gguf_to_checkpoint(
    path: str | Path,
    *,
    cache: str | Path | None = None,
    dense_fp8: bool | None = False,
    shard_bytes: int = SHARD_BYTES,
    progress: bool = True,
    draft: str | Path | bool | None = False,
    mmproj: str | Path | bool | None = False,
    engram_chunk_bytes: int = ENGRAM_CHUNK_BYTES,
    engram: str = "map",
    check: Callable[[Any], None] | None = None,
    weights: str = "copy",
) -> Path:
    """Convert (once) a GGUF model, plus its sidecars, into a checkpoint folder and return the folder.

    ``path``: a GGUF file, any shard of a split GGUF, or a folder with one model GGUF.
    ``dense_fp8``: dense weights as block FP8 + quantization_config (True), as bf16 / as stored
    (False), or None: True exactly when the routed experts are MXFP4 (:func:`needs_fp8_config`).
    ``draft`` / ``mmproj``: sidecar path, None to look next to the model, False to skip (default).
    ``engram``: "map" (default) leaves V4.1 engram tables in the GGUF and writes engram_gguf.json
    (served through a memory map, winport.gguf.engram_rows); "copy" streams them into the shards.
    ``engram_chunk_bytes``: source bytes per step when copying engram tables (bounds the memory).
    ``check``: called with the opened model once its sidecars are checked, before the cache is looked
    at or anything is converted (so a caller refuses what it cannot serve from the one open).
    ``weights``: "copy" converts the weights into safetensors shards; "direct" (what `winport serve`
    asks for) writes no weights at all: the folder names the GGUF (winport.gguf.direct), and SGLang's
    loader reads and converts the weights from its memory map at load (patch gguf_direct_weights).
    Raises GGUFError (naming the file, tensor or key), for a bad sidecar before any conversion.
    """
    from winport.paths import cache_dir

    from .convert import load_gguf_model
    from .hparams import config_from_metadata

    if engram not in ("map", "copy"):
        raise ValueError(f"engram={engram!r}: expected 'map' or 'copy'")
    if weights not in ("copy", "direct"):
        raise ValueError(f"weights={weights!r}: expected 'copy' or 'direct'")
    if weights == "direct" and engram != "map":
        raise ValueError("weights='direct' leaves the engram tables in the GGUF too (engram='map')")
    loaded = load_gguf_model(path, draft=draft, mmproj=mmproj)
    try:
        # Sidecars are checked first: a bad one is reported at start, not after the model.
        draft_cfg = loaded.draft_config()
        mm_plan = loaded.mmproj_plan()
        vision_cfg: dict[str, Any] = {}
        if mm_plan is not None:
            vision_cfg = check_mmproj(loaded)
        if check is not None:
            check(loaded)
        if dense_fp8 is None:
            dense_fp8 = needs_fp8_config(loaded)
            if dense_fp8:
                _say(f"{loaded.model.paths[0].name}: routed experts are MXFP4, which SGLang loads only under "
                     "its FP8 quantization config: dense weights are converted to block FP8 too")
        elif not dense_fp8 and needs_fp8_config(loaded):
            # Still written (tests and exports read such checkpoints tensor by tensor), but said plainly.
            _say(f"{loaded.model.paths[0].name}: routed experts are MXFP4 and dense_fp8=False: SGLang 0.5.23 "
                 "cannot serve this checkpoint (it loads packed FP4 experts only under its FP8 config); "
                 "dense_fp8=None, what `winport serve` passes, converts it servably")
        root = Path(cache) if cache else cache_dir()
        paths = list(loaded.model.paths)
        for side in (loaded.draft, loaded.mmproj):
            if side is not None:
                paths += side.paths
        options: dict[str, Any] = {"dense_fp8": dense_fp8, "draft": loaded.draft is not None,
                                   "mmproj": loaded.mmproj is not None, "engram": engram}
        if weights == "direct":
            options["weights"] = weights  # (the copying route keeps the keys its cached folders have)
        key = cache_key(paths, **options)
        folder = root / "gguf" / key
        if _is_complete(folder):
            _say(f"{loaded.model.paths[0].name}: using the {'cached folder' if weights == 'direct' else 'converted copy'} "
                 f"in {folder}")
            return folder
        if weights == "direct":
            _say(f"{loaded.model.paths[0]} ({loaded.total_bytes() / 1e9:.2f} GB): weights are read from the GGUF at "
                 f"load (no copy); config and tokenizer go to {folder}")
        else:
            _say(f"converting {loaded.model.paths[0]} ({loaded.total_bytes() / 1e9:.2f} GB) into {folder}")
        if loaded.unknown_tensors:
            _say(f"{len(loaded.unknown_tensors)} tensor(s) the name table does not know are left out: "
                 + ", ".join(loaded.unknown_tensors[:20]) + (" ..." if len(loaded.unknown_tensors) > 20 else ""))
        if loaded.draft is not None:
            _say(f"bundling the DSpark draft {loaded.draft.paths[0]} ({draft_cfg['num_nextn_predict_layers']} stage(s))")
            left = loaded.draft_left_out()
            if left:
                _say(f"draft tensor(s) not bundled (SGLang's DSpark draft uses the model's embedding and head, "
                     f"or the table does not know them): {', '.join(left[:20])}")
        tmp = folder.with_name(folder.name + ".partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            _convert_into(loaded, tmp, config_from_metadata, dense_fp8, shard_bytes, progress, root,
                          draft_cfg, mm_plan, engram_chunk_bytes, vision_cfg, engram, weights)
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _say(f"{'wrote' if weights == 'direct' else 'converted into'} {folder}")
        return folder
    finally:
        loaded.close()



def needs_fp8_config(loaded: Any) -> bool:
    """Whether the converted checkpoint must carry an FP8 quantization_config for SGLang to load it:
    true when the model's routed experts are MXFP4 (see the module docstring: SGLang 0.5.23 has no
    other method for DeepSeek's packed FP4 experts, and under that config every dense linear is FP8)."""
    return bool(loaded.mxfp4_expert_tensors())


class EngramStream(StreamedGroup):
    """One V4.1 engram table written as SGLang's ``<target>.weight`` float8_e4m3fn [rows, dim] and
    ``<target>.scale`` E8M0 [rows, dim / 32], bytes copied (no arithmetic), chunk by chunk.

    The GGUF table is one stream of blocks (MXFP8: 8 E8M0 scales then 256 e4m3 values;
    F8_E4M3_B128: one exponent then 128 values, repeated for each 32-value group) whatever its GGUF
    row width (winport.gguf.export.engram_gguf_shape packs rows narrower than a block), so values
    and scales are cut from that stream (winport.gguf.engram_rows.split_blocks, as the served rows
    are), ``chunk_bytes`` of blocks at a time, through the memory map; each chunk's source pages
    are dropped once written. Extra memory: one chunk's values and scales, never the table.
    """

    def __init__(self, target: str, tensor: Any, rows: int, dim: int, chunk_bytes: int) -> None:
        import torch

        from .engram_rows import check_table

        f = check_table(str(tensor.path), tensor.name, tensor.type.name, tensor.nbytes, rows, dim)
        self.n_blocks = tensor.nbytes // f.block_bytes
        total = rows * dim
        self.tensor = tensor
        self.fmt = f
        self.total = total
        self.blocks_per_chunk = max(1, chunk_bytes // f.block_bytes)
        scale_dtype = "F8_E8M0" if hasattr(torch, "float8_e8m0fnu") else "U8"
        self.parts = [(target + ".weight", "F8_E4M3", [rows, dim], total),
                      (target + ".scale", scale_dtype, [rows, dim // 32], total // 32)]

    def chunks(self) -> Iterator[tuple[int, Any, Any]]:
        """(first value index, e4m3 bytes, E8M0 bytes per 32 values) per chunk of source blocks."""
        from .engram_rows import SCALE_GROUP, split_blocks

        f, t = self.fmt, self.tensor
        blocks = t.raw().reshape(self.n_blocks, f.block_bytes)
        for b0 in range(0, self.n_blocks, self.blocks_per_chunk):
            b1 = min(self.n_blocks, b0 + self.blocks_per_chunk)
            w, sc = split_blocks(blocks[b0:b1], f)
            v0 = b0 * f.values
            nv = min(self.total, b1 * f.values) - v0  # the last block of a packed table is padding
            yield v0, w[:nv], sc[: nv // SCALE_GROUP]
            t._file._release(t.offset + b0 * f.block_bytes, (b1 - b0) * f.block_bytes)

    def write(self, fh: BinaryIO, positions: list[int]) -> None:
        """Write the values at ``positions[0]`` and the scales at ``positions[1]``, one pass over the table."""
        pw, ps = positions
        for v0, w, sc in self.chunks():
            fh.seek(pw + v0)
            fh.write(memoryview(w))
            fh.seek(ps + v0 // 32)
            fh.write(memoryview(sc))


def _engram_tables(loaded: Any, config: dict[str, Any]) -> list[tuple[str, int, Any, int, int]]:
    """(target, layer, GGUF tensor, rows, dim) of every engram table, rows / dim from the config
    (engram_layer_ids, engram_num_embeddings, engram_head_dim); a layer not in engram_layer_ids or
    missing hparams are a GGUFError naming the file and tensor. Nothing is read here."""
    tables = loaded.engram_tables()
    if not tables:
        return []
    path = loaded.model.paths[0]
    try:
        layer_ids = list(config["engram_layer_ids"])
        rows_by_layer = dict(zip(layer_ids, config["engram_num_embeddings"], strict=True))
        dim = int(config["engram_head_dim"])
    except (KeyError, TypeError, ValueError) as e:
        raise GGUFError(f"{path}: engram tables present but the engram hparams are missing or bad ({e!r})") from e
    out = []
    for target, table in sorted(tables.items()):
        layer = int(target.split(".")[1])
        if layer not in rows_by_layer:
            raise GGUFError(f"{path}: tensor {table.name!r}: layer {layer} is not in engram_layer_ids "
                            f"{layer_ids}")
        out.append((target, layer, table, int(rows_by_layer[layer]), dim))
    return out


def engram_tensors(loaded: Any, config: dict[str, Any], chunk_bytes: int = ENGRAM_CHUNK_BYTES) -> list[EngramStream]:
    """V4.1 engram tables as streamed SGLang checkpoint tensors (see :class:`EngramStream`): the
    ``engram="copy"`` route. A table that does not hold exactly rows x dim values is a GGUFError."""
    return [EngramStream(target, tensor, rows, dim, chunk_bytes)
            for target, _layer, tensor, rows, dim in _engram_tables(loaded, config)]


def engram_sources(loaded: Any, config: dict[str, Any]) -> list[Any]:
    """Where each V4.1 engram table lies in the GGUF (winport.gguf.engram_rows.EngramSource): the
    ``engram="map"`` route, checked like :func:`engram_tensors` but nothing is copied."""
    from .engram_rows import EngramSource, check_table

    out = []
    for target, layer, t, rows, dim in _engram_tables(loaded, config):
        check_table(str(t.path), t.name, t.type.name, t.nbytes, rows, dim)
        out.append(EngramSource(layer=layer, target=target, path=str(Path(t.path).resolve()), tensor=t.name,
                                offset=t.offset, nbytes=t.nbytes, type=t.type.name, rows=rows, dim=dim,
                                file_size=Path(t.path).stat().st_size))
    return out


def check_mmproj(loaded: Any, say: bool = True) -> dict[str, Any]:
    """The vision keys config.json gets from ``loaded``'s projector, after checking that it fits the
    model (winport.gguf.vision); prints the keys that were defaulted. GGUFError names the file."""
    from .hparams import config_from_metadata
    from .vision import check_vl_biases, mmproj_config

    plan = loaded.mmproj_plan()
    config = config_from_metadata(loaded.metadata, list(loaded.model.tensors))
    vision, source = mmproj_config(loaded, plan, config)
    check_vl_biases(loaded, config)
    if say and source:
        _say(f"{loaded.mmproj.paths[0].name}: vision keys not in the file: "
             + ", ".join(f"{k}={vision.get(k)} ({why})" for k, why in sorted(source.items())))
    return vision


def _convert_into(loaded: Any, tmp: Path, config_from_metadata: Any, dense_fp8: bool, shard_bytes: int,
                  progress: bool, root: Path, draft_cfg: dict[str, Any], mm_plan: Any,
                  engram_chunk_bytes: int = ENGRAM_CHUNK_BYTES, vision_cfg: dict[str, Any] | None = None,
                  engram: str = "map", weights: str = "copy") -> None:
    meta = loaded.metadata
    config = config_from_metadata(meta, list(loaded.model.tensors))
    config.update(draft_cfg)
    if not vision_cfg and config.get("vision_n_layers"):
        # A model file that claims a vision tower but comes without its projector: SGLang would
        # build the tower from no weights (uninitialised memory), so it is served as text only.
        _say(f"{loaded.model.paths[0].name} says vision_n_layers {config['vision_n_layers']} but no vision "
             "projector was given: served as a text model (name the mmproj GGUF to serve images)")
        config["vision_n_layers"] = 0
    config.update(vision_cfg or {})
    if dense_fp8:
        config["quantization_config"] = loaded.quant_config()
    (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    (tmp / "generation_config.json").write_text(json.dumps({**gen, "do_sample": False}, indent=1) + "\n")
    tok_dir = loaded.tokenizer_dir(root)
    for f in sorted(tok_dir.iterdir()):
        if f.is_file():
            shutil.copyfile(f, tmp / f.name)
    writer = _ShardWriter(tmp, shard_bytes)
    seen: set[str] = set()
    n_draft: int | None = 0
    n_vision: int | None = 0
    streams = loaded.weight_streams(progress=progress, dense_fp8=dense_fp8)
    if weights == "direct":
        from .direct import write_sidecar

        write_sidecar(tmp, loaded, dense_fp8, loaded.draft is not None, mm_plan is not None)
        streams, n_draft, n_vision = [], None, None
    for src, stream in streams:
        for name, t in stream:
            if name in seen:
                raise GGUFError(f"{src.paths[0]}: tensor {name!r} produced twice")
            seen.add(name)
            n_draft += src is loaded.draft
            n_vision += src is loaded.mmproj
            writer.add(name, t)
    mapped: list[Any] = []
    if engram == "map":
        from .engram_rows import write_sources

        mapped = engram_sources(loaded, config)
        if mapped:
            write_sources(tmp, mapped)
            _say(f"{len(mapped)} engram table(s) stay in {loaded.model.paths[0].name}, read through a memory map "
                 f"when served ({sum(m.nbytes for m in mapped) / 1e6:,.1f} MB not copied)")
    else:
        for group in engram_tensors(loaded, config, engram_chunk_bytes):
            for name, *_ in group.parts:
                if name in seen:
                    raise GGUFError(f"{loaded.model.paths[0]}: tensor {name!r} produced twice")
                seen.add(name)
            writer.add_group(group)
    weight_files = writer.finish() if weights == "copy" else []
    stamp: dict[str, Any] = {"format": FORMAT_VERSION, "source": [str(p) for p in loaded.model.paths],
                             "dense_fp8": dense_fp8, "weights": weight_files, "route": weights,
                             "tensors": len(seen) if weights == "copy" else None,
                             "engram": {"route": engram, "mapped_tables": len(mapped)}}
    if loaded.draft is not None:
        stamp["draft"] = {"source": [str(p) for p in loaded.draft.paths], "tensors": n_draft,
                          "stages": draft_cfg["num_nextn_predict_layers"], "config": draft_cfg}
    if mm_plan is not None:
        stamp["mmproj"] = {"source": [str(p) for p in loaded.mmproj.paths], "tensors": n_vision,
                           "config": vision_cfg, "unknown": mm_plan.unknown}
    stamp["files"] = sorted(p.name for p in tmp.iterdir())
    tmp_stamp = tmp / (STAMP + ".tmp")
    tmp_stamp.write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(tmp_stamp, tmp / STAMP)
