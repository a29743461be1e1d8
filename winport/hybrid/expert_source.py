"""Where a swap reads an expert from: the files the server loaded it from, memory-mapped.

kt-kernel keeps every expert in its own layout, which Python cannot read back, and a second host
copy of 289 GB of experts is out of the question; so an expert moving onto the GPU is read from
the model's files, through a memory map (only that expert's pages are touched):
- a checkpoint folder's safetensors (DeepSeek's names `layers.L.ffn.experts.E.w{1,2,3}.weight|scale`,
  MXFP4 codes and E8M0 scales): CheckpointExperts;
- the GGUF a folder is served straight from (winport.gguf.direct): GGUFExperts repacks the expert's
  rows of `blk.L.ffn_{gate,up,down}_exps.weight` as loading did (winport.gguf.mxfp4_repack), so the
  bytes are those loading handed SGLang.
`expert_source` picks the one that fits the folder SGLang loaded.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from winport.hybrid.hot_swap import ExpertWeights
from winport.placement.source import safetensors_entries

PROJECTIONS = ("w1", "w3", "w2")


class NoExpertSource(Exception):
    """The loaded model has no files a swap could read experts from (the message says why)."""


def expert_names(layer: int, expert: int) -> dict[str, str]:
    """ExpertWeights field -> checkpoint tensor name of one routed expert."""
    out = {}
    for proj in PROJECTIONS:
        base = f"layers.{layer}.ffn.experts.{expert}.{proj}"
        out[proj], out[f"{proj}_scale"] = f"{base}.weight", f"{base}.scale"
    return out


class CheckpointExperts:
    """One layer's routed experts read from a checkpoint folder's safetensors files."""

    def __init__(self, folder: str | Path, layer: int, num_experts: int) -> None:
        self.folder, self.layer = Path(folder), layer
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise NoExpertSource(f"{self.folder}: no safetensors files to read the experts of layer {layer} from")
        prefix = f"layers.{layer}.ffn.experts."
        self.file_of: dict[str, Path] = {}
        for f in files:
            for name in safetensors_entries(f):
                if name.startswith(prefix):
                    self.file_of[name] = f
        missing = [n for e in range(num_experts) for n in expert_names(layer, e).values() if n not in self.file_of]
        if missing:
            raise KeyError(f"{self.folder}: {len(missing)} routed-expert tensors of layer {layer} missing, "
                           f"first {missing[0]!r}")

    def __call__(self, expert: int) -> ExpertWeights:
        """Expert `expert`'s codes and scales (the scales as their E8M0 bytes, uint8)."""
        from safetensors import safe_open

        tensors: dict[str, torch.Tensor] = {}
        names = expert_names(self.layer, expert)
        for field, name in names.items():
            with safe_open(str(self.file_of[name]), framework="pt") as st:
                t = st.get_tensor(name)
            if field.endswith("_scale"):
                if t.dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
                    raise ValueError(f"{self.file_of[name]}: {name} is {t.dtype}, not E8M0 scales")
                t = t.view(torch.uint8)
            elif t.dtype not in (torch.int8, torch.uint8):
                raise ValueError(f"{self.file_of[name]}: {name} is {t.dtype}, not packed MXFP4 codes")
            tensors[field] = t
        return ExpertWeights(**tensors)


@lru_cache(maxsize=2)
def _open_gguf(path: str) -> Any:
    # The process's one open of the GGUF (the weight stream kept it open when hot experts are on),
    # held for every layer's swaps for as long as the process serves.
    from winport.gguf.direct import hold

    return hold(path)


class GGUFExperts:
    """One layer's routed experts read from the GGUF a folder is served from (MXFP4 experts only)."""

    def __init__(self, gguf: str | Path, layer: int, num_experts: int) -> None:
        loaded = _open_gguf(str(gguf))
        self.path, self.layer = Path(gguf), layer
        self.tensors: dict[str, Any] = {}
        for name, m in loaded.plan.mapped.items():
            if m.role == "experts" and m.layer == layer:
                self.tensors[m.target.rsplit(".", 1)[1]] = loaded.model[name]
        missing = [p for p in PROJECTIONS if p not in self.tensors]
        if missing:
            raise KeyError(f"{self.path}: no routed-expert tensor for {', '.join(missing)} of layer {layer}")
        for t in self.tensors.values():
            if t.type.name != "MXFP4" or len(t.shape) != 3 or t.shape[0] != num_experts:
                raise NoExpertSource(f"{self.path}: tensor {t.name!r} is {t.type.name} {tuple(t.shape)}; GPU expert "
                                     f"swaps read {num_experts} MXFP4 experts a layer")

    def __call__(self, expert: int) -> ExpertWeights:
        """Expert `expert`'s codes (int8 [N, K/2], two a byte, low nibble first) and E8M0 scales (uint8 [N, K/32])."""
        import numpy as np

        from winport.gguf.mxfp4_repack import gguf_mxfp4_into

        out: dict[str, torch.Tensor] = {}
        for proj, t in self.tensors.items():
            _, n, k = t.shape
            packed, scales = np.empty((n, k // 2), dtype=np.uint8), np.empty((n, k // 32), dtype=np.uint8)
            gguf_mxfp4_into(t.raw_rows()[expert * n:(expert + 1) * n], packed, scales, parallel=False)
            out[proj] = torch.from_numpy(packed).view(torch.int8)
            out[f"{proj}_scale"] = torch.from_numpy(scales)
        return ExpertWeights(**out)


def expert_source(folder: str | Path, layer: int, num_experts: int) -> CheckpointExperts | GGUFExperts:
    """The reader of layer `layer`'s experts for the folder SGLang loaded: its GGUF when it is served
    straight from one, else its safetensors. NoExpertSource when neither can serve a swap."""
    from winport.gguf.direct import read_sidecar

    info = read_sidecar(folder)
    if info is None:
        return CheckpointExperts(folder, layer, num_experts)
    if not info.get("fp4_experts"):
        raise NoExpertSource(f"{info['model']}: the routed experts are not MXFP4, which GPU expert swaps read")
    return GGUFExperts(info["model"], layer, num_experts)
