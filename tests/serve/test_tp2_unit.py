"""CPU tensor parallelism without NCCL: what SGLang resolves as its collective backend."""

from __future__ import annotations

from tests.helpers import run_python


def test_sglang_resolves_gloo_on_winport_cpu_platform() -> None:
    # The value SGLang's bootstrap passes to torch.distributed.init_process_group for CPU ranks,
    # with winport's platform active as `winport serve` activates it.
    code = ("from sglang.srt.distributed import bootstrap\n"
            "from sglang.srt import platforms\n"
            "print(type(platforms.current_platform).__name__, bootstrap._resolve_backend(device='cpu'))\n")
    proc = run_python(code, env={"WINPORT_PLATFORM": "on", "SGLANG_USE_CPU_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "WinportCpuPlatform gloo"
    # Control: without winport's platform, SGLang picks its own CPU platform.
    proc = run_python(code, env={"WINPORT_PLATFORM": "off", "SGLANG_USE_CPU_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not proc.stdout.strip().splitlines()[-1].startswith("Winport")
