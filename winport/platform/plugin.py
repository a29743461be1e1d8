"""Entry points SGLang discovers: `sglang.srt.platforms` -> activate_platform,
`sglang.srt.plugins` -> register_hooks.

The platform is offered only where it is needed (Windows, or Linux under
WINPORT_EMULATE_WINDOWS=1, or when WINPORT_PLATFORM=on), so installing winport next to a stock
Linux SGLang changes nothing unless asked. Imports stay lazy: SGLang loads entry points early.
"""

from __future__ import annotations

import sys

from winport import envs, winemu

CPU_PLATFORM = "winport.platform.platforms.WinportCpuPlatform"
CUDA_PLATFORM = "winport.platform.platforms.WinportCudaPlatform"


def wanted() -> bool:
    """Whether the winport platform should take over in this process."""
    mode = envs.WINPORT_PLATFORM.get()
    if mode != "auto":
        return mode == "on"
    return sys.platform == "win32" or winemu.enabled()


def activate_platform() -> str | None:
    """Return the platform class path for SGLang, or None to leave SGLang's own choice."""
    if not wanted():
        return None
    import torch

    from winport.platform.launch_policy import export_switches

    cuda = torch.cuda.is_available() and not envs.SGLANG_USE_CPU_ENGINE.get()
    # The same switches `winport serve` gives its child, for a plain `python -m sglang.launch_server`
    # (SGLang reads them when it uses them, after this; the processes it starts inherit them).
    export_switches("cuda" if cuda else "cpu")
    return CUDA_PLATFORM if cuda else CPU_PLATFORM


def register_hooks() -> None:
    """Register winport's patches with SGLang's HookRegistry (only when the platform is wanted)."""
    if not wanted():
        return
    from winport.patches import register_all

    register_all()
