"""Send DeepSeek-V4 through SGLang's device-generic (XPU) kernel route.

Targets sglang 0.5.23: `srt/models/deepseek_v4.py`, `deepseek_v4_mhc.py`, `srt/layers/attention/deepseek_v4_backend.py`,
`kernels/ops/attention/dsv4/compress.py`, `norm_rope.py` and `topk.py`. Each keeps a module flag
`_is_xpu` (topk.py calls `is_xpu()`); where it holds, SGLang skips FlashMLA's scheduling metadata,
TileLang and the CUDA JIT kernels (compiled with nvcc through tvm_ffi at run time, which Windows
and CPU-only machines lack) and calls plain functions from `sgl_kernel` instead. winport's
`sgl_kernel` shim provides those functions (torch on CPU, Triton on CUDA), so on winport's platforms
the flag is set in these modules only: nothing else in SGLang believes it runs on an XPU.

Names the modules import at import time under the flag are bound here to forwarders that look the
function up in `sgl_kernel` when called, so a missing shim fails with a message naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from winport.patches._base import UpstreamChangedError, require_source

BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
MODEL = "sglang.srt.models.deepseek_v4"
MHC = "sglang.srt.models.deepseek_v4_mhc"
COMPRESS = "sglang.kernels.ops.attention.dsv4.compress"
NORM_ROPE = "sglang.kernels.ops.attention.dsv4.norm_rope"
TOPK = "sglang.kernels.ops.attention.dsv4.topk"
ACT_CLAMP = "sglang.kernels.ops.activation.silu_and_mul_clamp"
DSV4_OPS = "sglang.kernels.ops.attention.dsv4"
METADATA = "sglang.srt.layers.attention.dsv4.metadata"

# module -> {name bound in the module: sgl_kernel function it stands for}
IMPORT_TIME_NAMES: dict[str, dict[str, str]] = {
    MODEL: {},
    MHC: {},
    BACKEND: {},
    COMPRESS: {
        "compress_norm_rope_store_xpu": "compress_norm_rope_store",
        "flash_compress4_decode": "flash_compress4_decode",
        "flash_compress4_prefill": "flash_compress4_prefill",
        "flash_compress128_decode": "flash_compress128_decode",
        "flash_compress128_prefill": "flash_compress128_prefill",
        "plan_compress_decode": "plan_compress_decode",
        "plan_compress_decode_legacy": "plan_compress_decode_legacy",
        "plan_compress_prefill": "plan_compress_prefill",
        "plan_compress_prefill_legacy": "plan_compress_prefill_legacy",
    },
    ACT_CLAMP: {},
    NORM_ROPE: {
        "fused_k_norm_rope_flashmla_xpu": "fused_k_norm_rope_flashmla",
        "fused_q_norm_rope_xpu": "fused_q_norm_rope",
    },
}


def _forwarder_to(library: str, name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(library), name)(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"{library}.{name}"
    return call


def _forwarder(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        import sgl_kernel

        return getattr(sgl_kernel, name)(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"sgl_kernel.{name}"
    return call


def apply() -> None:
    """Set the XPU route in the DeepSeek-V4 modules and bind the names it imports."""
    for module_name, names in IMPORT_TIME_NAMES.items():
        module = importlib.import_module(module_name)
        if not isinstance(getattr(module, "_is_xpu", None), bool):
            raise UpstreamChangedError(f"{module_name} has no boolean _is_xpu flag any more")
        module._is_xpu = True
        for bound, target in names.items():
            setattr(module, bound, _forwarder(target))
    compress = importlib.import_module(COMPRESS)
    compress._XPU_COMPRESS_FNS = {
        4: (compress.flash_compress4_decode, compress.flash_compress4_prefill),
        128: (compress.flash_compress128_decode, compress.flash_compress128_prefill),
    }
    topk = importlib.import_module(TOPK)
    topk.is_xpu = lambda: True
    # The indexer's DeepGEMM schedule metadata comes from a CUDA JIT kernel for large batches (and
    # whenever SGLANG_OPT_USE_JIT_INDEXER_METADATA is on); the deep_gemm shim computes the same
    # [num_sms + 1, 2] schedule, and winport's fp8_paged_mqa_logits is what consumes it.
    dsv4_ops = importlib.import_module(DSV4_OPS)
    dsv4_ops.get_paged_mqa_logits_metadata = _forwarder_to("deep_gemm", "get_paged_mqa_logits_metadata")


def register_patch() -> None:
    """Check that upstream still has the XPU branches this relies on, then apply."""
    require_source(f"{MODEL}.get_mhc_ops", "if _is_xpu:", "from sgl_kernel import (")
    require_source(f"{BACKEND}._create_flashmla_metadata", "get_platform().is_sm120 or _is_xpu")
    require_source(f"{COMPRESS}.CompressorPrefillPlan.generate", "if _is_xpu:", "fn = plan_compress_prefill")
    require_source(f"{COMPRESS}.compress_forward", "_XPU_COMPRESS_FNS")
    require_source(f"{NORM_ROPE}.fused_q_norm_rope", "fused_q_norm_rope_xpu")
    require_source(f"{TOPK}.topk_transform_paged", "elif is_xpu():", "torch.ops.sgl_kernel.topk_transform(")
    require_source(f"{ACT_CLAMP}.silu_and_mul_clamp", "if _is_xpu:", "from sgl_kernel import silu_and_mul_clamp")
    require_source(f"{METADATA}.PagedIndexerMetadata.__post_init__",
                   "from sglang.kernels.ops.attention.dsv4 import (", "get_paged_mqa_logits_metadata,")
    apply()
