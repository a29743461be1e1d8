"""DeepSeek-V4.1's indexer on CUDA without SGLang's CUDA JIT kernels (nvcc through tvm_ffi, which
Windows does not have). Three upstream choices pick a JIT kernel where SGLang has a plain path:

- `srt/layers/attention/dsv4/v41_indexer/full_topk.py` binds `is_deep_select_supported`
  (kernels/ops/attention/deep_select.py, JIT `deep_select/entry.cuh`) and, where it says yes (SM90,
  SM100, SM103), decode top-k goes through DeepSelect's `topk_page_transform`. Made to say no: decode
  then takes `select_decode`, as it does on the users' SM120, which DeepSelect does not support.
- `srt/layers/attention/dsv4/v41_indexer/scoring.py` `decode_scores` takes its paged route on SM90
  (`get_platform().is_sm90`): a top-k plan and transform from the JIT `topk_v2` module
  (kernels/ops/attention/dsv4/topk.py). The module's `get_platform` is wrapped so that this one
  function sees `is_sm90` false and takes the route SM120 takes (Triton scores, torch top-k).
- `kernels/ops/gemm/small_gemm_bf16.py` `can_use_n128k512_gemm` / `can_use_n32k5120_gemm` say yes on
  any CUDA arch >= 9 (SM120 included) and the callers (dsv41_sparse.py `forward_wk`) then call the JIT
  `small_gemm_bf16.cuh`. Made to say no: the callers fall back to their nn.Linear, as documented.

Each target's source is checked first; the patch fails loudly when upstream changed.
"""

from __future__ import annotations

import importlib
from typing import Any

from winport.patches._base import UpstreamChangedError, never_supported, require_source

FULL_TOPK = "sglang.srt.layers.attention.dsv4.v41_indexer.full_topk"
SCORING = "sglang.srt.layers.attention.dsv4.v41_indexer.scoring"
SMALL_GEMM = "sglang.kernels.ops.gemm.small_gemm_bf16"


class _NotSM90:
    """The platform seen by V4.1's decode scoring: the real one, except that it is not SM90."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    is_sm90 = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


def _platform_without_sm90(get_platform: Any) -> Any:
    def get_platform_for_scoring() -> Any:
        return _NotSM90(get_platform())

    get_platform_for_scoring.__wrapped__ = get_platform  # type: ignore[attr-defined]
    return get_platform_for_scoring


def apply() -> None:
    """Rebind the three choices in the modules that make them (idempotent)."""
    full_topk = importlib.import_module(FULL_TOPK)
    if not callable(getattr(full_topk, "is_deep_select_supported", None)):
        raise UpstreamChangedError(f"{FULL_TOPK} no longer binds is_deep_select_supported")
    full_topk.is_deep_select_supported = never_supported
    scoring = importlib.import_module(SCORING)
    original = getattr(scoring.get_platform, "__wrapped__", scoring.get_platform)
    scoring.get_platform = _platform_without_sm90(original)
    small_gemm = importlib.import_module(SMALL_GEMM)
    for name in ("can_use_n128k512_gemm", "can_use_n32k5120_gemm"):
        if not callable(getattr(small_gemm, name, None)):
            raise UpstreamChangedError(f"{SMALL_GEMM}.{name} is gone")
        setattr(small_gemm, name, never_supported)


def register_patch() -> None:
    """Check that upstream still decides the three paths as described, then apply."""
    require_source(f"{FULL_TOPK}.FullTopKIndexer.__init__", "is_deep_select_supported()")
    require_source(f"{SCORING}.decode_scores", "paged = get_platform().is_sm90", "plan_topk_v2(lens)")
    require_source("sglang.srt.layers.attention.dsv4.dsv41_sparse", "can_use_n128k512_gemm(",
                   "return self.wk(latent)")
    apply()
