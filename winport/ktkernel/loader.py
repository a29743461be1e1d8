"""Import hook that adapts kt-kernel's variant loader to Windows, without editing kt-kernel.

kt-kernel's `__init__` does `from ._cpu_detect import initialize` and calls it; `initialize` looks
up `detect_cpu_features` and `load_extension` in its module globals at call time. So replacing
those two globals right after `kt_kernel._cpu_detect` executes is enough, and kt-kernel's checks
(`_validate_loaded_variant`, the `__cpu_variant__` attribute) keep working unchanged.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from winport import envs, importhooks
from winport.ktkernel.variant import VARIANT_NAMES, detect_variant
from winport.modfile import import_file

TARGET = "kt_kernel._cpu_detect"
# amx -> avx512_bf16 -> ... -> avx2 -> None, as in kt-kernel.
_FALLBACK = dict(zip(VARIANT_NAMES, [*VARIANT_NAMES[1:], None], strict=True))


def _debug(msg: str) -> None:
    if envs.KT_KERNEL_DEBUG.get():
        print(f"[winport.ktkernel] {msg}")


def find_extension(package_dir: str | os.PathLike[str], variant: str) -> Path | None:
    """The extension file of `variant` in kt_kernel's directory, whatever the platform's suffix.

    Looks for `_kt_kernel_ext_<variant>` + any suffix this interpreter can import (`.pyd`,
    `.cp312-win_amd64.pyd`, `.cpython-311-x86_64-linux-gnu.so`, ...), then for a single-variant
    `kt_kernel_ext` build, as kt-kernel does with its `*.so` glob.
    """
    directory = Path(package_dir)
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for stem in (f"_kt_kernel_ext_{variant}", "kt_kernel_ext"):
        for suffix in suffixes:
            candidate = directory / f"{stem}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def load_extension(variant: str, package_dir: str | os.PathLike[str] | None = None) -> ModuleType:
    """Load kt-kernel's extension for `variant`, falling back down the ladder like kt-kernel.

    The module is loaded under the name `kt_kernel_ext`, which is what every variant's
    `PyInit_kt_kernel_ext` registers.
    """
    if package_dir is None:
        spec = importlib.util.find_spec("kt_kernel")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("kt_kernel is not installed")
        package_dir = next(iter(spec.submodule_search_locations))
    tried: list[str] = []
    current: str | None = variant
    while current is not None:
        path = find_extension(package_dir, current)
        if path is not None:
            _debug(f"loading {current} from {path}")
            return import_file("kt_kernel_ext", path, register=False)
        tried.append(current)
        current = _FALLBACK.get(current)
    raise ImportError(
        f"no kt-kernel extension found in {package_dir} for variants {tried} "
        f"(suffixes {importlib.machinery.EXTENSION_SUFFIXES}); build them with build/ktkernel/make.py"
    )


def patch_module(module: ModuleType) -> None:
    """Replace kt_kernel._cpu_detect's detection and loading with the Windows-capable versions."""
    package_dir = Path(module.__file__ or ".").parent

    def detect_cpu_features() -> str:
        return detect_variant()

    def _load_extension(variant: str) -> ModuleType:
        return load_extension(variant, package_dir)

    detect_cpu_features.__doc__ = "cpuid-based variant choice (winport.ktkernel)."
    _load_extension.__doc__ = "Suffix-agnostic (.pyd/.so) variant loader (winport.ktkernel)."
    module.detect_cpu_features = detect_cpu_features  # type: ignore[attr-defined]
    module.load_extension = _load_extension  # type: ignore[attr-defined]
    module.__winport_patched__ = True  # type: ignore[attr-defined]


def install(force: bool = False) -> bool:
    """Register the hook (idempotent). Active on Windows, under WINPORT_EMULATE_WINDOWS=1, or with
    `force`; returns whether it is installed. If kt_kernel._cpu_detect was already imported, it is
    patched in place (kt_kernel itself has then already chosen its variant)."""
    if not (force or sys.platform == "win32" or envs.WINPORT_EMULATE_WINDOWS.get()):
        return False
    importhooks.on_import(TARGET, _patch_once)
    return True


def _patch_once(module: ModuleType) -> None:
    if not getattr(module, "__winport_patched__", False):
        patch_module(module)


def uninstall() -> None:
    """Remove the hook (modules already patched stay patched)."""
    importhooks.cancel(TARGET)


def is_installed() -> bool:
    """Whether the hook is registered."""
    return importhooks.is_registered(TARGET)
