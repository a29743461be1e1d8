"""Which modelled GPU effect explains the served prompt log-probabilities of a GPU run?

Input: the `prompt_logprobs.json` that tests/serve/test_server_live.py writes when
WINPORT_TEST_SERVER_LOG_DIR is set (ids, served, reference), e.g. `$OUT/servers/prompt_logprobs.json`
from `bash scripts/gpu/serve_demo.sh tests/serve/test_server_live.py -k prompt_logprobs`.
Output: for each variant of the transformers reference (activation rounding of SGLang's W8A8 paths on
CUDA switched on piece by piece), the median / max |served - reference| and the share under 0.3 nat.
The variant closest to the served values says which quantization the GPU path applies; what is left
over is what to look for in the kernels.

Usage: .venv/bin/python scripts/debug/gpu_parity.py prompt_logprobs.json [--demo .cache/winport-test/demo-v4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from winport.demo import reference as ref  # noqa: E402


def _hook(model: torch.nn.Module, *, dense: bool, experts: bool, ue8m0: bool) -> None:
    """Round the activations of the chosen W8A8 paths (the pieces of ref.add_fp8_activations)."""
    def rt(x: torch.Tensor) -> torch.Tensor:
        return ref.fp8_activation_round_trip(x, ue8m0=ue8m0)

    for name, mod in model.named_modules():
        if dense and isinstance(mod, torch.nn.Linear) and name.endswith(ref._W8A8_LINEARS):
            mod.register_forward_pre_hook(lambda _m, a: (rt(a[0]), *a[1:]))
        elif experts and name.endswith("mlp.experts") and hasattr(mod, "_apply_gate"):
            # The Triton MoE quantizes with exact scales whatever the checkpoint's scale_fmt.
            mod.register_forward_pre_hook(lambda _m, a: (ref.fp8_activation_round_trip(a[0]), *a[1:]))
            gate = mod._apply_gate
            mod._apply_gate = lambda gu, _g=gate: ref.fp8_activation_round_trip(_g(gu))


def main() -> None:
    """Print one line per reference variant."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("values", type=Path)
    ap.add_argument("--demo", type=Path, default=Path(".cache/winport-test/demo-v4"))
    args = ap.parse_args()
    data = json.loads(args.values.read_text())
    ids, served = data["ids"], data["served"]
    variants = {
        "plain (CPU-like, W8A16)": {},
        "dense W8A8 exact scales": {"dense": True, "experts": False, "ue8m0": False},
        "dense W8A8 ue8m0 scales": {"dense": True, "experts": False, "ue8m0": True},
        "MoE W8A8 only": {"dense": False, "experts": True, "ue8m0": False},
        "dense ue8m0 + MoE exact (SGLang on CUDA)": {"dense": True, "experts": True, "ue8m0": True},
        "dense exact + MoE exact": {"dense": True, "experts": True, "ue8m0": False},
    }
    for label, kw in variants.items():
        model = ref.load_reference(args.demo)
        if kw:
            _hook(model, **kw)
        lp = ref.prompt_logprobs(model, ids)
        d = [abs(a - b) for a, b in zip(served, lp, strict=True)]
        print(f"{label:44s} median {statistics.median(d):.4f}  max {max(d):.3f}  "
              f"share<0.3 {sum(x < 0.3 for x in d) / len(d):.2f}")


if __name__ == "__main__":
    main()
