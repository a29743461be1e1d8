"""MXFP4 routed experts kept 4-bit on CUDA, run by winport's Triton W4A16 MoE (opt-in: WINPORT_GPU_MXFP4_MOE=1).

Targets sglang 0.5.23 `srt/layers/quantization/fp8.py:Fp8MoEMethod`. SGLang's CUDA choices for
DeepSeek-V4's packed MXFP4 experts are flashinfer's MXFP4 MoE (no Windows build), Marlin (CUDA JIT)
or `SGLANG_DSV4_FP4_DEQUANT=1`, which turns every expert into FP8 at load (twice the memory) for
its Triton fused MoE. With WINPORT_GPU_MXFP4_MOE=1 on CUDA (and `--moe-runner-backend triton`,
which `winport serve` passes then, so SGLang's DeepSeek-V4 override does not pick flashinfer_mxfp4):
- `process_weights_after_loading_block_quant` keeps `w13_weight` / `w2_weight` as loaded (int8
  [E, N, K/2], two E2M1 codes a byte) and their float32 [E, N, K/32] scales, and returns before the
  DeepGEMM / megamoe branches;
- `apply` runs kernels_triton.mxfp4_moe.mxfp4_moe on the dispatch output's hidden states and top-k,
  with the runner config's `swiglu_limit` and `routed_scaling_factor`, and returns
  `StandardCombineInput` instead of going through the Triton MoE runner.
Without the variable, or off CUDA, both hooks call SGLang's own code unchanged. The kernel has not
run on a GPU under SGLang yet (only its own tests, on the interpreter); that is why it is opt-in.

Why this patch calls kernels_triton directly and not through a shim: shims stand in for upstream
modules SGLang imports (sgl_kernel, deep_gemm, ...) under their signatures, and no upstream kernel
has this one's signature: the flashinfer / Marlin / DeepGEMM MXFP4 paths take other layouts and
are chosen inside `apply`. The hook in `apply` is the adapter (SGLang's dispatch output and
runner config in, StandardCombineInput out), so it lives here, in the patch.
"""

from __future__ import annotations

from typing import Any

from winport import envs
from winport.patches._base import register, require_source
from winport.platform.launch_policy import gpu_mxfp4_moe

ENV = envs.WINPORT_GPU_MXFP4_MOE.name
PROCESS = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.process_weights_after_loading_block_quant"
APPLY = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.apply"
CREATE = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_fp8_moe_weight_"
FLAG = "_winport_cuda_mxfp4"  # set on a layer whose experts this patch serves


# Whether the user opted in (WINPORT_GPU_MXFP4_MOE=1): the launch policy's rule, one home.
enabled = gpu_mxfp4_moe


def _on_cuda() -> bool:
    from sglang.srt.layers.quantization import fp8

    return bool(fp8._is_cuda)


def _name(layer: Any) -> str:
    return getattr(layer, "prefix", None) or "MoE layer"


