"""How SGLang is launched on winport's platform: its environment switches and the server-argument
defaults winport chooses, in one place, used by every way of starting the server.

`winport serve` passes the switches to its child and SGLang's platform seam applies the defaults
(`SRTPlatform.apply_server_args_defaults`, SGLang 0.5.23's `arg_groups/platform_hook.py`), so a plain
`python -m sglang.launch_server` in the venv, with winport's platform active (Windows, or
WINPORT_PLATFORM=on), gets the same defaults as `winport serve`. A default is applied only to a field
still at SGLang's own default: a flag the user gave wins (a flag given with SGLang's default value is
indistinguishable from no flag, and gets winport's default).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from winport import envs

log = logging.getLogger("winport")


def gpu_mxfp4_moe() -> bool:
    """Whether the user opted into winport's MXFP4 MoE kernel on CUDA (WINPORT_GPU_MXFP4_MOE=1)."""
    return bool(envs.WINPORT_GPU_MXFP4_MOE.get())


def sglang_switches(device: str) -> dict[str, str]:
    """SGLang's own environment switches that keep it off CUDA JIT kernels (no patch needed)."""
    env: dict[str, str] = {}
    # A CUDA JIT kernel no winport shim replaces fails at once, by name, instead of trying nvcc
    # (absent on Windows, useless on CPU).
    envs.set_for_child(env, envs.SGLANG_CRASH_ON_JIT_COMPILE, "1")
    # Hash-routed MoE layers: SGLang's torch routing instead of the fused JIT kernel.
    envs.set_for_child(env, envs.SGLANG_OPT_USE_FUSED_HASH_TOPK, "0")
    # DeepGEMM's JIT is Linux-only; winport's deep_gemm shim serves the names SGLang calls.
    envs.set_for_child(env, envs.SGLANG_ENABLE_JIT_DEEPGEMM, "0")
    # With flashinfer "available" SGLang imports ~40 flashinfer submodules on CUDA (trtllm MoE,
    # fp4 quantization, comm fusion) that have no Windows build and no winport shim; told it is
    # absent, SGLang takes its torch/Triton/sgl_kernel routes, which winport's shims serve.
    envs.set_for_child(env, envs.SGLANG_IS_FLASHINFER_AVAILABLE, "false")
    # SGLang asserts the sglang-kernel *distribution* version; winport's sgl_kernel is a shim
    # module with no distribution metadata.
    envs.set_for_child(env, envs.SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK, "1")
    if device != "cpu" and gpu_mxfp4_moe():
        # Opt-in: the experts stay packed MXFP4 and run in winport's Triton W4A16 kernel
        # (winport.patches.cuda_mxfp4_moe); SGLANG_DSV4_FP4_DEQUANT must stay unset for that.
        envs.set_for_child(env, envs.WINPORT_GPU_MXFP4_MOE, "1")
    elif device != "cpu":
        # MXFP4 routed experts: SGLang's CUDA choice is flashinfer's MXFP4 MoE, which has no Windows
        # build. Dequantized to FP8 blocks at load they run in SGLang's Triton fused MoE (its
        # activation quantization through winport.patches.cuda_jit_quant). WINPORT_GPU_MXFP4_MOE=1
        # keeps them 4-bit instead (winport's own kernel, not yet the default).
        envs.set_for_child(env, envs.SGLANG_DSV4_FP4_DEQUANT, "1")
    if device == "cpu":
        envs.set_for_child(env, envs.SGLANG_USE_CPU_ENGINE, "1")
        # SGLang's own torch implementation of the indexer's paged MQA logits.
        envs.set_for_child(env, envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH, "1")
        # The DSV4 metadata kernels are Triton; on CPU they run in Triton's interpreter.
        envs.set_for_child(env, envs.TRITON_INTERPRET, "1")
        # DeepSeek-V4's FP8 wo_a: dequantized to bf16 at load (SGLang's own path for block sizes
        # its fp8 einsum does not take) instead of the W8A8 DeepGEMM-style einsum; the CPU runs
        # every FP8 linear as W8A16 (winport.patches.cpu_fp8_block_linear).
        envs.set_for_child(env, envs.SGLANG_OPT_FP8_WO_A_GEMM, "0")
    return env


def engram_map_of(model_path: str | os.PathLike[str]) -> Path | None:
    """engram_gguf.json of a converted V4.1 GGUF whose engram tables stay in the GGUF, else None."""
    from winport.gguf.engram_rows import SIDECAR

    sidecar = Path(model_path) / SIDECAR
    return sidecar if sidecar.is_file() else None


@dataclasses.dataclass(frozen=True)
class Default:
    """One server-argument default: the field, its value, when it applies and why."""

    field: str
    value: Any
    applies: Callable[[str, Any], bool]  # (device, server args) -> whether this default is wanted
    why: str


def _tp(cfg: Any) -> int:
    return int(getattr(cfg, "tp_size", 1) or 1)


def _cuda_graphs_off(device: str, cfg: Any) -> bool:
    if device == "cpu":
        return False
    return not envs.WINPORT_CUDA_GRAPH.get() or engram_map_of(cfg.model_path) is not None


