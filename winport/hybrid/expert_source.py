"""Where a swap reads an expert from: the checkpoint's own safetensors files, memory-mapped.

kt-kernel keeps every expert in its own layout, which Python cannot read back, and a second host
copy of 289 GB of experts is out of the question; so an expert moving onto the GPU is read from
the checkpoint (DeepSeek's names `layers.L.ffn.experts.E.w{1,2,3}.weight|scale`, MXFP4 codes and
E8M0 scales), through safetensors' memory map: only that expert's pages are touched.
"""

from __future__ import annotations

from pathlib import Path

import torch

from winport.hybrid.hot_swap import ExpertWeights
from winport.placement.source import safetensors_entries

PROJECTIONS = ("w1", "w3", "w2")


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
            raise FileNotFoundError(f"{self.folder}: no safetensors files to read the experts of layer {layer} from")
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
