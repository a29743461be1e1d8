"""Where winport keeps generated and cached files (demo model, converted tokenizers)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """WINPORT_CACHE, else %LOCALAPPDATA%\\winport on Windows, else $XDG_CACHE_HOME or ~/.cache /winport."""
    explicit = os.environ.get("WINPORT_CACHE")
    if explicit:
        return Path(explicit)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "winport"
