"""What the GPU really holds once SGLang is up, next to what the --vram-gib plan said.

SGLang 0.5.23's `/server_info` returns, per data-parallel rank, `internal_states[i].memory_usage`:
`weight` (GB of weights loaded, measured by the model runner as free memory before minus after
loading, so it counts in GiB), `kvcache` (GB of the KV pools), `token_capacity` (full tokens of
KV), and `graph` (GB per captured phase) (managers/scheduler_components/memory_usage.py).
Its `kvcache` figure read 0.00 for DeepSeek-V4's pools on the H200 (2026-12-03), so the KV side is
compared in tokens: SGLang's pool is what the static fraction leaves after the weights it measured,
i.e. the plan's tokens plus whatever the weights left of the plan's loading reserve.
"""

from __future__ import annotations

from typing import Any

from winport.placement.budget import GIB, Plan

# Plan lines that are tensors SGLang loads (its "weight" figure), without the reserve for loading.
TENSORS = ("dense weights", "draft", "vision tower", "GPU experts")


def planned(plan: Plan, what: tuple[str, ...]) -> float:
    """Planned GiB of the plan lines named `what`."""
    return sum(b for name, b, _ in plan.lines if name in what) / GIB


def expected_tokens(plan: Plan, weights_held: float) -> int:
    """KV tokens SGLang should size its pool to once loading held `weights_held` GiB: the plan's tokens
    plus what the weights left of the plan's loading reserve (SGLang gives the static fraction's rest
    to the KV pool), priced at the plan's bytes a full token."""
    if plan.kv is None or not plan.kv.full:
        return plan.kv_tokens
    left = (planned(plan, TENSORS + ("load overhead",)) - weights_held) * GIB
    return plan.kv_tokens + int(left / plan.kv.full)


def compare(plan: Plan, server_info: dict[str, Any]) -> list[str]:
    """Lines comparing SGLang's memory_usage with the plan (SGLang's figures first, the plan's after 'vs')."""
    states = server_info.get("internal_states") or []
    usage = states[0].get("memory_usage") if states and isinstance(states[0], dict) else None
    if not isinstance(usage, dict):
        return ["SGLang's /server_info reports no memory_usage; the plan cannot be checked"]
    tensors, reserve = planned(plan, TENSORS), planned(plan, ("load overhead",))
    graphs = planned(plan, ("CUDA graphs",))
    held_weights = float(usage.get("weight", 0))
    held_graph = sum(float(v) for v in (usage.get("graph") or {}).values())
    capacity = int(usage.get("token_capacity", 0))
    expect = expected_tokens(plan, held_weights)
    out = [
        f"GPU as loaded vs planned: weights {held_weights:.2f} vs {tensors:.2f} GiB of tensors + {reserve:.2f} GiB "
        f"reserved for loading; KV cache {capacity} vs {expect} tokens (the plan's {plan.kv_tokens} + what "
        f"loading left of its reserve); CUDA graphs {held_graph:.2f} vs {graphs:.2f} GiB",
    ]
    if held_weights > tensors + reserve:
        out.append(f"loading held {held_weights - tensors:.2f} GiB beyond the tensors, more than the {reserve:.2f} GiB "
                   "the plan reserves: the KV cache got the difference less")
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
