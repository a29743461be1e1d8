"""winport's KT MoE method for SGLang 0.5.23's FusedMoE (DeepSeek-V4's routed experts).

It takes the place of SGLang's KTEPWrapperMethod (layers/moe/kt_ep_wrapper.py), which does not fit
kt-kernel 0.7.2 (it passes `num_gpu_experts`, never `swiglu_limit`, calls torch.cuda on CPU-only
torch, keeps GPU experts as the fixed prefix 0..N-1 with no slot remap, and wraps the DSpark
draft's MoE too). Like it, this method wraps the GPU-side method (Fp8MoEMethod here) and delegates
everything else to it; unlike it:
- the GPU-side weights hold `num_slots` experts, chosen by a SlotMap (default: experts 0..N-1),
  and the router's logical ids are remapped to slots in place (winport.hybrid.slots);
- the GPU side's runner gets routed_scaling_factor=None and the factor is applied once, to the
  CPU + GPU sum: by this method on CUDA, where DeepseekV2MoE leaves the routed output as the
  runner returns it; by DeepseekV2MoE itself on CPU torch, where it multiplies the experts' output
  for every method (deepseek_v2.py forward_normal: `not _is_cuda and not _is_musa and not _is_xpu`);
- the experts reach kt-kernel from SGLang's own weight loading (winport.hybrid.kt_experts);
- the slots can start from a route record (--expert-placement) and the routes can be recorded
  (--record-experts): winport.hybrid.route_record.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase

from winport.hybrid.kt_experts import KTExperts
from winport.hybrid.layer import HybridMoE
from winport.hybrid.route_record import initial_experts
from winport.hybrid.settings import KTSettings
from winport.hybrid.slots import SlotMap

_announced = False


def model_scales_routed_output() -> bool:
    """Whether DeepseekV2MoE multiplies the routed output by routed_scaling_factor itself for a
    method that is not SGLang's KTEPWrapperMethod (true off CUDA/MUSA/XPU)."""
    from sglang.srt.models import deepseek_v2

    return not (deepseek_v2._is_cuda or deepseek_v2._is_musa or deepseek_v2._is_xpu)


def _name(layer: Any) -> str:
    return getattr(layer, "prefix", None) or f"MoE layer {getattr(layer, 'layer_id', '?')}"


