"""Route counts saved from a run, and the GPU placement a later run starts from.

`winport serve --record-experts FILE` (and `winport experts record`, which serves a prompt file
through it) counts, in every hybrid MoE layer, how often each routed expert was chosen in prefill
and in decode, undecayed, and writes the totals to FILE whenever the scheduler goes idle (so the
file always holds every finished request). `--expert-placement FILE` fills each layer's GPU slots
with that layer's most-routed experts before the weights load, instead of experts 0..N-1; with hot
experts on (the CUDA default, WINPORT_HOT_EXPERTS) the slots follow the text from there.

The file (JSON, FORMAT):
    {"format": "winport-expert-routes/1", "num_experts": E, "top_k": k,
     "layers": {"<layer id>": {"prefill": [E ints], "decode": [E ints],
                               "tokens": {"prefill": n, "decode": m}}, ...}}
`tokens` counts the tokens each layer routed (rows with at least one expert; a token routes to k).
On CUDA, decode replays graphs captured at padded batch sizes: padding rows SGLang's top-k masks to
-1 do not count, others would, so there decode tokens can exceed the tokens generated.

Counting runs inside the layer's forward with fixed shapes and no host sync (captured in decode
CUDA graphs like winport.hybrid.hot_swap's counters), under the step clock's step-kind tensor
(winport.hybrid.hot_registry): graph warm-ups and captures count nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from winport import envs
from winport.hybrid.hot_swap import DECODE, PREFILL, STEP_KINDS, UNCOUNTED

FORMAT = "winport-expert-routes/1"


class RecordError(ValueError):
    """A route record that cannot be used (the message names the file and the field)."""


class RouteTally:
    """Undecayed route counts of one layer per step kind: int64 [3, E + 2] on the router's device
    (rows PREFILL, DECODE, UNCOUNTED; bin E is the router's "no expert" id -1, bin E + 1 the tokens
    routed to at least one expert)."""

    def __init__(self, num_experts: int, step_kind: torch.Tensor) -> None:
        if step_kind.shape != (1,) or step_kind.dtype != torch.int64:
            raise ValueError(f"step kind must be int64 [1], got {step_kind.dtype} {tuple(step_kind.shape)}")
        self.num_experts = num_experts
        self.step_kind = step_kind
        self.counts = torch.zeros(UNCOUNTED + 1, num_experts + 2, dtype=torch.int64, device=step_kind.device)

    def observe(self, topk_ids: torch.Tensor) -> None:
        """Fold one forward's routed logical ids ([T, k], -1 = none) into the row of the step's kind."""
        width = self.num_experts + 2
        ids = torch.remainder(topk_ids.reshape(-1).long(), self.num_experts + 1)
        rows = torch.full((1,), self.num_experts + 1, dtype=torch.int64, device=ids.device)
        # Fresh tensors each call (a tensor cached across captured graphs would be freed into their pool).
        ones = torch.ones(ids.shape[0], dtype=torch.int64, device=ids.device)
        # Rows routed to at least one expert: the padding of a captured batch, where SGLang's top-k
        # masks it to -1, is not a token.
        tokens = (topk_ids >= 0).any(dim=-1).sum().reshape(1).long()
        flat = self.step_kind * width + torch.cat([ids, rows])
        self.counts.view(-1).index_add_(0, flat, torch.cat([ones, tokens]))

    def read(self) -> dict[str, object]:
        """This layer's entry of the record file (one device-to-host copy)."""
        rows = self.counts.tolist()
        out: dict[str, object] = {kind: rows[row][: self.num_experts] for kind, row in zip(STEP_KINDS, (PREFILL, DECODE), strict=True)}
        out["tokens"] = {kind: rows[row][self.num_experts + 1] for kind, row in zip(STEP_KINDS, (PREFILL, DECODE), strict=True)}
        return out

    def routes(self) -> LayerRoutes:
        """This layer's counts as the record holds them."""
        entry = self.read()
        return LayerRoutes(entry["prefill"], entry["decode"], entry["tokens"])  # type: ignore[arg-type]


@dataclass(frozen=True)
class LayerRoutes:
    """One layer's recorded route counts and rows, per step kind."""

    prefill: list[int]
    decode: list[int]
    tokens: dict[str, int]

    def ranked(self) -> list[int]:
        """Expert ids, most routed first: by decode routes (what GPU slots speed up), then prefill
        routes, then the lower id."""
        return sorted(range(len(self.decode)), key=lambda e: (-self.decode[e], -self.prefill[e], e))


@dataclass(frozen=True)
class RouteRecord:
    """A route record file's contents."""

    num_experts: int
    top_k: int
    layers: dict[int, LayerRoutes] = field(default_factory=dict)

    def to_json(self) -> str:
        """The file's text."""
        return json.dumps({"format": FORMAT, "num_experts": self.num_experts, "top_k": self.top_k,
                           "layers": {str(i): {"prefill": r.prefill, "decode": r.decode, "tokens": r.tokens}
                                      for i, r in sorted(self.layers.items())}})

    def placement(self, layer_id: int, num_slots: int, source: object = "the route record") -> list[int]:
        """The `num_slots` most-routed experts of layer `layer_id` (slot 0 the most routed)."""
        if layer_id not in self.layers:
            have = ", ".join(str(i) for i in sorted(self.layers)) or "none"
            raise RecordError(f"{source}: no route counts for MoE layer {layer_id} (it has layers {have}); "
                              "record it from this model")
        if not 0 <= num_slots <= self.num_experts:
            raise RecordError(f"{source}: {num_slots} GPU slots for {self.num_experts} experts")
        return self.layers[layer_id].ranked()[:num_slots]


