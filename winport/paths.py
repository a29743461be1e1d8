"""Where winport keeps generated and cached files (demo model, converted tokenizers)."""

from __future__ import annotations

import sys
from pathlib import Path

from winport import envs


def cache_dir() -> Path:
    """WINPORT_CACHE, else %LOCALAPPDATA%\\winport on Windows, else $XDG_CACHE_HOME or ~/.cache /winport."""
    explicit = envs.WINPORT_CACHE.get()
    if explicit:
        return Path(explicit)
    if sys.platform == "win32":
        base = Path(envs.LOCALAPPDATA.get() or Path.home() / "AppData" / "Local")
    else:
        base = Path(envs.XDG_CACHE_HOME.get() or Path.home() / ".cache")
    return base / "winport"
