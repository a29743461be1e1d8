"""Helpers shared by the test suites (import as `from tests.helpers import ...`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = Path(sys.executable)


def run_python(code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter of this venv with extra environment variables."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=cwd or REPO_ROOT, timeout=timeout)
