"""Run at every interpreter start of the venv, from the `winport_shims.pth` file.

Installs Windows emulation (only when WINPORT_EMULATE_WINDOWS=1) and then the shim finder, so
that SGLang's spawned children resolve `sgl_kernel` & co. exactly as the parent does. Any error
here is printed, never raised: a broken .pth must not make the venv's Python unusable.
"""

from __future__ import annotations

import sys


def activate() -> None:
    """Install emulation and the shim finder in this interpreter."""
    try:
        from winport import ktkernel, shimloader, winemu
        from winport.ktkernel import denormals
        from winport.platform import windows_compat

        windows_compat.apply_if_windows()
        winemu.install()
        shimloader.install()
        # kt-kernel picks its CPU variant from /proc/cpuinfo and globs *.so: on Windows (and under
        # emulation) winport's import hook chooses it with cpuid and finds .pyd files instead.
        ktkernel.install()
        # kt-kernel turns on flush-to-zero where it loads (SGLang imports it in every scheduler).
        denormals.install()
    except Exception as exc:  # noqa: BLE001 - see module docstring
        print(f"winport: shim bootstrap failed: {exc!r}", file=sys.stderr)
