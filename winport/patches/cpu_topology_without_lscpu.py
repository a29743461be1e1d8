"""CPU topology for SGLang's CPU engine where `lscpu` does not exist (Windows).

Targets sglang 0.5.23 `srt/utils/common.py:parse_lscpu_topology`, which runs `lscpu -p=CPU,Core,
Socket,Node` to bind CPU worker threads per NUMA node and raises when the command is missing. Where
lscpu is absent the same (cpu, core, socket, node) rows are built from psutil: Windows numbers the
logical processors of one core consecutively, so logical CPU i belongs to core i // threads_per_core;
one socket and one NUMA node are reported (what Wine, and a single-socket workstation, have).
"""

from __future__ import annotations

import shutil
from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.utils.common.parse_lscpu_topology"


def topology_from_psutil() -> list[tuple[int, int, int, int]]:
    """(cpu, core, socket, node) for every logical CPU, one socket and one NUMA node."""
    import psutil

    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    per_core = max(1, logical // physical)
    return [(cpu, cpu // per_core, 0, 0) for cpu in range(logical)]


def _parse(original: Any, *args: Any, **kwargs: Any) -> Any:
    if shutil.which("lscpu") is not None:
        return original(*args, **kwargs)
    return topology_from_psutil()


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, '"lscpu"', "cpu_info.append((cpu, core, socket, node))")
    register(TARGET, _parse)