def save(record: RouteRecord, path: Path) -> None:
    """Write `record` to `path` atomically (a temporary file beside it, then a rename): a reader, or
    a crash, never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json(), encoding="utf-8")
    os.replace(tmp, path)


def _int_list(value: object, n: int, where: str) -> list[int]:
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, int) and v >= 0 for v in value):
        raise RecordError(f"{where}: must be a list of {n} route counts (integers >= 0)")
    return value


def load(path: Path, num_experts: int | None = None) -> RouteRecord:
    """Read and check a route record; `num_experts` (the model's) must match when given."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecordError(f"route record {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise RecordError(f"route record {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise RecordError(f"route record {path}: field 'format' is {got!r}, expected {FORMAT!r} "
                          "(written by `winport serve --record-experts` or `winport experts record`)")
    e, k = data.get("num_experts"), data.get("top_k")
    if not isinstance(e, int) or e < 1 or not isinstance(k, int) or not 1 <= k <= e:
        raise RecordError(f"route record {path}: fields 'num_experts' ({e!r}) and 'top_k' ({k!r}) must be "
                          "integers with 1 <= top_k <= num_experts")
    if num_experts is not None:
        _check_experts(e, num_experts, f"route record {path}")
    layers_in = data.get("layers")
    if not isinstance(layers_in, dict) or not layers_in:
        raise RecordError(f"route record {path}: field 'layers' must map layer ids to route counts")
    layers: dict[int, LayerRoutes] = {}
    for key, entry in layers_in.items():
        where = f"route record {path}: layers.{key}"
        if not key.isdigit() or not isinstance(entry, dict):
            raise RecordError(f"{where}: a layer id must be an integer and its entry an object")
        tokens = entry.get("tokens")
        if not isinstance(tokens, dict) or not all(isinstance(tokens.get(s), int) and tokens[s] >= 0 for s in STEP_KINDS):
            raise RecordError(f"{where}.tokens: must hold integer 'prefill' and 'decode' row counts")
        layers[int(key)] = LayerRoutes(_int_list(entry.get("prefill"), e, f"{where}.prefill"),
                                       _int_list(entry.get("decode"), e, f"{where}.decode"),
                                       {s: tokens[s] for s in STEP_KINDS})
    return RouteRecord(e, k, layers)


def _check_experts(recorded: int, model: object, source: object) -> None:
    if recorded != model:
        raise RecordError(f"{source}: field 'num_experts' is {recorded}, but the model has {model} "
                          "routed experts a layer: recorded from another model")


def check_model(record: RouteRecord, config: dict[str, object], source: object) -> None:
    """Refuse a record whose layers or expert count do not fit the model's config.json (DeepSeek-V4
    keys: n_routed_experts, num_hidden_layers, first_k_dense_replace)."""
    _check_experts(record.num_experts, config.get("n_routed_experts"), source)
    first, last = config.get("first_k_dense_replace") or 0, config.get("num_hidden_layers")
    if isinstance(first, int) and isinstance(last, int) and config.get("moe_layer_freq", 1) == 1:
        missing = [i for i in range(first, last) if i not in record.layers]
        extra = [i for i in record.layers if not first <= i < last]
        if missing or extra:
            raise RecordError(f"{source}: field 'layers' has MoE layers {sorted(record.layers)}, the model "
                              f"{list(range(first, last))}: recorded from another model")


@lru_cache(maxsize=4)
def _placement_record(path: str, num_experts: int) -> RouteRecord:
    return load(Path(path), num_experts)


def initial_experts(layer_id: int, num_slots: int, num_experts: int) -> list[int] | None:
    """The experts layer `layer_id`'s GPU slots start with under WINPORT_EXPERT_PLACEMENT (the file is
    read once per process), or None without it (SlotMap's default, experts 0..N-1)."""
    path = envs.WINPORT_EXPERT_PLACEMENT.get()
    if path is None:
        return None
    record = _placement_record(str(path), num_experts)
    return record.placement(layer_id, num_slots, f"route record {path}")


@dataclass
class RouteRecorder:
    """This process's route tallies, written to `path` when the scheduler goes idle after counting."""

    path: Path
    num_experts: int
    top_k: int
    tallies: dict[int, RouteTally] = field(default_factory=dict)
    dirty: bool = False
    writes: int = 0

    def add(self, layer_id: int, tally: RouteTally) -> None:
        """Count this layer's routes into the file."""
        if tally.num_experts != self.num_experts:
            raise ValueError(f"MoE layer {layer_id}: {tally.num_experts} experts, the record has {self.num_experts}")
        self.tallies[layer_id] = tally

    def flush(self) -> bool:
        """Write the file if a counted forward ran since the last write; True when it wrote."""
        if not self.dirty or not self.tallies:
            return False
        self.dirty = False
        if any(t.counts.is_cuda for t in self.tallies.values()):
            torch.cuda.synchronize()  # idle: the last step's counters are complete once its stream is
        layers = {layer_id: tally.routes() for layer_id, tally in self.tallies.items()}
        save(RouteRecord(self.num_experts, self.top_k, layers), self.path)
        self.writes += 1
        return True


def record_path() -> Path | None:
    """Where WINPORT_EXPERTS_RECORD asks this process to write its route counts, or None."""
    path = envs.WINPORT_EXPERTS_RECORD.get()
    return None if path is None else Path(path)
