"""What `winport serve` passes SGLang for the routed experts, and the one line saying which path runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from winport import envs
from winport.hybrid.settings import ENV_ENABLE, default_cpu_threads, kt_off_reason, numa_nodes


@dataclass
class ExpertPlan:
    """SGLang flags and environment for the routed experts, and why this path."""

    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    line: str = ""


def _kt_error() -> str | None:
    try:
        from winport.hybrid.kt_experts import import_kt

        import_kt()
    except ImportError as exc:
        return str(exc)
    return None


def expert_plan(device: str, tp: int, gpu_experts: int | None, cpu_threads: int | None) -> ExpertPlan:
    """kt-kernel for the routed experts: always on a CPU-only server (tp 1), on CUDA when
    --gpu-experts N keeps only N per layer on the GPU. WINPORT_KT_MOE=0 keeps them off kt-kernel."""
    if gpu_experts is not None and gpu_experts < 0:
        raise ValueError(f"--gpu-experts {gpu_experts}: a count of experts per layer, 0 or more")
    if device == "cpu" and gpu_experts:
        raise ValueError(f"--gpu-experts {gpu_experts}: the server runs on the CPU (no CUDA GPU)")
    fallback = ("the torch W4A16 reference (winport.patches.cpu_mxfp4_moe)" if device == "cpu"
                else "the GPU (all experts resident)")
    off = kt_off_reason(device, tp, gpu_experts)
    if off == "env":
        return ExpertPlan(line=f"routed experts run in {fallback}: {ENV_ENABLE}=0")
    if off == "no-count":
        return ExpertPlan(line=f"routed experts run in {fallback}; --gpu-experts N keeps N a layer there and "
                               "runs the rest in kt-kernel on the CPU")
    if off == "tp":
        return ExpertPlan(line=f"routed experts run in {fallback}: kt-kernel serves one process's experts, "
                               f"not --tp {tp}")
    error = _kt_error()
    if error is not None:
        return ExpertPlan(line=f"routed experts run in {fallback}: kt-kernel cannot load ({error})")
    threads = cpu_threads or default_cpu_threads(cuda=device != "cpu")
    pools = numa_nodes()
    env = {ENV_ENABLE: "1"}
    how = f"{threads} thread(s) in {pools} pool(s)"
    if device == "cpu":
        # kt-kernel's only path that computes on CPU tensors (winport.hybrid.kt_experts).
        envs.set_for_child(env, envs.KT_FORCE_SYNC_SUBMIT, "1")
        line = f"routed experts run in kt-kernel on the CPU (MXFP4, synchronous path: no GPU), {how}"
    else:
        line = (f"routed experts: {gpu_experts} a layer on the GPU, the rest in kt-kernel on the CPU (MXFP4, "
                f"overlapped on the GPU's stream), {how}")
    argv = ["--kt-method", "MXFP4", "--kt-cpuinfer", str(threads), "--kt-threadpool-count", str(pools),
            "--kt-num-gpu-experts", str(gpu_experts or 0)]
    return ExpertPlan(argv=argv, env=env, line=line)
