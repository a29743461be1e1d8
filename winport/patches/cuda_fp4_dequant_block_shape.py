"""MXFP4 experts dequantized to block FP8 on CUDA: the MoE's block shape follows the new scales.

Targets sglang 0.5.23 `srt/layers/quantization/fp8.py:Fp8MoEMethod.process_weights_after_loading_block_quant`.
With SGLANG_DSV4_FP4_DEQUANT=1 (what `winport serve` sets on CUDA unless WINPORT_GPU_MXFP4_MOE=1
selects winport's MXFP4 MoE kernel, see winport.patches.cuda_mxfp4_moe; flashinfer's has no Windows
build) its CUDA branch turns each expert's MXFP4 weight into FP8 with `cast_e2m1fn_to_e4m3fn`,
whose scales come in [128, 128] blocks (`fp8_block_size = 128` there), but it leaves the method's
`weight_block_size` at the checkpoint's dense block size. The Triton fused MoE then reads the scales
with `block_shape=self.weight_block_size` (`get_triton_quant_info`). DeepSeek-V4 checkpoints use
[128, 128] for dense weights, so the two agree by coincidence; DeepSeek-V4.1 uses [32, 32], and the
kernel would index a [N/128, K/128] scale grid as [N/32, K/32]: wrong experts at best. The ROCm
(aiter) branch of the same function sets [128, 128] after its own dequantization; this hook does the
same for the CUDA branch, after checking that the scales really are in [128, 128] blocks.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

PROCESS = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.process_weights_after_loading_block_quant"
CAST = "sglang.srt.layers.quantization.fp8.cast_e2m1fn_to_e4m3fn"
TRITON_INFO = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.get_triton_quant_info"
DEQUANT_BLOCK = [128, 128]  # cast_e2m1fn_to_e4m3fn's fp8_block_size


def _grid(n: int, k: int, block: list[int]) -> tuple[int, int]:
    return -(-n // block[0]), -(-k // block[1])


def after_process(result: Any, method: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
    """Set the method's block shape to the dequantized experts' [128, 128] (when they were dequantized)."""
    dequantized = (getattr(method, "dequant_fp4_to_fp8", False)
                   and getattr(method.quant_config, "is_fp4_experts", False)
                   and not getattr(method, "is_fp4_expert", True))
    if not dequantized or list(method.weight_block_size or []) == DEQUANT_BLOCK:
        return None
    for weight, scale in ((layer.w13_weight, layer.w13_weight_scale_inv), (layer.w2_weight, layer.w2_weight_scale_inv)):
        want = _grid(weight.shape[-2], weight.shape[-1], DEQUANT_BLOCK)
        if tuple(scale.shape[-2:]) != want:
            raise RuntimeError(
                f"{getattr(layer, 'prefix', 'MoE layer')}: FP4 experts dequantized to FP8 have scales "
                f"{tuple(scale.shape)}, not the [128, 128]-block grid {want} winport expects from "
                "cast_e2m1fn_to_e4m3fn; SGLang changed, review winport.patches.cuda_fp4_dequant_block_shape")
    method.weight_block_size = list(DEQUANT_BLOCK)
    return None


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(PROCESS, "if self.is_fp4_expert and self.dequant_fp4_to_fp8:", "cast_e2m1fn_to_e4m3fn(",
                   "self.is_fp4_expert = False", "self.weight_block_size = [128, 128]")
    require_source(CAST, "fp8_block_size = 128")
    require_source(TRITON_INFO, "block_shape=self.weight_block_size")
    register(PROCESS, after_process, kind="AFTER")
