"""Helpers shared by the test suites (import as `from tests.helpers import ...`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = Path(sys.executable)

# Prepended to code for run_python: torch (and so SGLang's import-time checks) believe there is one
# H200 (SM90), so SGLang takes its CUDA import branches on a machine without a GPU.
FAKE_SM90_CUDA = """
import torch, types
torch.cuda.is_available = lambda: True
# SGLang's is_cuda() also wants a CUDA build of torch; the Wine tier's Windows torch is CPU-only.
if torch.version.cuda is None:
    torch.version.cuda = "13.0"
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
    total_memory=140 * 2**30, multi_processor_count=132, major=9, minor=0, name="NVIDIA H200",
    L2_cache_size=60 * 2**20)
"""

# The environment a fresh interpreter gets to run SGLang on winport's platform as `winport serve` would
# (Windows emulation, the platform on, and the two switches SGLang reads before the platform starts).
SGLANG_ON_WINPORT_ENV = {"WINPORT_EMULATE_WINDOWS": "1", "WINPORT_PLATFORM": "on", "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
                         "SGLANG_IS_FLASHINFER_AVAILABLE": "false"}


def run_python(code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter of this venv with extra environment variables."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=cwd or REPO_ROOT, timeout=timeout)


def run_python_ok(code: str, **kwargs: object) -> str:
    """run_python(code, **kwargs) that must exit 0 (else the test fails with the tail of its stderr); its stdout."""
    proc = run_python(code, **kwargs)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
