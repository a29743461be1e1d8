"""DeepSeek MoE routers on CUDA without SGLang's JIT tiny GEMM (nvcc through tvm_ffi, which Windows
does not have).

`srt/models/deepseek_common/utils.py` `tiny_router_gemm_max_tokens` asks
`kernels/ops/gemm/tiny_gemm.py` `can_use_tiny_gemm(num_experts, hidden)`; on any CUDA arch >= 9
(the users' SM120 included) with bf16 router weights it says yes for V4.1-Flash's 384 x 5120 gate,
and `deepseek_v2.MoEGate.forward` then calls the JIT module `tiny_n_gemm` for batches of up to 16
rows (decode, and every CUDA-graph capture). Seen on the H200 with the full-width proxy: the decode
graph capture failed on that module (SGLANG_CRASH_ON_JIT_COMPILE). The demo's 8-expert gate never
qualified, so the demo did not show it. Made to say no: the gate then takes its cuBLAS route
(`linear_bf16_fp32`, bf16 x bf16 -> fp32), the one it takes above 16 rows.

The target's source is checked first; the patch fails loudly when upstream changed.
"""

from __future__ import annotations

import importlib

from winport.patches._base import UpstreamChangedError, never_supported, require_source

TINY_GEMM = "sglang.kernels.ops.gemm.tiny_gemm"
ROUTER_ROWS = "sglang.srt.models.deepseek_common.utils.tiny_router_gemm_max_tokens"


def apply() -> None:
    """Rebind the capability check in the module the router imports it from (idempotent)."""
    tiny = importlib.import_module(TINY_GEMM)
    if not callable(getattr(tiny, "can_use_tiny_gemm", None)):
        raise UpstreamChangedError(f"{TINY_GEMM}.can_use_tiny_gemm is gone")
    tiny.can_use_tiny_gemm = never_supported


def register_patch() -> None:
    """Check that the router still asks the check at call time (a late import), then apply."""
    require_source(ROUTER_ROWS, "from sglang.kernels.ops.gemm.tiny_gemm import can_use_tiny_gemm",
                   "if not can_use_tiny_gemm(")
    require_source("sglang.srt.models.deepseek_v2.MoEGate.forward", "self.tiny_router_gemm_max_tokens",
                   "linear_bf16_fp32(hidden_states, self.weight)")
    apply()