def _check_backend(method: Any, layer: Any) -> None:
    """Refuse a runner backend whose own MXFP4 path would be skipped (Marlin and flashinfer wrappers
    call this method for weight loading too, and DeepGEMM wants its own scale layout)."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    backend = get_moe_runner_backend()
    if backend.is_triton() or (backend.is_auto() and not method.is_deepgemm_moe_runner_backend_enabled()):
        return
    raise RuntimeError(f"{_name(layer)}: {ENV}=1 runs the MXFP4 experts in winport's Triton kernel, which needs "
                       f"--moe-runner-backend triton (winport's platform makes it the default), not {backend}")


def prepare_layer(method: Any, layer: Any) -> None:
    """Keep the packed experts and their fp32 scales as loaded and mark the layer for :func:`apply_mxfp4`."""
    import torch

    for wname, sname in (("w13_weight", "w13_weight_scale_inv"), ("w2_weight", "w2_weight_scale_inv")):
        w, s = getattr(layer, wname), getattr(layer, sname)
        if w.dim() != 3 or w.dtype not in (torch.int8, torch.uint8):
            raise ValueError(f"{_name(layer)}.{wname}: packed MXFP4 experts should be int8 [E, N, K/2], got "
                             f"{w.dtype} {tuple(w.shape)}")
        if s.dtype != torch.float32 or tuple(s.shape) != (w.shape[0], w.shape[1], 2 * w.shape[2] // 32):
            raise ValueError(f"{_name(layer)}.{sname}: expected float32 {(w.shape[0], w.shape[1], 2 * w.shape[2] // 32)}"
                             f" (one scale per 32 inputs of {wname}), got {s.dtype} {tuple(s.shape)}")
        # SGLang views the packed bytes as int8 on this path too; the kernel reads them as uint8.
        w.data = w.data.view(torch.int8)
    setattr(layer, FLAG, True)


def apply_mxfp4(method: Any, layer: Any, dispatch_output: Any) -> Any:
    """Routed-expert output of a prepared layer as SGLang's StandardCombineInput (the kernel's bf16 [T, H])."""
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    from kernels_triton.mxfp4_moe import mxfp4_moe

    cfg = method.moe_runner_config
    unsupported = {
        "activation": cfg.activation != "silu", "is_gated": not cfg.is_gated,
        "apply_router_weight_on_input": cfg.apply_router_weight_on_input, "no_combine": cfg.no_combine,
        "gemm1_alpha": cfg.gemm1_alpha is not None, "gemm1_beta": getattr(cfg, "gemm1_beta", None) is not None,
        "gemm1_clamp_limit": cfg.gemm1_clamp_limit is not None,
        "num_fused_shared_experts": bool(getattr(cfg, "num_fused_shared_experts", None)),
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise NotImplementedError(f"{_name(layer)}: winport's MXFP4 MoE kernel does not implement runner "
                                  f"config {', '.join(f'{k}={getattr(cfg, k)!r}' for k in bad)}")
    topk_weights, topk_ids, _ = dispatch_output.topk_output
    scaling = cfg.routed_scaling_factor
    out = mxfp4_moe(dispatch_output.hidden_states, layer.w13_weight.data, layer.w13_weight_scale_inv.data,
                    layer.w2_weight.data, layer.w2_weight_scale_inv.data, topk_ids, topk_weights,
                    swiglu_limit=cfg.swiglu_limit, routed_scaling_factor=1.0 if scaling is None else float(scaling))
    return StandardCombineInput(hidden_states=out)


def _process(original: Any, self: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
    if not (enabled() and _on_cuda() and self.is_fp4_expert):
        return original(self, layer, *args, **kwargs)
    if self.dequant_fp4_to_fp8:
        raise RuntimeError(f"{_name(layer)}: {ENV}=1 keeps the MXFP4 experts packed, but SGLANG_DSV4_FP4_DEQUANT=1 "
                           "dequantizes them to FP8; unset one of the two")
    _check_backend(self, layer)
    prepare_layer(self, layer)
    return None


def _apply(original: Any, self: Any, layer: Any, dispatch_output: Any, *args: Any, **kwargs: Any) -> Any:
    if not getattr(layer, FLAG, False):
        return original(self, layer, dispatch_output, *args, **kwargs)
    return apply_mxfp4(self, layer, dispatch_output)


def register_patch() -> None:
    """Check upstream and register both hooks (they do nothing unless WINPORT_GPU_MXFP4_MOE=1 on CUDA)."""
    require_source(PROCESS, "if self.is_fp4_expert and self.dequant_fp4_to_fp8:",
                   "layer.w13_weight.data = layer.w13_weight.data.view(fp4_weight_dtype)",
                   "transform_sf_into_required_layout")
    require_source(APPLY, "dispatch_output.topk_output", "StandardCombineInput",
                   "x = dispatch_output.hidden_states")
    require_source(CREATE, "hidden_size // 2,", "intermediate_size_per_partition // 2,", "fp4_block_k = 32",
                   "torch.float8_e8m0fnu if _use_aiter or is_xpu() else torch.float32",
                   'register_parameter("w13_weight_scale_inv"')
    require_source("sglang.srt.layers.moe.moe_runner.base.MoeRunnerConfig", "swiglu_limit",
                   "routed_scaling_factor", "gemm1_clamp_limit")
    register(PROCESS, _process)
    register(APPLY, _apply)
