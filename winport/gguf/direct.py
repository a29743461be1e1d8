"""Serving a GGUF with no second copy of its weights: the checkpoint folder names the GGUF instead.

`winport serve --model X.gguf` writes only the small part of a checkpoint folder (config.json,
tokenizer, the engram map, the stamp) and :data:`SIDECAR`, which names the GGUF files the weights
come from and how they are converted. SGLang's model loader then reads the weights from the GGUF's
read-only memory map, converting each tensor as it goes (Q8_0 -> block FP8, MXFP4 experts to
DeepSeek's layout) straight into the model's parameters and kt-kernel's memory: patch
gguf_direct_weights hooks SGLang 0.5.23's DefaultModelLoader where it looks for and iterates the
folder's safetensors, and its DeepSeek-V4 expert-layout probe, which reads a safetensors header.

The tensors are exactly those the converting route (``weights="copy"``, `winport gguf convert`)
writes into safetensors, in the same order (tests/gguf/test_direct_weights.py compares them).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .reader import GGUFError

SIDECAR = "gguf_weights.json"
FORMAT = 1
# The model GGUF of a folder served from it, opened once per process: by the weight stream, and kept
# for hot-expert swaps, which read the same map (winport.hybrid.expert_source). Keyed by the sidecar's
# model path; a handle is closed when its last holder lets go.
_OPEN: dict[str, list[Any]] = {}  # path -> [LoadedGGUF, holders]
_OPEN_LOCK = threading.Lock()


def hold(model: str, draft: str | None = None, mmproj: str | None = None) -> Any:
    """The one open LoadedGGUF of `model` in this process, opened now if none is (with the draft and
    vision projector named, or without them); the caller holds it until :func:`let_go`."""
    from .convert import load_gguf_model

    with _OPEN_LOCK:
        entry = _OPEN.get(model)
        if entry is None:
            entry = _OPEN[model] = [load_gguf_model(model, draft=draft or False, mmproj=mmproj or False), 0]
        for what, want, have in (("draft", draft, entry[0].draft), ("mmproj", mmproj, entry[0].mmproj)):
            if want is not None and (have is None or str(have.paths[0]) != want):
                raise RuntimeError(f"{model}: already open without the {what} {want}; the weight stream must "
                                   "open it first")
        entry[1] += 1
        return entry[0]


def let_go(model: str) -> None:
    """Give up one hold on `model`'s LoadedGGUF; the last one closes it."""
    with _OPEN_LOCK:
        entry = _OPEN.get(model)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _OPEN[model]
            entry[0].close()


def write_sidecar(folder: Path, loaded: Any, dense_fp8: bool, with_draft: bool, with_mmproj: bool) -> dict[str, Any]:
    """Name the GGUF files (and conversion options) the weights of `folder` are read from."""
    info = {
        "format": FORMAT,
        "model": str(loaded.model.paths[0]),
        "draft": str(loaded.draft.paths[0]) if with_draft and loaded.draft is not None else None,
        "mmproj": str(loaded.mmproj.paths[0]) if with_mmproj and loaded.mmproj is not None else None,
        "dense_fp8": bool(dense_fp8),
        "fp4_experts": bool(loaded.mxfp4_expert_tensors()),
        "bytes": loaded.total_bytes(),
    }
    (folder / SIDECAR).write_text(json.dumps(info, indent=1) + "\n")
    return info


def read_sidecar(folder: str | Path) -> dict[str, Any] | None:
    """The sidecar of a folder served straight from its GGUF, or None for any other folder."""
    path = Path(folder) / SIDECAR
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GGUFError(f"{path}: unreadable ({exc}); delete the folder to have it written again") from exc
    if info.get("format") != FORMAT:
        raise GGUFError(f"{path}: format {info.get('format')!r}, this winport writes {FORMAT}; delete the folder")
    return info


def weights(folder: str | Path, progress: bool = True, keep_open: bool = False) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, tensor) for every weight of a folder served from its GGUF: the model's, then
    the bundled draft's and vision projector's, each converted as the copying route converts it.
    The GGUF is opened when iteration starts and let go when it ends (or is abandoned); with
    `keep_open` (hot-expert swaps will read it) the process keeps it open for :func:`hold`."""
    info = read_sidecar(folder)
    if info is None:
        raise GGUFError(f"{folder}: no {SIDECAR}: not a folder served from a GGUF")
    for key in ("model", "draft", "mmproj"):
        if info[key] is not None and not Path(info[key]).is_file():
            raise GGUFError(f"{info[key]}: the GGUF this server reads its weights from is gone "
                            f"(named by {Path(folder) / SIDECAR})")
    loaded = hold(info["model"], info["draft"], info["mmproj"])
    finished = False
    try:
        for _source, stream in loaded.weight_streams(progress=progress, dense_fp8=info["dense_fp8"]):
            yield from stream
        finished = True
    finally:
        if not (finished and keep_open):
            let_go(info["model"])
