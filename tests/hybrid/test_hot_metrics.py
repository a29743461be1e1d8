"""The hot experts' counters reach /metrics the way SGLang serves it: prometheus_client's
multiprocess mode, a scheduler process writing and the HTTP server's collector reading the folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import REPO_ROOT
from winport import envs

WRITER = textwrap.dedent("""
    from winport.hybrid import hot_metrics
    m = hot_metrics.for_server()
    assert m is not None
    m.publish({"prefill": (3, 10), "decode": (5, 8)}, swaps=2, bytes_per_swap=1000)
    m.publish({"prefill": (3, 10), "decode": (9, 16)}, swaps=3, bytes_per_swap=1000)  # totals, not increments
""")


def test_counters_are_collected_from_the_scheduler_process(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WRITER], env=env, cwd=REPO_ROOT, check=True, timeout=120)
    from prometheus_client import CollectorRegistry, multiprocess

    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(tmp_path))
    assert reg.get_sample_value("winport:expert_routes_total", {"step": "decode"}) == 16
    assert reg.get_sample_value("winport:expert_routes_gpu_total", {"step": "decode"}) == 9
    assert reg.get_sample_value("winport:expert_routes_total", {"step": "prefill"}) == 10
    assert reg.get_sample_value("winport:expert_swaps_total") == 3
    assert reg.get_sample_value("winport:expert_swap_bytes_total") == 3000


def test_no_counters_without_metrics() -> None:
    from winport.hybrid import hot_metrics

    saved = os.environ.pop(envs.PROMETHEUS_MULTIPROC_DIR.name, None)
    try:
        assert hot_metrics.for_server() is None
    finally:
        if saved is not None:
            os.environ[envs.PROMETHEUS_MULTIPROC_DIR.name] = saved
