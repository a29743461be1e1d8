"""Build the project's C++ checks of the kt-kernel compat layer, natively and for Windows.

`python build/ktkernel/checks/build_checks.py OUTDIR` builds `OUTDIR/ktwin_checks` (native, clang++
or g++, against the real glibc + libnuma) and `OUTDIR/ktwin_checks.exe` (clang for
x86_64-w64-windows-gnu with the mingw-w64 headers and posix-threads libstdc++, statically linked so
Wine needs no extra DLLs). The tests in tests/build import this file by path; build/ is not a
Python package.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).resolve().parent
COMPAT = CHECKS.parent / "compat"
MINGW_GCC = Path("/usr/lib/gcc/x86_64-w64-mingw32/12-posix")


def find_tool(*names: str) -> str | None:
    """Return the first of `names` found on PATH (or as an absolute path), else None."""
    for name in names:
        if Path(name).is_absolute() and Path(name).exists():
            return name
        found = shutil.which(name)
        if found:
            return found
    return None


def clangxx() -> str | None:
    """clang++ (any version that has the x86_64-w64-windows-gnu target; Debian ships clang++-19)."""
    return find_tool("clang++-19", "clang++")


def native_commands(out: Path, cxx: str) -> list[list[str]]:
    """Command lines for the native build. posix_surface.cpp is compiled without the compat
    header, against the real Linux headers, so its output is what Linux itself says. The compat
    library (ktwin.cpp) is compiled on its own, never with the force-included header, as the
    Windows build does it."""
    common = [cxx, "-std=c++20", "-O2", "-Wall", "-I", str(COMPAT)]
    posix_obj = str(out / "posix_surface.native.o")
    compat_obj = str(out / "ktwin.native.o")
    return [
        [*common, "-c", str(CHECKS / "posix_surface.cpp"), "-o", posix_obj],
        [*common, "-c", str(COMPAT / "src" / "ktwin.cpp"), "-o", compat_obj],
        [
            *common,
            "-DKTWIN_COMPAT_FORCE=1",
            "-include",
            str(COMPAT / "ktwin_compat.h"),
            str(CHECKS / "ktwin_checks.cpp"),
            compat_obj,
            posix_obj,
            "-o",
            str(out / "ktwin_checks"),
            "-lnuma",
            "-lpthread",
        ],
    ]


def mingw_commands(out: Path, cxx: str) -> list[list[str]]:
    """Command lines for the Windows build: the compat library's sources are compiled on their
    own (no force-include, as make.py builds ktwin_compat.lib); every other TU gets the
    force-included compat header and the stand-in headers, exactly as kt-kernel's TUs do."""
    common = [
        cxx,
        "--target=x86_64-w64-windows-gnu",
        "-std=c++20",
        "-O2",
        "-Wall",
        "-D_WIN32_WINNT=0x0A00",
        # mingw-w64 v10's intrin.h and clang's both define __cpuidex: keep clang's.
        "-D__INTRINSIC_DEFINED___cpuidex",
        "-nostdinc++",
        "-isystem", str(MINGW_GCC / "include" / "c++"),
        "-isystem", str(MINGW_GCC / "include" / "c++" / "x86_64-w64-mingw32"),
        "-isystem", str(MINGW_GCC / "include" / "c++" / "backward"),
        "-I", str(COMPAT / "include"),
        "-I", str(COMPAT),
    ]
    objs = []
    cmds = []
    for src in ("ktwin.cpp", "posix_shims.cpp"):
        obj = str(out / (src.replace(".cpp", ".win.o")))
        cmds.append([*common, "-c", str(COMPAT / "src" / src), "-o", obj])
        objs.append(obj)
    cmds.append([
        *common,
        "-include", str(COMPAT / "ktwin_compat.h"),
        str(CHECKS / "ktwin_checks.cpp"),
        str(CHECKS / "posix_surface.cpp"),
        *objs,
        "-fuse-ld=lld",
        "-L", str(MINGW_GCC),
        "-static",
        "-o", str(out / "ktwin_checks.exe"),
        "-lpthread",
    ])
    return cmds


def run(cmd: list[str]) -> None:
    """Run one compiler command; raise with its output when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")


def build_native(out: Path) -> Path:
    """Build the native checks into `out`; return the executable's path."""
    cxx = clangxx() or find_tool("g++")
    if cxx is None:
        raise FileNotFoundError("no C++ compiler (clang++-19, clang++ or g++)")
    out.mkdir(parents=True, exist_ok=True)
    for cmd in native_commands(out, cxx):
        run(cmd)
    return out / "ktwin_checks"


def build_windows(out: Path) -> Path:
    """Cross-build the checks for x86_64-w64-windows-gnu into `out`; return the .exe path."""
    cxx = clangxx()
    if cxx is None or not MINGW_GCC.exists():
        raise FileNotFoundError("clang++-19 and g++-mingw-w64-x86-64-posix are needed")
    out.mkdir(parents=True, exist_ok=True)
    for cmd in mingw_commands(out, cxx):
        run(cmd)
    return out / "ktwin_checks.exe"


def main(argv: list[str] | None = None) -> int:
    """CLI: build both flavours into OUTDIR."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    args = ap.parse_args(argv)
    print(build_native(args.outdir))
    print(build_windows(args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
