"""kt-kernel on Windows without editing kt-kernel: the Python-side changes, applied at import time.

kt-kernel 0.7.2 picks its native variant from /proc/cpuinfo (absent on Windows, where it silently
falls back to AVX2) and finds the variant module with a `*.so` glob (Windows extensions are .pyd).
`install()` registers an import hook that, as soon as `kt_kernel._cpu_detect` is executed, replaces
its `detect_cpu_features` and `load_extension` with cpuid-based and suffix-agnostic versions.
kt-kernel's own `initialize()` then runs unchanged and calls the replacements.
"""

from __future__ import annotations

from winport.ktkernel.loader import find_extension, install, is_installed, load_extension, uninstall
from winport.ktkernel.variant import VARIANTS, choose_variant, detect_variant

__all__ = [
    "VARIANTS",
    "choose_variant",
    "detect_variant",
    "find_extension",
    "install",
    "is_installed",
    "load_extension",
    "uninstall",
]
