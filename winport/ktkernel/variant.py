"""kt-kernel's CPU-variant ladder, decided from cpuid (winport.cpu_features), not /proc/cpuinfo."""

from __future__ import annotations

from typing import Any

from winport import envs

# Best first; the feature names are winport.cpu_features attributes. The requirements are
# kt-kernel 0.7.2's (python/_cpu_detect.py), plus `amx_os_enabled`: on Linux /proc/cpuinfo already
# hides AMX when the kernel does not save tile state; cpuid does not, so XCR0 is checked instead.
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("amx", ("amx_tile", "amx_int8", "amx_bf16", "amx_os_enabled",
             "avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi", "avx512_bf16")),
    ("avx512_bf16", ("avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi", "avx512_bf16")),
    ("avx512_vbmi", ("avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi")),
    ("avx512_vnni", ("avx512f", "avx512bw", "avx512_vnni")),
    ("avx512_base", ("avx512f", "avx512bw")),
    ("avx2", ("avx2",)),
)
VARIANT_NAMES: tuple[str, ...] = tuple(name for name, _ in VARIANTS)


def choose_variant(features: Any) -> str:
    """Best kt-kernel variant for an object with winport.cpu_features' boolean attributes.

    Falls back to "avx2" like kt-kernel does, also when AVX2 itself is missing (kt-kernel has no
    lower variant; such a CPU cannot run it at all).
    """
    for name, required in VARIANTS:
        if all(bool(getattr(features, flag, False)) for flag in required):
            return name
    return "avx2"


def detect_variant() -> str:
    """The variant for this machine: `KT_KERNEL_CPU_VARIANT` when it names one (kt-kernel's own
    override), else the cpuid-based choice."""
    override = (envs.KT_KERNEL_CPU_VARIANT.get() or "").lower()
    if override in VARIANT_NAMES:
        return override
    from winport.cpu_features import cpu_features  # lazy: reads cpuid through ctypes

    return choose_variant(cpu_features())
