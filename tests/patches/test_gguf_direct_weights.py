"""winport.patches.gguf_direct_weights: SGLang's DefaultModelLoader reads a served GGUF's weights from
the GGUF (winport.gguf.direct) for folders that name one, and takes upstream's code for every other.

The direct tensors themselves are compared bit for bit with the copying route in
tests/gguf/test_sidecars.py; the live GGUF servers (tests/gguf/test_serve_gguf.py,
test_v41_ud_mix.py) go through these hooks end to end.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from winport.gguf.direct import FORMAT, SIDECAR
from winport.patches import gguf_direct_weights as patch


def _lean(tmp_path: Path, fp4: bool = True) -> Path:
    folder = tmp_path / "lean"
    folder.mkdir()
    (folder / SIDECAR).write_text(json.dumps({"format": FORMAT, "model": str(tmp_path / "m.gguf"), "draft": None,
                                              "mmproj": None, "dense_fp8": True, "fp4_experts": fp4, "bytes": 1}))
    return folder


def _loader(draft_idx: int | None = None) -> types.SimpleNamespace:
    def filter_mtp(weights, prefix, idx):  # noqa: ANN001, ANN202 (upstream's signature)
        return ((prefix + "draft:" + n, t) for n, t in weights)

    return types.SimpleNamespace(load_config=types.SimpleNamespace(draft_model_idx=draft_idx),
                                 counter_before_loading_weights=0.0, _filter_mtp_weights=filter_mtp)


def test_upstream_still_looks_as_the_patch_expects(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(patch, "register", lambda target, hook, kind="AROUND": seen.append(target))
    patch.register_patch()
    assert seen == [patch.PREPARE, patch.ITERATOR, patch.PROBE]


def test_other_folders_take_upstream(tmp_path: Path) -> None:
    def original(*a: object, **k: object) -> str:
        return "upstream"

    plain = str(tmp_path)
    src = types.SimpleNamespace(model_or_path=plain, prefix="")
    assert patch._prepare(original, _loader(), plain, None, False) == "upstream"
    assert patch._iterator(original, _loader(), src) == "upstream"
    assert patch._probe(original, plain) == "upstream"


def test_a_gguf_folder_reads_the_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.gguf import direct

    def never(*a: object, **k: object) -> None:
        raise AssertionError("upstream must not run for a folder served from its GGUF")

    folder = str(_lean(tmp_path))
    assert patch._prepare(never, _loader(), folder, None, False) == (folder, [], True)
    assert patch._probe(never, folder) is True
    (tmp_path / "b").mkdir()
    assert patch._probe(never, str(_lean(tmp_path / "b", fp4=False))) is False
    kept: list[bool] = []

    def weights(f: str, progress: bool = True, keep_open: bool = False) -> object:
        kept.append(keep_open)
        return iter([("embed.weight", 1), ("head.weight", 2)])

    monkeypatch.setattr(direct, "weights", weights)
    monkeypatch.delenv("WINPORT_HOT_EXPERTS", raising=False)
    loader = _loader()
    got = list(patch._iterator(never, loader, types.SimpleNamespace(model_or_path=folder, prefix="p.")))
    assert got == [("p.embed.weight", 1), ("p.head.weight", 2)] and loader.counter_before_loading_weights > 0
    # hot-expert swaps read the same GGUF: with them on, the stream leaves it open for them
    monkeypatch.setenv("WINPORT_HOT_EXPERTS", "1")
    list(patch._iterator(never, _loader(), types.SimpleNamespace(model_or_path=folder, prefix="p.")))
    assert kept == [False, True]
    monkeypatch.delenv("WINPORT_HOT_EXPERTS")
    # the DSpark draft runner's filter, as upstream applies it
    got = list(patch._iterator(never, _loader(0), types.SimpleNamespace(model_or_path=folder, prefix="")))
    assert got == [("draft:embed.weight", 1), ("draft:head.weight", 2)]
