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

FP8_MAX = 448.0
MXFP4_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring E2M1 magnitudes: a magnitude above midpoint i rounds to code i+1.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
DEFAULT_BLOCK = (128, 128)  # DeepSeek-V4
V41_BLOCK = (32, 32)  # DeepSeek-V4.1 (SGLang's _dequant_fp8: "V4 128x128, V4.1 32x32")

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


def _check_matrix(w: torch.Tensor, name: str) -> torch.Tensor:
    if w.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D weight, got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point weight, got {w.dtype}")
    x = w.detach().to(torch.float32)
    if not torch.isfinite(x).all():
        raise ValueError(f"{name}: weight has NaN or Inf values")
    return x


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK,
                       name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (float8_e4m3fn [N, K], float8_e8m0fnu scales [ceil(N/bn), ceil(K/bk)])."""
    x = _check_matrix(w, name)
    bn, bk = block
    n, k = x.shape
    sn, sk = -(-n // bn), -(-k // bk)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32)
    padded[:n, :k] = x
    tiles = padded.view(sn, bn, sk, bk)
    amax = tiles.abs().amax(dim=(1, 3))
    # An all-zero block gets scale 1 (any scale represents it exactly).
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp(min=1e-38) / FP8_MAX)),
                           torch.zeros_like(amax))
    scale = torch.exp2(exponent)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(sn * bn, sk * bk)[:n, :k].contiguous(), scale.to(torch.float8_e8m0fnu)


def dequantize_fp8_block(q: torch.Tensor, scale: torch.Tensor,
                         block: tuple[int, int] | None = None) -> torch.Tensor:
    """(e4m3 [N, K], scales [sn, sk]) -> float32 [N, K].

    Without `block` the block size follows from the shapes, which needs N and K to be multiples of
    it (true of every DeepSeek matrix); a ragged edge block needs the block size given.
    """
    if q.dtype != torch.float8_e4m3fn:
        raise ValueError(f"FP8 weight must be float8_e4m3fn, got {q.dtype}")
    n, k = q.shape
    sn, sk = scale.shape
    if block is None:
        if n % sn or k % sk:
            raise ValueError(f"scale grid {tuple(scale.shape)} does not divide weight {tuple(q.shape)}; "
                             "give the block size")
        block = (n // sn, k // sk)
    bn, bk = block
    if -(-n // bn) != sn or -(-k // bk) != sk:
        raise ValueError(f"scale grid {tuple(scale.shape)} does not fit weight {tuple(q.shape)} in blocks {block}")
    s = scale.to(torch.float32).repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return q.to(torch.float32) * s


def _e2m1_codes(m: torch.Tensor) -> torch.Tensor:
    """Magnitudes (already divided by the block scale) -> E2M1 magnitude codes 0..7, ties to even."""
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32)
    lower = torch.searchsorted(mids, m.contiguous(), right=False)  # midpoints strictly below m
    tie = (lower < len(mids)) & (mids[lower.clamp(max=len(mids) - 1)] == m)
    # At a tie between codes `lower` and `lower + 1`, take the even one (even mantissa bit).
    code = torch.where(tie & (lower % 2 == 1), lower + 1, lower)
    return code.clamp(max=7)


def quantize_mxfp4(w: torch.Tensor, name: str = "tensor", amax_slack: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (K % 32 == 0) -> (int8 [N, K/2] packed E2M1 pairs, float8_e8m0fnu [N, K/32]).

    ``amax_slack``: each block's exponent is taken from amax * (1 + amax_slack); a small slack finds
    the original scale again for values that are MXFP4 values plus a rounding error that may have
    pulled a power-of-two maximum just below it (winport.gguf.convert._experts_to_mxfp4)."""
    x = _check_matrix(w, name)
    n, k = x.shape
    if k % MXFP4_BLOCK:
        raise ValueError(f"{name}: MXFP4 needs the input dim divisible by {MXFP4_BLOCK}, got {k}")
    blocks = x.view(n, k // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = blocks.abs().amax(-1) * (1.0 + amax_slack)
    # floor(log2(amax)) from frexp (exact, unlike log2 near powers of two): amax = f * 2^e, f in [0.5, 1).
    _, e = torch.frexp(amax)
    exponent = torch.where(amax > 0, (e - 1 - 2).to(torch.float32), torch.full_like(amax, -127.0))
    exponent = exponent.clamp(-127.0, 127.0)
    scale = torch.exp2(exponent)
    m = (blocks.abs() / scale[..., None]).view(n, k)
    code = _e2m1_codes(m)
    sign = (x < 0) & (code > 0)  # no negative zero: a value that rounds to 0 is code 0
    nibble = (code + 8 * sign.to(code.dtype)).to(torch.uint8)
    packed = nibble[:, 0::2] | (nibble[:, 1::2] << 4)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(int8/uint8 [N, K/2] packed codes, e8m0 [N, K/32]) -> float32 [N, K]."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"MXFP4 weight must be int8 or uint8, got {packed.dtype}")
    n, half = packed.shape
    if scale.shape != (n, half * 2 // MXFP4_BLOCK):
        raise ValueError(f"MXFP4 scale shape {tuple(scale.shape)} does not fit packed weight {tuple(packed.shape)}")
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    u = packed.view(torch.uint8)
    codes = torch.stack([u & 0x0F, u >> 4], dim=-1).view(n, half * 2).long()
    return table[codes] * scale.to(torch.float32).repeat_interleave(MXFP4_BLOCK, dim=1)


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

