"""Launch defaults of the kt-kernel CPU experts: threads, thread pools, GPU experts per layer.

SGLang's `--kt-*` flags keep their meaning (--kt-method, --kt-cpuinfer, --kt-threadpool-count,
--kt-num-gpu-experts, --kt-weight-path); winport fills in what they leave unset:
- CPU threads: never hyper-threads, and cores left for the threads that wait. kt-kernel's task
  queue busy-polls on a thread of its own, so a CPU-only server (kt-kernel's synchronous path)
  gets physical cores minus one: on the H200 machine's host (16 cores) 16 worker threads at batch
  1 took 7.9 ms a layer where 15 took 2.1 ms. A CUDA server also has the thread that launches the
  GPU work and spins in CUDA's synchronizations, so it gets physical cores minus two: one
  full-width layer (384 experts, 6 on the CPU at batch 1, scripts/bench/hybrid_layer.py on the
  stream path) took 7.97 ms on 15 threads, 2.26 ms on 14 and 2.34 ms on 13 (batch 4: 23.8, 15.6,
  16.2 ms). Oversubscription with hyper-threads is reported ~10x slower (shared/FACTS.md).
- Thread pools: one per NUMA node (kt-kernel binds a pool to a node; SGLang's default of 2 would
  split a one-node workstation in two).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from winport import envs

ENV_ENABLE = envs.WINPORT_KT_MOE.name  # "1": winport's kt-kernel MoE method serves the routed experts
# kt-kernel's C++ output buffer is sized by its chunked_prefill_size; with SGLang's chunked prefill
# off (-1/None) winport still needs a bound, and splits longer inputs into chunks of this size.
DEFAULT_KT_CHUNK = 8192


@dataclass(frozen=True)
class KTSettings:
    """What one kt-kernel MoE layer is built with."""

    method: str = "MXFP4"
    cpu_threads: int = 1
    threadpool_count: int = 1
    num_gpu_experts: int = 0
    weight_path: str | None = None  # kt-format safetensors folder; None: experts handed over from memory
    chunk: int = DEFAULT_KT_CHUNK
    max_deferred_experts_per_token: int = 0


def physical_cores() -> int:
    """Physical CPU cores of this machine (psutil; logical CPUs when psutil cannot tell)."""
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def numa_nodes() -> int:
    """NUMA nodes (Linux sysfs; 1 where the system does not say, e.g. Windows without hwloc)."""
    root = Path("/sys/devices/system/node")
    nodes = [p for p in root.glob("node[0-9]*")] if root.is_dir() else []
    return max(1, len(nodes))


def kt_off_reason(device: str, tp: int, gpu_experts: int | None) -> str | None:
    """Why kt-kernel does not serve the routed experts, or None when it does: always on a CPU-only
    server at tp 1, on CUDA when a GPU expert count is given (`--gpu-experts N`, SGLang's
    --kt-num-gpu-experts); WINPORT_KT_MOE=0 keeps them off. The reasons: "env", "no-count", "tp"."""
    if envs.WINPORT_KT_MOE.is_set() and not envs.WINPORT_KT_MOE.get():
        return "env"
    if device != "cpu" and gpu_experts is None:
        return "no-count"
    if tp > 1:
        return "tp"
    return None


def default_cpu_threads(cuda: bool = False) -> int:
    """Physical cores minus one (kt-kernel's polling task thread), minus one more with CUDA (the
    launching thread; module docstring), at least 1."""
    return max(1, physical_cores() - (2 if cuda else 1))


def enabled_by_env() -> bool:
    """Whether WINPORT_KT_MOE=1 asks for winport's kt-kernel MoE method."""
    return bool(envs.WINPORT_KT_MOE.get())


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def from_sglang() -> KTSettings:
    """KTSettings from SGLang's parsed --kt-* flags (inside an SGLang process), defaults filled in."""
    from sglang.srt.runtime_context import get_exec, get_schedule

    moe = get_exec().moe
    method = moe.kt_method
    if moe.kt_weight_path is None and method == "AMXINT4":
        # AMXINT4 is SGLang's default for the flag, not a choice: without a kt weight folder the
        # experts come from the checkpoint in memory, and those are MXFP4.
        method = "MXFP4"
    chunk = get_schedule().chunked_prefill_size
    return KTSettings(
        method=method,
        cpu_threads=moe.kt_cpuinfer or default_cpu_threads(_cuda()),
        threadpool_count=moe.kt_threadpool_count or numa_nodes(),
        num_gpu_experts=moe.kt_num_gpu_experts or 0,
        weight_path=moe.kt_weight_path,
        chunk=chunk if chunk and chunk > 0 else DEFAULT_KT_CHUNK,
        max_deferred_experts_per_token=moe.kt_max_deferred_experts_per_token or 0,
    )
