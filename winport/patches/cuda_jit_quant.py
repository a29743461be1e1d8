"""FP8 activation quantization on CUDA without SGLang's JIT kernels.

Targets sglang 0.5.23 `kernels/ops/quantization/fp8_kernel.py`: on CUDA it binds
`per_token_group_quant` (kernels/ops/quantization/per_token_group_quant.py) and
`sgl_per_token_quant_fp8` (kernels/ops/quantization/__init__.py), both CUDA sources compiled at run
time with nvcc through tvm_ffi, which Windows does not have. Every FP8 block linear
(`triton_w8a8_block_fp8_linear`) and the FP8 Triton MoE quantize their activations through them.
Power-of-two (UE8M0) scales kept in fp32, which V4.1's [32, 32]-block linears ask for
(`act_scale_ue8m0`), take a third JIT kernel instead: `_run_per_token_group_quant_8bit_kernel`
imports `per_token_group_quant_8bit_v2` from its own module at each call.
This patch rebinds the three names to winport's `sgl_kernel` shims (a Triton kernel on
CUDA, tested against SGLang's per-token-group reference semantics in tests/ops/test_quant.py).
Variants the shim does not implement (fused SiLU-and-mul, masked rows, packed int32 UE8M0 scales)
fail by name instead of quantizing wrongly.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from winport.patches._base import UpstreamChangedError, require_source

FP8_KERNEL = "sglang.kernels.ops.quantization.fp8_kernel"
V2_KERNEL = "sglang.kernels.ops.quantization.per_token_group_quant_8bit_v2"


def per_token_group_quant(x: torch.Tensor, x_q: torch.Tensor, x_s: torch.Tensor, group_size: int, *,
                          scale_ue8m0: bool = False, fuse_silu_and_mul: bool = False,
                          masked_m: torch.Tensor | None = None, **unsupported: Any) -> None:
    """SGLang's JIT `per_token_group_quant` (fp8 or int8 by x_q's dtype) on winport's shim."""
    import sgl_kernel

    extra = {k: v for k, v in unsupported.items() if v is not None}
    if fuse_silu_and_mul or masked_m is not None or extra or x_s.dtype != torch.float32:
        raise NotImplementedError(
            "winport per_token_group_quant: fused SiLU-and-mul, masked rows, sorted layouts and packed "
            f"UE8M0 scales are not implemented (fuse_silu_and_mul={fuse_silu_and_mul}, "
            f"masked_m={masked_m is not None}, scales {x_s.dtype}, other={sorted(extra)})")
    qmax = float(torch.finfo(x_q.dtype).max) if x_q.dtype.is_floating_point else 127.0
    qmin = -qmax if x_q.dtype.is_floating_point else -128.0
    sgl_kernel.sgl_per_token_group_quant_8bit(x, x_q, x_s, group_size, 1e-10, qmin, qmax, scale_ue8m0)


def per_token_group_quant_8bit_v2(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                                  group_size: int, eps: float, min_8bit: float, max_8bit: float,
                                  scale_ue8m0: bool = False, fuse_silu_and_mul: bool = False,
                                  masked_m: torch.Tensor | None = None) -> None:
    """SGLang's JIT `per_token_group_quant_8bit_v2` (fp32 scales, UE8M0-rounded when asked) on
    winport's shim, with upstream's quantization constants passed through."""
    import sgl_kernel

    if fuse_silu_and_mul or masked_m is not None:
        raise NotImplementedError(
            "winport per_token_group_quant_8bit_v2: fused SiLU-and-mul and masked rows are not implemented "
            f"(fuse_silu_and_mul={fuse_silu_and_mul}, masked_m={masked_m is not None})")
    sgl_kernel.sgl_per_token_group_quant_8bit(input, output_q, output_s, group_size, eps, min_8bit, max_8bit,
                                              scale_ue8m0)


def sgl_per_token_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor) -> None:
    """SGLang's JIT per-token FP8 quantization on winport's shim."""
    import sgl_kernel

    sgl_kernel.sgl_per_token_quant_fp8(input, output_q, output_s)


def apply() -> None:
    """Rebind the three JIT entry points (CUDA only: elsewhere fp8_kernel does not bind them)."""
    module = importlib.import_module(FP8_KERNEL)
    if not module._is_cuda:
        return
    for name in ("per_token_group_quant", "sgl_per_token_quant_fp8"):
        if not callable(getattr(module, name, None)):
            raise UpstreamChangedError(f"{FP8_KERNEL}.{name} is no longer bound on CUDA")
    module.per_token_group_quant = per_token_group_quant
    module.sgl_per_token_quant_fp8 = sgl_per_token_quant_fp8
    v2 = importlib.import_module(V2_KERNEL)
    if not callable(getattr(v2, "per_token_group_quant_8bit_v2", None)):
        raise UpstreamChangedError(f"{V2_KERNEL}.per_token_group_quant_8bit_v2 is gone")
    v2.per_token_group_quant_8bit_v2 = per_token_group_quant_8bit_v2


def register_patch() -> None:
    """Check that fp8_kernel still calls the two names, then rebind them."""
    require_source(f"{FP8_KERNEL}._run_per_token_group_quant_8bit_kernel", "    per_token_group_quant(",
                   "scale_ue8m0=scale_ue8m0,", "masked_m=masked_m,")
    require_source(f"{FP8_KERNEL}.sglang_per_token_quant_fp8", "sgl_per_token_quant_fp8(x, x_q, x_s)")
    # The v2 name is imported from its module at call time, so rebinding the module attribute reaches it.
    require_source(f"{FP8_KERNEL}._run_per_token_group_quant_8bit_kernel",
                   "import (\n            per_token_group_quant_8bit_v2,", "min_8bit=fp8_min,", "max_8bit=fp8_max,")
    apply()
