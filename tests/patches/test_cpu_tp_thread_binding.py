"""winport.patches.cpu_tp_thread_binding: each CPU tensor-parallel rank pinned to its CPUs."""

from __future__ import annotations

import pytest

from tests.helpers import run_python


def test_cpu_tp_rank_binding_parses_and_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import cpu_tp_thread_binding as tb

    assert tb.parse_cpus("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert tb.parse_cpus([4, 5]) == [4, 5]
    for bad in ("a-b", "3-1"):
        with pytest.raises(ValueError, match="SGLANG_CPU_OMP_THREADS_BIND"):
            tb.parse_cpus(bad)
    # Upstream binds itself on AMX/arm64 CPUs, and nothing is bound when no binding was asked for.
    from sglang.srt.distributed import bootstrap

    calls: list[object] = []
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0-0|1-1")
    monkeypatch.setattr(bootstrap, "_is_cpu_amx_available", True)
    tb._init(lambda **kw: calls.append(kw), local_omp_cpuid="0-0", dist_init_method="tcp://x")
    assert calls == [{"local_omp_cpuid": "0-0", "dist_init_method": "tcp://x"}]
    monkeypatch.setattr(bootstrap, "_is_cpu_amx_available", False)
    monkeypatch.setattr(bootstrap, "_is_cpu_arm64", False)
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND")
    tb._init(lambda **kw: calls.append(kw), local_omp_cpuid="0-0")
    assert len(calls) == 2
    # Pinning really happens (in a fresh interpreter: it changes the process's affinity).
    code = ("import os, psutil, torch\n"
            "from winport.patches.cpu_tp_thread_binding import _init\n"
            "_init(lambda **kw: 1/0, local_omp_cpuid='0-0')\n"
            "print(psutil.Process().cpu_affinity(), torch.get_num_threads())\n")
    proc = run_python(code, env={"SGLANG_CPU_OMP_THREADS_BIND": "0-0|1-1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[0] 1"
