"""What the GPU really holds once SGLang is up, next to what the --vram-gib plan said.

SGLang 0.5.23's `/server_info` returns, per data-parallel rank, `internal_states[i].memory_usage`:
`weight` (GB of weights loaded, measured by the model runner as free memory before minus after
loading, so it counts in GiB), `kvcache` (GB of the KV pools), `token_capacity` (full tokens of
KV), and `graph` (GB per captured phase) (managers/scheduler_components/memory_usage.py).
"""

from __future__ import annotations

from typing import Any

from winport.placement.budget import GIB, Plan


def planned(plan: Plan, what: tuple[str, ...]) -> float:
    """Planned GiB of the plan lines named `what`."""
    return sum(b for name, b, _ in plan.lines if name in what) / GIB


def compare(plan: Plan, server_info: dict[str, Any]) -> list[str]:
    """Lines comparing SGLang's memory_usage with the plan (the plan's figures after 'planned')."""
    states = server_info.get("internal_states") or []
    usage = states[0].get("memory_usage") if states and isinstance(states[0], dict) else None
    if not isinstance(usage, dict):
        return ["SGLang's /server_info reports no memory_usage; the plan cannot be checked"]
    weights = planned(plan, ("dense weights", "load overhead", "draft", "vision tower", "GPU experts"))
    kv = planned(plan, ("KV cache",))
    graphs = planned(plan, ("CUDA graphs",))
    held_graph = sum(float(v) for v in (usage.get("graph") or {}).values())
    out = [
        f"GPU as loaded vs planned: weights {float(usage.get('weight', 0)):.2f} vs {weights:.2f} GiB; "
        f"KV cache {float(usage.get('kvcache', 0)):.2f} vs {kv:.2f} GiB "
        f"({int(usage.get('token_capacity', 0))} vs {plan.kv_tokens} tokens); "
        f"CUDA graphs {held_graph:.2f} vs {graphs:.2f} GiB",
    ]
    capacity = int(usage.get("token_capacity", 0))
    if capacity and capacity < plan.kv_tokens:
        out.append(f"the KV cache holds {capacity} tokens, fewer than the {plan.kv_tokens} planned: "
                   "the card had less free memory than the plan assumed (another program on it?)")
    return out


def cuda_held_bytes(pids: list[int]) -> int | None:
    """GPU memory the processes `pids` hold, from nvidia-smi's compute-app list (the driver's
    count: CUDA context, allocator pools and all); None when nvidia-smi cannot say."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted = set(pids)
    held = 0
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in wanted and parts[1].isdigit():
            held += int(parts[1]) * 2**20  # MiB
    return held
