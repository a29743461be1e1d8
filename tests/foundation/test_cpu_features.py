"""cpuid-based CPU features, checked against Linux's /proc/cpuinfo as an independent reference."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from winport.cpu_features import CpuFeatures, _decode, cpu_features, kt_kernel_variant

# cpuinfo spelling -> CpuFeatures field
CPUINFO_NAMES = {
    "avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl",
    "avx512dq": "avx512dq", "avx512_vnni": "avx512_vnni", "avx512vbmi": "avx512_vbmi",
    "avx512_bf16": "avx512_bf16", "amx_tile": "amx_tile", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8",
}


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc/cpuinfo as the reference")
def test_cpuid_matches_proc_cpuinfo() -> None:
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    f = cpu_features()
    for cpuinfo_name, field in CPUINFO_NAMES.items():
        assert getattr(f, field) == (cpuinfo_name in flags), field


def test_brand_and_vendor_are_read() -> None:
    f = cpu_features()
    assert f.vendor in {"GenuineIntel", "AuthenticAMD"}
    assert f.brand


def _synthetic(**overrides: bool) -> CpuFeatures:
    base = {name: False for name in CpuFeatures.__dataclass_fields__ if name not in {"vendor", "brand", "xcr0"}}
    base.update(overrides)
    return CpuFeatures(vendor="x", brand="y", xcr0=0, **base)


@pytest.mark.parametrize(
    ("flags", "variant"),
    [
        ({}, "avx2"),
        ({"avx512f": True}, "avx2"),  # kt-kernel's base variant needs BW as well
        ({"avx512f": True, "avx512bw": True}, "avx512_base"),
        ({"avx512f": True, "avx512bw": True, "avx512_vnni": True}, "avx512_vnni"),
        ({"avx512f": True, "avx512bw": True, "avx512_vnni": True, "avx512_vbmi": True}, "avx512_vbmi"),
        ({"avx512f": True, "avx512bw": True, "avx512_vnni": True, "avx512_vbmi": True, "avx512_bf16": True},
         "avx512_bf16"),
    ],
)
def test_kt_variant_order(flags: dict[str, bool], variant: str) -> None:
    assert kt_kernel_variant(_synthetic(**flags)) == variant


def test_amx_needs_os_enabled_tile_state() -> None:
    zen_like = {"avx512f": True, "avx512bw": True, "avx512_vnni": True, "avx512_vbmi": True, "avx512_bf16": True}
    amx = _synthetic(**zen_like, amx_tile=True, amx_bf16=True, amx_int8=True)
    assert kt_kernel_variant(amx) == "avx512_bf16"
    assert kt_kernel_variant(replace(amx, amx_os_enabled=True)) == "amx"


def test_decode_respects_os_state() -> None:
    # Sapphire-Rapids-like registers: AVX-512 (leaf 7 ebx bits 16/30/31/17), AMX (edx 22/24/25).
    ebx7 = (1 << 5) | (1 << 16) | (1 << 17) | (1 << 30) | (1 << 31)
    edx7 = (1 << 22) | (1 << 24) | (1 << 25)
    regs = {(0, 0): (7, 0x756E6547, 0x6C65746E, 0x49656E69), (1, 0): (0, 0, (1 << 27) | (1 << 12), 0),
            (7, 0): (0, ebx7, (1 << 11) | (1 << 1), edx7), (7, 1): (1 << 5, 0, 0, 0)}
    full = _decode(regs, 0xE7 | (3 << 17))
    assert full.vendor == "GenuineIntel"
    assert full.avx512_bf16 and full.amx_os_enabled
    assert kt_kernel_variant(full) == "amx"
    no_zmm = _decode(regs, 0x7)  # OS saves AVX but not the AVX-512 state
    assert no_zmm.avx2 and not no_zmm.avx512f and not no_zmm.avx512_bf16
    assert kt_kernel_variant(no_zmm) == "avx2"


@pytest.mark.skipif(sys.platform == "win32", reason="checks the POSIX executable-memory path")
def test_cpuid_leaf_zero_is_stable() -> None:
    from winport.cpu_features import cpuid

    assert cpuid(0) == cpuid(0)
    assert cpuid(0)[0] >= 7
