"""GGUF tensor names and hparam keys -> SGLang DeepSeek-V4 names, driven by deepseek4_names.toml.

The table is data: forks that spell a tensor differently get an alias line there, not code here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .reader import GGUFError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

TABLE_PATH = Path(__file__).with_name("deepseek4_names.toml")
ROLES = ("fp8", "float", "experts", "engram", "int")
DEEPSEEK4_ARCHS = ("deepseek4", "deepseek41")


@dataclass(frozen=True)
class NameEntry:
    """One row of the table."""

    gguf: tuple[str, ...]
    target: str
    role: str
    required: bool
    per_layer: bool
    patterns: tuple[re.Pattern[str], ...] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Mapping:
    """Where one GGUF tensor goes."""

    gguf_name: str
    target: str  # with {L} filled in; experts keep {E}
    role: str
    layer: int | None
    entry: NameEntry = field(repr=False, compare=False)


@dataclass
class NamePlan:
    """Result of mapping a file's tensor names: mapped, unknown, missing required."""

    mapped: dict[str, Mapping]
    unknown: list[str]
    missing: list[str]
    n_layers: int

    def check(self, path: Any = "<model>") -> None:
        """Raise a GGUFError naming every missing required tensor at once."""
        if self.missing:
            raise GGUFError(
                f"{path}: {len(self.missing)} required tensor(s) missing: " + ", ".join(self.missing)
            )


def _compile(gguf_name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(gguf_name).replace(r"\{L\}", r"(?P<L>\d+)") + "$")


@lru_cache(maxsize=4)
def load_table(path: str | None = None) -> tuple[tuple[NameEntry, ...], dict[str, str]]:
    """Parse the name table: (tensor entries, hparam key map)."""
    p = Path(path) if path else TABLE_PATH
    with open(p, "rb") as fh:
        data = tomllib.load(fh)
    entries = []
    for row in data.get("tensor", []):
        role = row["role"]
        if role not in ROLES:
            raise ValueError(f"{p}: unknown role {role!r} for {row['target']!r}")
        gguf = tuple(row["gguf"])
        entries.append(
            NameEntry(
                gguf=gguf,
                target=row["target"],
                role=role,
                required=bool(row.get("required", False)),
                per_layer=any("{L}" in g for g in gguf),
                patterns=tuple(_compile(g) for g in gguf),
            )
        )
    return tuple(entries), dict(data.get("hparams", {}))


def map_name(name: str) -> Mapping | None:
    """Map one GGUF tensor name, or None when the table does not know it."""
    entries, _ = load_table()
    for entry in entries:
        for pat in entry.patterns:
            m = pat.match(name)
            if m:
                layer = int(m.group("L")) if entry.per_layer else None
                target = entry.target.replace("{L}", str(layer)) if layer is not None else entry.target
                return Mapping(name, target, entry.role, layer, entry)
    return None


def plan_names(tensor_names: Iterable[str], n_layers: int) -> NamePlan:
    """Map every name; list unknown names and required names missing for layers [0, n_layers).

    A required entry with aliases is satisfied by any one alias. Two GGUF tensors that map to the
    same target are an error (the file would load one over the other).
    """
    entries, _ = load_table()
    names = list(tensor_names)
    mapped: dict[str, Mapping] = {}
    unknown: list[str] = []
    by_target: dict[str, str] = {}
    for name in names:
        m = map_name(name)
        if m is None:
            unknown.append(name)
            continue
        if m.target in by_target:
            raise GGUFError(f"tensors {by_target[m.target]!r} and {name!r} both map to {m.target!r}")
        by_target[m.target] = name
        mapped[name] = m
    present = set(names)
    missing: list[str] = []
    for entry in entries:
        if not entry.required:
            continue
        layers: Iterable[int | None] = range(n_layers) if entry.per_layer else (None,)
        for layer in layers:
            alts = [g.replace("{L}", str(layer)) if layer is not None else g for g in entry.gguf]
            if not any(a in present for a in alts):
                missing.append(alts[0])
    return NamePlan(mapped, unknown, missing, n_layers)


def hparams_from_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """SGLang config values from ``{arch}.*`` metadata keys (unknown keys are left out)."""
    _, table = load_table()
    arch = metadata.get("general.architecture", "")
    out: dict[str, Any] = {}
    prefix = f"{arch}."
    for key, value in metadata.items():
        if not key.startswith(prefix):
            continue
        target = table.get(key[len(prefix) :])
        if target is None:
            continue
        if hasattr(value, "tolist"):
            value = value.tolist()
        out[target] = value
    return out


def n_layers_from_metadata(metadata: dict[str, Any], tensor_names: Iterable[str] | dict[str, Any],
                           where: Any = "<gguf>") -> int:
    """Layer count: ``{arch}.block_count`` or, failing that, 1 + the highest ``blk.N``.

    Every hparam is bounded first (winport.gguf.bounds): the count feeds loops over layers, and a
    crafted file must not make them run for minutes.
    """
    from .bounds import check_hparams, tensor_layers

    check_hparams(metadata, tensor_names, where)
    arch = metadata.get("general.architecture", "")
    n = metadata.get(f"{arch}.block_count")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    return tensor_layers(tensor_names)
