"""The demo checkpoint in DeepSeek's own quantized format: FP8 block-scaled dense, MXFP4 experts.

What DeepSeek-V4(-Flash) ships and SGLang 0.5.23 loads (read from sglang/srt/models/deepseek_v4.py,
layers/quantization/fp8.py, configs/deepseek_v4.py and transformers' finegrained_fp8.py):

- config.json carries ``quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
  "activation_scheme": "dynamic", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}``
  ([32, 32] in V4.1). SGLang builds its Fp8Config from it; ``scale_fmt`` ue8m0 also makes it
  quantize activations with power-of-two scales (w8a8 block FP8 linears).
- Dense FP8 matrices (attention wq_a/wq_b/wkv/wo_a/wo_b, the indexer's wq_b, the shared expert's
  w1/w2/w3; in V4.1 also the engram's wkv, and in the DSpark draft stages `mtp.S.*` the same
  sublayers plus main_proj): ``X.weight`` float8_e4m3fn [N, K] plus ``X.scale`` float8_e8m0fnu
  [ceil(N/bn), ceil(K/bk)], the value being weight * scale per block. SGLang renames ``.scale`` to
  ``weight_scale_inv``. The compressor and indexer-compressor projections, the indexer's
  weights_proj, the router, the embedding and the head stay BF16 (no scale) in the real
  checkpoint and are created without a quant method by SGLang.
- Routed experts MXFP4: ``layers.L.ffn.experts.E.w{1,2,3}.weight`` int8 [N, K/2], two E2M1 codes
  per byte with the low nibble = column 2j and the high nibble = column 2j+1, code values
  (0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated), plus ``.scale`` float8_e8m0fnu [N, K/32].
  SGLang detects this layout from the expert weight's safetensors dtype (I8/U8 -> FP4,
  configs/deepseek_v4.py:try_detect_fp4_experts).

The quantizers here are deterministic round-to-nearest, ties to even:
- FP8 block scale = 2^ceil(log2(amax / 448)) (a power of two, which is what ue8m0 can store), then
  the block divided by it and cast to e4m3 (torch's cast rounds to nearest even; the values are
  clamped to +-448 first so nothing saturates to NaN).
- MXFP4 scale = 2^(floor(log2(amax)) - 2) per 32 values (the OCP MX rule and gguf-py's), codes by
  nearest E2M1 value, ties to the even code, magnitudes above 6 (possible up to 8) clamped to 6.

Both round trips are exact in bf16 (an e4m3 or e2m1 value times a power of two has at most 4
significant bits), so a bf16 checkpoint of the dequantized values is the same model, bit for bit.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from kernels_triton.formats import E2M1_MIDPOINTS as _E2M1_MIDPOINTS  # noqa: F401 (tests read the ties)
from kernels_triton.formats import E4M3_MAX as FP8_MAX  # noqa: F401
from kernels_triton.formats import FP8_BLOCK_V4 as DEFAULT_BLOCK
from kernels_triton.formats import FP8_BLOCK_V41 as V41_BLOCK
from kernels_triton.formats import MXFP4_GROUP as MXFP4_BLOCK  # noqa: F401

# The quantizers are the formats module's references (re-exported: the demo's own API).
from kernels_triton.formats.codecs import (  # noqa: F401
    dequantize_fp8_block,
    dequantize_mxfp4,
    quantize_fp8_block,
    quantize_mxfp4,
)

# DeepSeek's original names of the dense matrices its checkpoint stores in FP8: the decoder layers'
# (`layers.L.`) and the DSpark draft stages' (`mtp.S.`, same sublayer names), plus V4.1's engram
# value/key projection (a ReplicatedLinear built with the quant config, its `.scale` renamed to
# weight_scale_inv by SGLang) and the draft's target-hidden projection `main_proj` (likewise).
FP8_DENSE = re.compile(
    r"^(layers|mtp)\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123]"
    r"|engram\.wkv|main_proj)\.weight$")
MXFP4_EXPERT = re.compile(r"^(layers|mtp)\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")


def block_for(variant: str) -> tuple[int, int]:
    """The FP8 weight block of a demo variant: [128, 128] for V4, [32, 32] for V4.1 (with or without vision)."""
    if variant not in ("v4", "v41", "v41-vision"):
        raise ValueError(f"unknown demo variant {variant!r} (known: v4, v41, v41-vision)")
    return V41_BLOCK if variant.startswith("v41") else DEFAULT_BLOCK


def quantization_config(block: tuple[int, int] = DEFAULT_BLOCK) -> dict[str, Any]:
    """config.json's quantization_config for the FP8 + MXFP4 checkpoint (DeepSeek's own keys)."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
            "weight_block_size": list(block)}


def quantize_state_dict(tensors: dict[str, torch.Tensor],
                        block: tuple[int, int] = DEFAULT_BLOCK) -> dict[str, torch.Tensor]:
    """Original-name bf16 tensors -> DeepSeek's FP8 dense + MXFP4 expert checkpoint (sorted by name)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if FP8_DENSE.match(name):
            q, s = quantize_fp8_block(t, block, name)
            out[name], out[name[: -len("weight")] + "scale"] = q, s
        elif MXFP4_EXPERT.match(name):
            q, s = quantize_mxfp4(t, name)
            out[name], out[name[: -len("weight")] + "scale"] = q, s
        else:
            out[name] = t
    return dict(sorted(out.items()))


def _quantized_here(name: str) -> bool:
    return bool(FP8_DENSE.match(name) or MXFP4_EXPERT.match(name))


def dequantize_state_dict(tensors: dict[str, torch.Tensor],
                          dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The inverse view: every weight quantize_state_dict quantizes (and its .scale) -> one `dtype`
    weight (exact in bf16). Other stored-quantized tensors (V4.1's engram table, FP8 rows with
    per-32 E8M0 scales, which SGLang reads as such in both forms) are left as they are."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        weight_name = name[: -len("scale")] + "weight" if name.endswith(".scale") else None
        if weight_name in tensors and _quantized_here(weight_name):
            continue
        if not _quantized_here(name):
            out[name] = t
            continue
        scale = tensors.get(name[: -len("weight")] + "scale") if name.endswith(".weight") else None
        if t.dtype == torch.float8_e4m3fn:
            if scale is None:
                raise ValueError(f"{name}: FP8 weight without its .scale tensor")
            out[name] = dequantize_fp8_block(t, scale).to(dtype)
        elif t.dtype in (torch.int8, torch.uint8) and scale is not None:
            out[name] = dequantize_mxfp4(t, scale).to(dtype)
        else:
            out[name] = t
    return dict(sorted(out.items()))


def quantized_values(tensors: dict[str, torch.Tensor],
                     block: tuple[int, int] = DEFAULT_BLOCK) -> dict[str, torch.Tensor]:
    """bf16 tensors whose quantizable weights are replaced by their quantize-dequantize values.

    This is the `--bf16` form of the demo: the same model as the quantized checkpoint, stored plainly
    (dequantize(quantize(x)) is exact in bf16 and quantizing it again gives the same codes).
    """
    return dequantize_state_dict(quantize_state_dict(tensors, block))