DEFAULTS: tuple[Default, ...] = (
    Default("max_total_tokens", 16384, lambda d, _c: d == "cpu",
            "a CPU's KV pool is host RAM: 16K tokens, not SGLang's share of all free memory"),
    Default("swa_full_tokens_ratio", 0.5, lambda d, _c: d == "cpu",
            "the sliding-window pool at half the full pool, which 16K tokens leave ample"),
    Default("skip_server_warmup", True, lambda d, _c: d == "cpu",
            "SGLang's warm-up request is a slow CPU forward; the server is ready without it"),
    Default("disable_cuda_graph", True, _cuda_graphs_off,
            "WINPORT_CUDA_GRAPH=0, or engram rows read from the GGUF's memory map on the host (a lookup "
            "a CUDA graph cannot capture): decode runs eagerly, correct and slower"),
    Default("moe_runner_backend", "triton", lambda d, _c: d != "cpu" and gpu_mxfp4_moe(),
            "WINPORT_GPU_MXFP4_MOE=1: without it SGLang's DeepSeek-V4 override picks flashinfer_mxfp4 "
            "for packed experts; the Triton backend leaves them to the patched Fp8MoEMethod"),
    Default("disable_custom_all_reduce", True, lambda _d, c: _tp(c) > 1,
            "collectives are gloo's: SGLang's custom all-reduce needs CUDA IPC buffers and NCCL"),
)


def _sglang_default(cls: type, name: str) -> Any:
    """SGLang's declared default of one ServerArgs field (a msgspec Struct in 0.5.23, a dataclass before)."""
    import msgspec
    from sglang.srt.arg_groups.arg_utils import record_fields

    unset = (dataclasses.MISSING, msgspec.NODEFAULT)
    for f in record_fields(cls):
        if f.name != name:
            continue
        for attr, call in (("default", False), ("default_factory", True)):
            value = getattr(f, attr, dataclasses.MISSING)
            if not any(value is u for u in unset):
                return value() if call else value
    raise AttributeError(f"SGLang's ServerArgs has no default for {name!r}: review winport.platform.launch_policy")


def wanted_defaults(device: str, cfg: Any) -> list[Default]:
    """The defaults that apply to these server arguments and whose field is still at SGLang's default."""
    from sglang.srt.server_args import ServerArgs

    out = []
    for d in DEFAULTS:
        if not d.applies(device, cfg):
            continue
        if d.field == "swa_full_tokens_ratio" and getattr(cfg, "_swa_full_tokens_ratio_explicitly_set", False):
            continue
        if getattr(cfg, d.field) == _sglang_default(ServerArgs, d.field):
            out.append(d)
    return out


def _graphs_off(cfg: Any) -> None:
    """SGLang 0.5.23 turns the legacy disable_cuda_graph into its per-phase cuda_graph_config
    (arg_groups/cuda_graph_hook.py) before the platform's defaults run, so the parsed config is
    turned off too."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    config = getattr(cfg, "cuda_graph_config", None)
    if config is None or isinstance(config, dict):
        return  # not parsed yet: the legacy flag set above is what the parser reads
    for phase in (Phase.DECODE, Phase.PREFILL):
        config = with_phase(config, phase, backend=Backend.DISABLED)
    cfg.cuda_graph_config = config


def _kt_defaults(cfg: Any, device: str) -> list[str]:
    """kt-kernel's routed experts where `winport serve` would run them (winport.hybrid.settings.kt_off_reason:
    a CPU-only server, or CUDA with --kt-num-gpu-experts N), with one pool per NUMA node."""
    from sglang.srt.server_args import ServerArgs

    from winport.hybrid.settings import ENV_ENABLE, kt_off_reason, numa_nodes

    if kt_off_reason(device, _tp(cfg), cfg.kt_num_gpu_experts) is not None:
        return []
    # Read in the scheduler processes started next (winport.patches.kt_hybrid_moe).
    envs.set_default(envs.WINPORT_KT_MOE, "1")
    if device == "cpu":
        # kt-kernel's only path that computes on CPU tensors (winport.hybrid.kt_experts).
        envs.set_default(envs.KT_FORCE_SYNC_SUBMIT, "1")
    lines = [f"{ENV_ENABLE}=1: the routed experts run in kt-kernel"]
    if cfg.kt_threadpool_count == _sglang_default(ServerArgs, "kt_threadpool_count"):
        # SGLang's default is 2 pools; winport's is one per NUMA node, as `winport serve` passes.
        cfg.kt_threadpool_count = numa_nodes()
        lines.append(f"kt_threadpool_count={cfg.kt_threadpool_count}: one kt-kernel pool per NUMA node")
    return lines


def apply_server_defaults(cfg: Any, device: str) -> list[str]:
    """Assign winport's defaults to `cfg` (SGLang's server arguments, or the recorder its platform
    hook hands over); return one line per field set, also logged."""
    lines = []
    for d in wanted_defaults(device, cfg):
        setattr(cfg, d.field, d.value)
        if d.field == "disable_cuda_graph":
            _graphs_off(cfg)
        lines.append(f"{d.field}={d.value!r}: {d.why}")
    lines += _kt_defaults(cfg, device)
    engram = engram_map_of(cfg.model_path)
    if engram is not None:
        # Read by winport.patches.engram_rows_from_gguf in the scheduler processes started next.
        envs.set_default(envs.WINPORT_ENGRAM_GGUF, str(engram))
    for line in lines:
        log.info("winport platform default: %s", line)
    return lines


def export_switches(device: str) -> None:
    """Put SGLang's switches for `device` into this process's environment where they are unset (a plain
    `python -m sglang.launch_server` on winport's platform; `winport serve` already passed them)."""
    for name, value in sglang_switches(device).items():
        envs.set_default(envs.VARIABLES[name], value)