class WinportKTMoEMethod(FusedMoEMethodBase):
    """Routed experts in kt-kernel on the CPU, `num_slots` of them also resident on the GPU side."""

    # Read by FusedMoE (_fuses_routed_scaling_factor_in_topk): the router weights stay unscaled.
    fuse_routed_scaling_factor_in_topk = False

    def __init__(self, gpu_method: FusedMoEMethodBase, settings: KTSettings) -> None:
        self.gpu_method = gpu_method
        self.settings = settings
        self.num_slots = 0
        self.hybrid: HybridMoE | None = None
        self.slot_start = "experts 0..N-1"

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype, **extra: Any) -> None:
        """GPU-side weights for the slots only; kt-kernel's wrapper for all experts (loaded later)."""
        if layer.moe_tp_size != 1 or layer.moe_ep_size != 1:
            raise NotImplementedError(f"{_name(layer)}: winport's kt-kernel MoE runs one process's experts "
                                      f"(moe tp {layer.moe_tp_size}, ep {layer.moe_ep_size}); serve with --tp 1")
        if layer.num_fused_shared_experts:
            raise NotImplementedError(f"{_name(layer)}: a shared expert fused into the routed experts cannot be "
                                      "split between CPU and GPU")
        self.num_slots = min(max(self.settings.num_gpu_experts, 0), num_experts)
        self.gpu_method.create_weights(layer=layer, num_experts=self.num_slots, hidden_size=hidden_size,
                                       intermediate_size_per_partition=intermediate_size_per_partition,
                                       params_dtype=params_dtype, **extra)
        kt = KTExperts(layer.layer_id, num_experts, layer.top_k, hidden_size, intermediate_size_per_partition,
                       self.settings, layer.moe_runner_config.swiglu_limit)
        slots = SlotMap(kt.mask, self.num_slots, layer.w13_weight.device)
        start = initial_experts(layer.layer_id, self.num_slots, num_experts)  # --expert-placement FILE
        if start is not None:
            slots.place(start)  # before loading: load_weight puts these experts into the slots
            self.slot_start = f"the most-routed experts of the route record (layer {layer.layer_id}: {start})"
        self.hybrid = HybridMoE(kt, slots, None)
        # FusedMoE's loaders follow this method's weight layout (fused_moe_triton/layer.py
        # _weight_layout_method), not the wrapper's.
        layer.weight_load_method = self.gpu_method

    def load_weight(self, original: Any, layer: Any, param: Any, loaded_weight: torch.Tensor,
                    weight_name: str, shard_id: str, expert_id: int | None) -> None:
        """One expert's checkpoint tensor: staged for kt-kernel, and loaded into its GPU slot if resident."""
        if expert_id is None:
            raise NotImplementedError(f"{_name(layer)}.{weight_name}: tensors holding all experts at once are not "
                                      "split between kt-kernel and the GPU; a per-expert checkpoint is")
        if "bias" in weight_name or "input_scale" in weight_name:
            raise NotImplementedError(f"{_name(layer)}.{weight_name}: kt-kernel's MXFP4 experts have no {weight_name}")
        assert self.hybrid is not None
        if self.settings.weight_path is None:
            kind = "scale" if "scale" in weight_name else "weight"
            self.hybrid.kt.stage(int(expert_id), shard_id, kind, loaded_weight)
        slot = self.hybrid.slots.host_slot_of[int(expert_id)]
        if slot >= 0:
            original(layer, param, loaded_weight, weight_name, shard_id, slot)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Finish the GPU side's weights; check kt-kernel has every expert (or read its own files)."""
        global _announced
        assert self.hybrid is not None
        if self.num_slots and hasattr(self.gpu_method, "process_weights_after_loading"):
            self.gpu_method.process_weights_after_loading(layer)
        kt = self.hybrid.kt
        if self.settings.weight_path is not None:
            kt.load_from_files()
        elif not kt.loaded:
            kt.load_from_memory()  # raises, naming what the checkpoint did not provide
        hot = self._follow_routes(layer)
        self._record_routes(layer)
        if not _announced:
            _announced = True
            where = "synchronous path (no GPU)" if kt.on_cpu_torch else "overlapped with the GPU on its stream"
            source = f"kt files in {self.settings.weight_path}" if self.settings.weight_path else "handed over from memory"
            print(f"winport: routed experts run in kt-kernel {kt.backend} ({kt.variant} build, {self.settings.method}, "
                  f"{self.settings.cpu_threads} threads in {self.settings.threadpool_count} pool(s), {where}); "
                  f"{self.num_slots} of {kt.num_experts} experts a layer on the GPU side; weights {source}; "
                  f"GPU slots {hot}, starting with {self.slot_start}", flush=True)

    def _follow_routes(self, layer: torch.nn.Module) -> str:
        """Unless WINPORT_HOT_EXPERTS says otherwise (on with CUDA by default), let this layer's slots
        follow its routes (winport.hybrid.hot_swap), reading the experts that move from the model's
        files (winport.hybrid.expert_source); says what the slots do."""
        from winport.hybrid import hot_registry

        assert self.hybrid is not None
        cuda = self.hybrid.slots.slot_of.is_cuda
        if not hot_registry.enabled(cuda):
            return f"fixed ({hot_registry.envs.WINPORT_HOT_EXPERTS.name}=0)" if cuda else "fixed"
        if not 0 < self.num_slots < self.hybrid.kt.num_experts:
            return "fixed (no expert left to swap)"
        from sglang.srt.runtime_context import get_server_args

        from winport.hybrid.expert_source import NoExpertSource, expert_source
        from winport.hybrid.hot_swap import HotLayer, SlotWeights

        folder = get_server_args().model_path
        try:
            source = expert_source(folder, layer.layer_id, self.hybrid.kt.num_experts)
        except NoExpertSource as err:
            return f"fixed ({err})"
        weights = SlotWeights.of_layer(layer)
        # A swapped-in expert must hold the bytes loading gave the one it replaces: check slot 0.
        first = self.hybrid.slots.resident()[0]
        problem = weights.mismatch(0, source(first))
        if problem is not None:
            raise RuntimeError(f"{_name(layer)}: expert {first} in GPU slot 0 is not what a hot-expert swap would "
                               f"write ({problem}); SGLang's expert loading changed, review winport.hybrid.hot_swap "
                               f"or serve with {hot_registry.envs.WINPORT_HOT_EXPERTS.name}=0")
        reg = hot_registry.registry()
        device = self.hybrid.slots.slot_of.device
        streams = None
        if cuda:
            from winport.hybrid.swap_stream import cuda_swap_streams

            streams = cuda_swap_streams(device)
        self.hybrid.hot = HotLayer(self.hybrid.slots, weights, source, hot_registry.decay(),
                                   step_kind=reg.step_kind(device), streams=streams, name=_name(layer))
        reg.add(self.hybrid.hot)
        how = "swapped on a side stream" if cuda else "swapped in place"
        return f"follow the routes (refreshed every {reg.every} decode steps, {how})"

    def _record_routes(self, layer: torch.nn.Module) -> None:
        """With WINPORT_EXPERTS_RECORD=FILE, count this layer's routes into FILE (winport.hybrid.route_record)."""
        from winport.hybrid import hot_registry, route_record

        path = route_record.record_path()
        if path is None:
            return
        assert self.hybrid is not None
        reg = hot_registry.registry()
        if reg.recorder is None:
            reg.recorder = route_record.RouteRecorder(path, self.hybrid.kt.num_experts, int(layer.top_k))
            print(f"winport: routed experts' route counts are written to {path} whenever the server goes idle",
                  flush=True)
        tally = route_record.RouteTally(self.hybrid.kt.num_experts, reg.step_kind(self.hybrid.slots.slot_of.device))
        reg.recorder.add(int(layer.layer_id), tally)
        self.hybrid.tally = tally

    def create_moe_runner(self, layer: torch.nn.Module, moe_runner_config: Any) -> None:
        """The GPU side's runner, for the slots and without routed_scaling_factor (applied once, later)."""
        self.moe_runner_config = moe_runner_config
        gpu_cfg = dataclasses.replace(moe_runner_config, routed_scaling_factor=None, num_local_experts=self.num_slots)
        self.gpu_method.create_moe_runner(layer, gpu_cfg)

    def get_moe_runner_backend(self, layer: Any) -> Any:
        """The GPU side's runner backend."""
        return self.gpu_method.get_moe_runner_backend(layer)

    def get_moe_routing_method_type(self, layer: Any, requested_method: Any) -> Any:
        """The GPU side's routing method type."""
        return self.gpu_method.get_moe_routing_method_type(layer, requested_method)

    def apply(self, layer: torch.nn.Module, dispatch_output: Any) -> Any:
        """CPU experts submitted, GPU-side experts run on the slots, CPU synced, scaled once."""
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        if TopKOutputChecker.format_is_bypassed(dispatch_output.topk_output):
            dispatch_output = dispatch_output._replace(topk_output=dispatch_output.topk_output.to_standard())
        cfg = self.moe_runner_config
        if cfg.activation != "silu" or cfg.apply_router_weight_on_input or cfg.gemm1_alpha is not None:
            raise NotImplementedError(f"{_name(layer)}: kt-kernel's MXFP4 experts run SiLU-gated experts with the "
                                      f"router weight on the output only, not {cfg}")
        topk_weights, topk_ids, _ = dispatch_output.topk_output
        scale = 1.0 if model_scales_routed_output() or cfg.routed_scaling_factor is None else float(cfg.routed_scaling_factor)
        assert self.hybrid is not None

        def gpu_side(_x: torch.Tensor, _slot_ids: torch.Tensor, _w: torch.Tensor) -> torch.Tensor:
            # dispatch_output holds the same topk_ids tensor, already remapped to slots in place.
            return self.gpu_method.apply(layer, dispatch_output).hidden_states

        out = self.hybrid.forward(dispatch_output.hidden_states, topk_ids, topk_weights, scale, gpu_side)
        return StandardCombineInput(hidden_states=out)

    def __getattr__(self, name: str) -> Any:
        if name in ("gpu_method", "settings", "hybrid", "num_slots", "moe_runner_config", "slot_start"):
            raise AttributeError(name)
        return getattr(self.gpu_method, name)
