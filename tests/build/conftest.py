"""Fixtures for the kt-kernel-for-Windows build tier: compiled checks (native and Windows) and Wine.

Tools come from scripts/ci/apt-test-tools.sh. Tests skip with a reason naming the missing tool only
when it is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from winport.modfile import import_file

REPO = Path(__file__).resolve().parents[2]
KTK = REPO / "build" / "ktkernel"


def load_build_checks() -> ModuleType:
    """build/ktkernel/checks/build_checks.py, imported by path (build/ is not a package)."""
    return import_file("ktwin_build_checks", KTK / "checks" / "build_checks.py", register=False)


def parse_kv(text: str) -> dict[str, str]:
    """`key=value` lines printed by ktwin_checks -> dict (Windows line ends stripped)."""
    out = {}
    for line in text.replace("\r", "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def wine_binary() -> str | None:
    """wine64 from Debian's wine64 package (/usr/lib/wine/wine64) or PATH."""
    for cand in ("wine64", "/usr/lib/wine/wine64", "wine"):
        found = shutil.which(cand) or (cand if Path(cand).is_file() else None)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def build_checks() -> ModuleType:
    """The check-builder module."""
    return load_build_checks()


@pytest.fixture(scope="session")
def native_checks(build_checks: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Native ktwin_checks (clang++/g++ + real glibc and libnuma)."""
    if (build_checks.clangxx() or build_checks.find_tool("g++")) is None:
        pytest.skip("no C++ compiler: run scripts/ci/apt-test-tools.sh")
    if not Path("/usr/include/numa.h").exists():
        pytest.skip("libnuma-dev missing: run scripts/ci/apt-test-tools.sh")
    return build_checks.build_native(tmp_path_factory.mktemp("native"))


@pytest.fixture(scope="session")
def windows_checks(build_checks: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ktwin_checks.exe for x86_64-w64-windows-gnu (clang-19 + mingw-w64 posix libstdc++)."""
    if build_checks.clangxx() is None or not build_checks.MINGW_GCC.exists():
        pytest.skip("clang++-19 / g++-mingw-w64-x86-64-posix missing: run scripts/ci/apt-test-tools.sh")
    return build_checks.build_windows(tmp_path_factory.mktemp("windows"))


@pytest.fixture(scope="session")
def wine_env() -> dict[str, str]:
    """Environment for wine64 with a cached prefix (.cache/wine, gitignored); boots it once."""
    wine = wine_binary()
    if wine is None:
        pytest.skip("wine64 missing: run scripts/ci/apt-test-tools.sh")
    env = dict(os.environ)
    env["WINEPREFIX"] = str(REPO / ".cache" / "wine")
    env["WINEDEBUG"] = "-all"
    env["WINE_BIN"] = wine
    if not (Path(env["WINEPREFIX"]) / "system.reg").exists():
        Path(env["WINEPREFIX"]).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([wine, "wineboot", "-u"], env=env, capture_output=True, timeout=300)
    return env


@pytest.fixture(scope="session")
def run_native(native_checks: Path) -> Callable[..., dict[str, str]]:
    """Run a native check subcommand; return its key=value output."""

    def run(*args: str) -> dict[str, str]:
        proc = subprocess.run([str(native_checks), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return parse_kv(proc.stdout)

    return run


@pytest.fixture(scope="session")
def run_wine(windows_checks: Path, wine_env: dict[str, str]) -> Callable[..., dict[str, str]]:
    """Run a Windows check subcommand under wine64; return its key=value output."""

    def run(*args: str) -> dict[str, str]:
        # stdout must be a pipe under Wine (shared/WINDOWS_PROXY.md); capture_output gives one.
        proc = subprocess.run([wine_env["WINE_BIN"], str(windows_checks), *args], capture_output=True,
                              text=True, timeout=120, env=wine_env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return parse_kv(proc.stdout)

    return run
