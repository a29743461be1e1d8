"""Routed experts in kt-kernel (CPU) inside SGLang 0.5.23's DeepSeek-V4 MoE layers: winport's KT method.

Targets sglang 0.5.23 `srt/layers/moe/fused_moe_triton/layer.py:FusedMoE` and
`srt/layers/quantization/fp8.py:Fp8Config.get_quant_method`:
- `Fp8Config.get_quant_method`: for a FusedMoE that is not a speculative draft's
  (`FusedMoE.is_draft`, set from `get_flags().moe.in_speculative_scope` before the quant method
  is made: the DSpark draft's layer ids 0..2 duplicate the target's), the Fp8MoEMethod it returns is
  wrapped in winport.hybrid.method.WinportKTMoEMethod when winport's KT path is on;
- `FusedMoE.weight_loader`: on such a layer, each expert tensor is staged for kt-kernel and loaded
  into its GPU slot only if the expert is resident;
- `create_kt_config_from_server_args` (as layer.py imported it): returns None, so SGLang's own
  KTEPWrapperMethod, which raises TypeError against kt-kernel 0.7.2, is never built; SGLang's
  --kt-* flags are read by winport's method instead (winport.hybrid.settings).
On when WINPORT_KT_MOE=1 (what `winport serve` sets when kt-kernel can run) or SGLang's
--kt-weight-path is given. When kt-kernel cannot be imported, one line says so and the experts stay
on the GPU side's method (on CPU-only torch the torch W4A16 reference, winport.patches.cpu_mxfp4_moe).
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

GET_QUANT_METHOD = "sglang.srt.layers.quantization.fp8.Fp8Config.get_quant_method"
WEIGHT_LOADER = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.weight_loader"
KT_CONFIG = "sglang.srt.layers.moe.fused_moe_triton.layer.create_kt_config_from_server_args"
_state: dict[str, Any] = {}


def active() -> bool:
    """Whether winport's KT method serves the routed experts in this process (kt-kernel imported)."""
    if "active" in _state:
        return bool(_state["active"])
    from sglang.srt.runtime_context import get_exec

    from winport.hybrid.settings import enabled_by_env

    wanted = enabled_by_env() or get_exec().moe.kt_weight_path is not None
    ok = False
    if wanted:
        try:
            from winport.hybrid.kt_experts import import_kt

            import_kt()
            check_kt_sources()
            ok = True
        except ImportError as exc:
            print(f"winport: kt-kernel cannot load ({exc}); routed experts run in the GPU side's method (on the CPU: "
                  "the torch W4A16 reference, winport.patches.cpu_mxfp4_moe)", flush=True)
    _state["active"] = ok
    return ok


def check_kt_sources() -> None:
    """kt-kernel 0.7.2 code the hand-off and the zero-path guard rely on (winport.hybrid.kt_experts)."""
    require_source("kt_kernel.utils.amx.NativeMoEWrapper.__init__",
                   "if NativeMoEWrapper._native_loader_instance is None:")
    require_source("kt_kernel.utils.amx.NativeMoEWrapper.load_weights", "self.loader.load_experts(base_key)",
                   'self.gate_scales = weights["gate_scale"]', "moe_config.swiglu_limit = self.swiglu_limit",
                   "self.cpu_infer.submit(self.moe.load_weights_task(", "NativeMoEWrapper._release_loader(")
    require_source("kt_kernel.experts_base._should_bypass_stream_callback", '"KT_FORCE_SYNC_SUBMIT"')
    require_source("kt_kernel.experts_base.BaseMoEWrapper.__init__", "self.gpu_experts_mask.copy_(gpu_experts_mask)")


def _get_quant_method(original: Any, self: Any, layer: Any, prefix: str, *args: Any, **kwargs: Any) -> Any:
    method = original(self, layer, prefix, *args, **kwargs)
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

    if not (isinstance(layer, FusedMoE) and isinstance(method, Fp8MoEMethod)) or layer.is_draft or not active():
        return method
    if not method.is_fp4_expert:
        raise NotImplementedError(f"{prefix}: kt-kernel gets the checkpoint's MXFP4 experts; these are block FP8")
    from winport.hybrid.method import WinportKTMoEMethod
    from winport.hybrid.settings import from_sglang

    return WinportKTMoEMethod(method, from_sglang())


def _weight_loader(original: Any, self: Any, param: Any, loaded_weight: Any, weight_name: str, shard_id: str,
                   expert_id: Any = None, *args: Any, **kwargs: Any) -> Any:
    from winport.hybrid.method import WinportKTMoEMethod

    if args or kwargs or not isinstance(getattr(self, "quant_method", None), WinportKTMoEMethod):
        return original(self, param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs)
    return self.quant_method.load_weight(original, self, param, loaded_weight, weight_name, shard_id, expert_id)


def _no_upstream_kt_config(original: Any, *args: Any, **kwargs: Any) -> None:
    return None


def register_patch() -> None:
    """Check upstream and register the three hooks (they change nothing unless the KT path is on)."""
    require_source("sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.__init__",
                   "self.is_draft = get_flags().moe.in_speculative_scope",
                   "kt_config = create_kt_config_from_server_args(server_args, layer_id)",
                   "self.quant_method = quant_config.get_quant_method(self, prefix)",
                   "self.weight_load_method = None", "_fuses_routed_scaling_factor_in_topk(self.quant_method")
    require_source(WEIGHT_LOADER, "self._weight_loader_impl(", "expert_id = self._map_global_expert_id_to_local_expert_id(expert_id)")
    require_source(GET_QUANT_METHOD, "elif isinstance(layer, FusedMoE):")
    require_source("sglang.srt.layers.moe.fused_moe_triton.layer._weight_layout_method",
                   'getattr(layer, "weight_load_method", None) or layer.quant_method')
    require_source("sglang.srt.layers.moe.fused_moe_triton.layer._fuses_routed_scaling_factor_in_topk",
                   'getattr(quant_method, "fuse_routed_scaling_factor_in_topk", False)')
    # The scaling contract winport.hybrid.method.model_scales_routed_output mirrors.
    require_source("sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_normal",
                   "not _is_cuda\n            and not _is_musa\n            and not _is_xpu",
                   "or isinstance(self.experts.quant_method, KTEPWrapperMethod)",
                   "final_hidden_states *= self.routed_scaling_factor")
    require_source("sglang.srt.layers.moe.moe_runner.base.MoeRunnerConfig", "routed_scaling_factor", "num_local_experts")
    register(GET_QUANT_METHOD, _get_quant_method)
    register(WEIGHT_LOADER, _weight_loader)
    register(KT_CONFIG, _no_upstream_kt_config)
