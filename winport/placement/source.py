"""What a plan needs from a model, read without its weights: config, draft and vision tower sizes.

A model is a GGUF (file, shard or folder; the DSpark draft and the mmproj found next to it or
named), a checkpoint folder (config.json plus safetensors, whose headers give the draft's `mtp.*`
and the vision tower's `vision.*` tensors), or a config.json on its own.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Served bytes a value of a GGUF tensor type: quantized dense weights become FP8 blocks (1 byte a
# value; the float32 block scales are ~0.4% more at [32, 32] and left out), float types keep theirs.
_GGUF_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


class SourceError(ValueError):
    """A model path the plan cannot read (the message names it)."""


@dataclass(frozen=True)
class ModelSource:
    """A model's config and the GPU bytes of its sidecars."""

    path: Path
    config: dict[str, Any]
    draft_bytes: int = 0
    mmproj_bytes: int = 0
    kind: str = "config"  # "gguf", "checkpoint" or "config"


def _gguf_served(model: Any) -> int:
    return sum(math.prod(t.shape) * _GGUF_FLOAT_BYTES.get(t.type_name, 1) for t in model)


def _from_gguf(path: Path, draft: Path | None, mmproj: Path | None) -> ModelSource:
    from winport.gguf.convert import load_gguf_model
    from winport.gguf.hparams import config_from_metadata

    loaded = load_gguf_model(path, draft=draft, mmproj=mmproj)
    try:
        config = config_from_metadata(loaded.metadata, list(loaded.model.tensors))
        config["quantization_config"] = loaded.quant_config()
        return ModelSource(path, config,
                           draft_bytes=_gguf_served(loaded.draft) if loaded.draft is not None else 0,
                           mmproj_bytes=_gguf_served(loaded.mmproj) if loaded.mmproj is not None else 0,
                           kind="gguf")
    finally:
        loaded.close()


_ST_BYTES = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
             "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_entries(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) from a safetensors file's header (no tensor data read)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise SourceError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(fh.read(n))
        except ValueError as exc:
            raise SourceError(f"{path}: unreadable safetensors header ({exc})") from None
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def folder_source(folder: Path) -> ModelSource:
    """The ModelSource of a checkpoint folder or of a folder served straight from its GGUF."""
    config = _read_config(folder / "config.json")
    from winport.gguf.direct import read_sidecar

    direct = read_sidecar(folder)
    if direct is not None:
        # A folder served straight from its GGUF (winport.gguf.direct): the sidecar GGUFs' headers
        # give the draft and vision sizes; the main model's weights are not needed.
        from winport.gguf.reader import open_gguf

        sizes = {}
        for key in ("draft", "mmproj"):
            if direct.get(key):
                with open_gguf(direct[key]) as side:
                    sizes[key] = _gguf_served(side)
        return ModelSource(folder, config, draft_bytes=sizes.get("draft", 0), mmproj_bytes=sizes.get("mmproj", 0),
                           kind="gguf")
    draft = vision = 0
    for shard in sorted(folder.glob("*.safetensors")):
        for name, (dtype, shape) in safetensors_entries(shard).items():
            size = math.prod(shape) * _ST_BYTES.get(dtype, 2)
            if name.startswith("mtp."):
                draft += size
            elif name.startswith("vision."):
                vision += size
    return ModelSource(folder, config, draft_bytes=draft, mmproj_bytes=vision, kind="checkpoint")


def _read_config(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise SourceError(f"{path}: not JSON ({exc})") from None


def read_source(path: Path, draft: Path | None = None, mmproj: Path | None = None) -> ModelSource:
    """The ModelSource of a GGUF, a checkpoint folder or a config.json (module docstring)."""
    from winport.gguf.to_checkpoint import is_gguf_path

    path = Path(path).expanduser()
    if not path.exists():
        raise SourceError(f"--model {path}: no such file or folder")
    if is_gguf_path(path):
        return _from_gguf(path, draft, mmproj)
    if draft is not None or mmproj is not None:
        raise SourceError(f"--draft/--mmproj name GGUF sidecars; {path} is not a GGUF model")
    if path.is_dir():
        return folder_source(path)
    return ModelSource(path, _read_config(path))
