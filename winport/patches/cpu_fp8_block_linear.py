"""Block-FP8 dense linears on CPUs without AMX: dequantize once at load, bf16 matmul (W8A16).

Targets sglang 0.5.23 `srt/layers/quantization/fp8.py:Fp8LinearMethod.process_weights_after_loading_block_quant`,
which on CPU asserts AMX ("Fp8LinearMethod on CPU requires that CPU has AMX support") and repacks
the weight for sgl_kernel's AMX `fp8_scaled_mm_cpu`. That AMX kernel is W8A16: it widens the FP8
blocks to bf16 and multiplies bf16 activations. Here the same arithmetic runs in torch: the FP8
weight times its block scales (exact in bf16: 4 significant bits times a power of two) is kept as
a bf16 copy next to the FP8 parameter, and the method's block linear becomes `F.linear` with it.
No activation quantization, as on SGLang's CPU path (the CUDA path is W8A8 instead).

It costs 2 bytes per weight more memory (the bf16 copy); right for the demo and any model whose
dense part fits twice; a large model on CPU wants a fused kernel instead. Applied only when
SGLang runs on CPU and the CPU has no AMX (with AMX, SGLang's own path is left alone).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kernels_triton.formats.codecs import dequantize_fp8_block
from winport.patches._base import register, require_source

TARGET = "sglang.srt.layers.quantization.fp8.Fp8LinearMethod.process_weights_after_loading_block_quant"


def dequantize_block_fp8(weight: torch.Tensor, scale: torch.Tensor, block: list[int] | tuple[int, int],
                         dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """FP8 e4m3 [N, K] with per-[bn, bk] block scales (fp32 or e8m0) -> `dtype` [N, K].

    The block-FP8 reference of kernels_triton.formats.codecs, in float32, cast once to `dtype`.
    """
    return dequantize_fp8_block(weight, scale, (int(block[0]), int(block[1]))).to(dtype)


def block_fp8_linear_w8a16(input: torch.Tensor, weight: torch.Tensor, block_size: list[int],  # noqa: A002
                           weight_scale: torch.Tensor, input_scale: torch.Tensor | None = None,
                           bias: torch.Tensor | None = None, weight_bf16: torch.Tensor | None = None,
                           **_: Any) -> torch.Tensor:
    """SGLang's block-FP8 linear signature, computed as bf16 activations x dequantized weight."""
    if input_scale is not None:
        raise NotImplementedError("winport's CPU block-FP8 linear takes bf16 activations, not pre-quantized FP8 ones")
    w = weight_bf16 if weight_bf16 is not None else dequantize_block_fp8(weight, weight_scale, block_size, input.dtype)
    return F.linear(input, w.to(input.dtype), bias)


def _cpu_without_amx() -> bool:
    from sglang.srt.layers.quantization import fp8

    return bool(fp8._is_cpu and not fp8._is_cpu_amx_available)


def prepare_layer(method: Any, layer: Any) -> None:
    """What the hook does to one layer: keep the FP8 weight, add its bf16 form, switch the linear."""
    if getattr(method, "use_mxfp8", False) or getattr(method, "convert_mxfp8_to_block", False):
        raise NotImplementedError(f"{type(layer).__name__}: MXFP8 linears are not served on CPU by winport")
    layer.weight.requires_grad_(False)
    layer.weight_scale_inv.requires_grad_(False)
    layer._winport_weight_bf16 = dequantize_block_fp8(layer.weight.data, layer.weight_scale_inv.data,
                                                      method.weight_block_size)
    # Fp8LinearMethod.apply passes layer._block_fp8_bf16_weight to the linear as weight_bf16.
    layer._block_fp8_bf16_weight = layer._winport_weight_bf16
    method.w8a8_block_fp8_linear = block_fp8_linear_w8a16


def _process(original: Any, self: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
    if not _cpu_without_amx():
        return original(self, layer, *args, **kwargs)
    prepare_layer(self, layer)
    return None


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, "Fp8LinearMethod on CPU requires that CPU has AMX support",
                   '_amx_process_weight_after_loading(layer, ["weight"])')
    require_source("sglang.srt.layers.quantization.fp8.Fp8LinearMethod.apply",
                   'cached_weight = getattr(layer, "_block_fp8_bf16_weight", None)',
                   '{"weight_bf16": cached_weight}', "return self.w8a8_block_fp8_linear(")
    register(TARGET, _process)
