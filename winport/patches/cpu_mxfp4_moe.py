"""MXFP4 routed experts (DeepSeek-V4's checkpoint format) on CPUs without AMX, in torch.

Targets sglang 0.5.23 `srt/layers/quantization/fp8.py:Fp8MoEMethod`: its
`process_weights_after_loading_block_quant` asserts AMX on CPU ("Fp8MoEMethod on CPU requires that
CPU has AMX support") and its `apply` has no CPU path for packed FP4 experts (the AMX kernel takes
FP8 W8A16 experts only). With this patch, on a CPU without AMX the packed E2M1 codes and their
E8M0 scales stay as loaded (int8 [E, N, K/2], fp32 [E, N, K/32]) and `apply` runs each routed
expert as bf16 activations x its dequantized weights (W4A16, what kt-kernel's MXFP4 CPU MoE
computes), with DeepSeek's SwiGLU clamp (gate <= limit, |up| <= limit), weighted by the router.
Experts are dequantized when a token is routed to them, so the weights stay 4-bit in memory.
Until kt-kernel serves the experts this is the demo's CPU expert path; it is a reference, not fast.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kernels_triton.formats.codecs import dequantize_mxfp4 as _dequantize_mxfp4
from winport.patches._base import register, require_source

PROCESS = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.process_weights_after_loading_block_quant"
APPLY = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.apply"


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """int8 [N, K/2] (low nibble = column 2j) and E8M0-valued scales [N, K/32] -> `dtype` [N, K].

    The MXFP4 reference of kernels_triton.formats.codecs (float32, cast once to `dtype`).
    """
    return _dequantize_mxfp4(packed, scale, torch.float32).to(dtype)


def mxfp4_moe(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
              w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              swiglu_limit: float | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) for SiLU-gated MXFP4 experts.

    w13 [E, 2I, H/2] holds gate rows then up rows; w2 [E, H, I/2]. Ids < 0 (no expert) are skipped.
    """
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        if e < 0:
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gate_up = F.linear(x[tok], dequantize_mxfp4(w13[e], w13_scale[e], x.dtype))
        gate, up = gate_up.chunk(2, dim=-1)
        if swiglu_limit:
            gate = gate.clamp(max=swiglu_limit)
            up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
        y = F.linear(F.silu(gate) * up, dequantize_mxfp4(w2[e], w2_scale[e], x.dtype))
        out.index_add_(0, tok, y.float() * topk_weights[tok, slot, None].float())
    return out.to(x.dtype)


def _cpu_without_amx() -> bool:
    from sglang.srt.layers.quantization import fp8

    return bool(fp8._is_cpu and not fp8._is_cpu_amx_available)


def _process(original: Any, self: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
    if not _cpu_without_amx():
        return original(self, layer, *args, **kwargs)
    if not self.is_fp4_expert:
        raise NotImplementedError(f"{getattr(layer, 'prefix', 'MoE layer')}: block-FP8 experts on a CPU without "
                                  "AMX are not served by winport (MXFP4 experts are)")
    layer._winport_cpu_mxfp4 = True
    return None


def _apply(original: Any, self: Any, layer: Any, dispatch_output: Any, *args: Any, **kwargs: Any) -> Any:
    if not getattr(layer, "_winport_cpu_mxfp4", False):
        return original(self, layer, dispatch_output, *args, **kwargs)
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    cfg = self.moe_runner_config
    if cfg.apply_router_weight_on_input or cfg.activation != "silu" or cfg.gemm1_alpha is not None:
        raise NotImplementedError(f"winport CPU MXFP4 MoE: unsupported runner config {cfg}")
    topk_weights, topk_ids, _ = dispatch_output.topk_output
    out = mxfp4_moe(dispatch_output.hidden_states, layer.w13_weight.data, layer.w13_weight_scale_inv.data,
                    layer.w2_weight.data, layer.w2_weight_scale_inv.data, topk_weights, topk_ids,
                    cfg.swiglu_limit)
    return StandardCombineInput(hidden_states=out)


def register_patch() -> None:
    """Check upstream and register both hooks."""
    require_source(PROCESS, "Fp8MoEMethod on CPU requires that CPU has AMX support",
                   '_amx_process_weight_after_loading(layer, ["w13_weight", "w2_weight"])')
    require_source(APPLY, "if use_intel_amx_backend(layer):", "dispatch_output.topk_output")
    require_source("sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_fp8_moe_weight_",
                   "hidden_size // 2,", "fp4_block_k = 32", 'register_parameter("w13_weight_scale_inv"')
    register(PROCESS, _process)
    register(APPLY, _apply)
