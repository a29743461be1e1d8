"""Entry points SGLang discovers: `sglang.srt.platforms` -> activate_platform,
`sglang.srt.plugins` -> register_hooks.

The platform is offered only where it is needed (Windows, or Linux under
WINPORT_EMULATE_WINDOWS=1, or when WINPORT_PLATFORM=on), so installing winport next to a stock
Linux SGLang changes nothing unless asked. Imports stay lazy: SGLang loads entry points early.
"""

from __future__ import annotations

import os
import sys

from winport import winemu

CPU_PLATFORM = "winport.platform.platforms.WinportCpuPlatform"
CUDA_PLATFORM = "winport.platform.platforms.WinportCudaPlatform"


def wanted() -> bool:
    """Whether the winport platform should take over in this process."""
    mode = os.environ.get("WINPORT_PLATFORM", "auto").strip().lower()
    if mode in {"on", "1", "true"}:
        return True
    if mode in {"off", "0", "false"}:
        return False
    return sys.platform == "win32" or winemu.enabled()


def activate_platform() -> str | None:
    """Return the platform class path for SGLang, or None to leave SGLang's own choice."""
    if not wanted():
        return None
    import torch

    if torch.cuda.is_available() and os.environ.get("SGLANG_USE_CPU_ENGINE", "0") != "1":
        return CUDA_PLATFORM
    return CPU_PLATFORM


def register_hooks() -> None:
    """Register winport's patches with SGLang's HookRegistry (only when the platform is wanted)."""
    if not wanted():
        return
    from winport.patches import register_all

    register_all()
