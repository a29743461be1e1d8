"""x86-64 CPU features read with the cpuid and xgetbv instructions, on Linux and Windows alike.

kt-kernel upstream reads /proc/cpuinfo, which Windows lacks (and without it silently falls back to
AVX2). Here a few bytes of machine code run cpuid/xgetbv directly through ctypes, so the answer is
the same on every OS and includes whether the OS enabled the AVX-512 and AMX register state.
Standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import struct
import sys
from dataclasses import asdict, dataclass

# cpuid(leaf, subleaf, out[4]) and xgetbv(index) in both x86-64 calling conventions.
_CPUID_SYSV = bytes.fromhex(
    "53"  # push rbx (cpuid clobbers it; it is callee-saved)
    "89f8"  # mov eax, edi
    "89f1"  # mov ecx, esi
    "4989d0"  # mov r8, rdx
    "0fa2"  # cpuid
    "418900" "41895804" "41894808" "4189500c"  # store eax, ebx, ecx, edx to [r8]
    "5b"  # pop rbx
    "c3"  # ret
)
_CPUID_WIN64 = bytes.fromhex(
    "53"  # push rbx
    "89c8"  # mov eax, ecx
    "89d1"  # mov ecx, edx   (out pointer is already in r8)
    "0fa2"  # cpuid
    "418900" "41895804" "41894808" "4189500c"
    "5b"
    "c3"
)
_XGETBV_SYSV = bytes.fromhex("89f9" "0f01d0" "48c1e220" "4809d0" "c3")
_XGETBV_WIN64 = bytes.fromhex("0f01d0" "48c1e220" "4809d0" "c3")

# XCR0 state components the OS must enable before the instructions may be used.
_XCR0_AVX = 0b110  # SSE + AVX (YMM upper halves)
_XCR0_AVX512 = 0b1110_0000  # opmask, ZMM_Hi256, Hi16_ZMM
_XCR0_AMX = (1 << 17) | (1 << 18)  # XTILECFG, XTILEDATA


class _ExecutableCode:
    """Machine code copied into executable memory, callable through ctypes."""

    def __init__(self, code: bytes, restype: type, argtypes: list[type]) -> None:
        size = max(len(code), 64)
        if sys.platform == "win32":
            kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
            kernel32.VirtualAlloc.restype = ctypes.c_void_p
            kernel32.VirtualAlloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulong, ctypes.c_ulong]
            mem_commit_reserve, page_execute_readwrite = 0x3000, 0x40
            addr = kernel32.VirtualAlloc(None, size, mem_commit_reserve, page_execute_readwrite)
            if not addr:
                raise OSError(ctypes.get_last_error(), "VirtualAlloc failed")
            ctypes.memmove(addr, code, len(code))
            self._keep: object = addr
        else:
            buf = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            buf.write(code)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
            self._keep = buf
        self.fn = ctypes.CFUNCTYPE(restype, *argtypes)(addr)


@functools.lru_cache(maxsize=1)
def _native() -> tuple[_ExecutableCode, _ExecutableCode]:
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        raise OSError(f"cpuid needs an x86-64 CPU, this is {platform.machine()}")
    win = sys.platform == "win32"
    cpuid = _ExecutableCode(
        _CPUID_WIN64 if win else _CPUID_SYSV,
        None,  # type: ignore[arg-type]
        [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p],
    )
    xgetbv = _ExecutableCode(_XGETBV_WIN64 if win else _XGETBV_SYSV, ctypes.c_uint64, [ctypes.c_uint32])
    return cpuid, xgetbv


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    """Execute cpuid and return (eax, ebx, ecx, edx)."""
    out = (ctypes.c_uint32 * 4)()
    _native()[0].fn(leaf, subleaf, ctypes.addressof(out))
    return out[0], out[1], out[2], out[3]


def xgetbv(index: int = 0) -> int:
    """Execute xgetbv (only valid when cpuid reports OSXSAVE)."""
    return int(_native()[1].fn(index))


def _bit(value: int, n: int) -> bool:
    return bool((value >> n) & 1)


@dataclass(frozen=True)
class CpuFeatures:
    """What the CPU supports and the OS has enabled (an ISA counts only when both hold)."""

    vendor: str
    brand: str
    avx2: bool
    fma: bool
    avx512f: bool
    avx512bw: bool
    avx512vl: bool
    avx512dq: bool
    avx512_vnni: bool
    avx512_vbmi: bool
    avx512_bf16: bool
    amx_tile: bool
    amx_bf16: bool
    amx_int8: bool
    amx_os_enabled: bool
    xcr0: int

    def as_dict(self) -> dict[str, object]:
        """All fields as a plain dict (for `winport doctor --json`)."""
        return asdict(self)

    @property
    def isa_list(self) -> list[str]:
        """Names of the usable ISA extensions, in the spelling Linux's /proc/cpuinfo uses."""
        names = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                 "avx512_vbmi", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
        return [n for n in names if getattr(self, n)]


# kt-kernel 0.7.2's variants, best first, with the features each needs (the same rule kt-kernel
# applies to /proc/cpuinfo flags; AMX additionally needs the OS to have enabled tile state).
KT_KERNEL_VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("amx", ("amx_tile", "amx_int8", "amx_bf16", "amx_os_enabled", "avx512f", "avx512bw",
             "avx512_vnni", "avx512_vbmi", "avx512_bf16")),
    ("avx512_bf16", ("avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi", "avx512_bf16")),
    ("avx512_vbmi", ("avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi")),
    ("avx512_vnni", ("avx512f", "avx512bw", "avx512_vnni")),
    ("avx512_base", ("avx512f", "avx512bw")),
    ("avx2", ()),
)


def kt_kernel_variant(features: CpuFeatures) -> str:
    """The kt-kernel extension variant this CPU should load."""
    for name, needs in KT_KERNEL_VARIANTS:
        if all(getattr(features, n) for n in needs):
            return name
    return "avx2"


def _decode(regs: dict[tuple[int, int], tuple[int, int, int, int]], xcr0: int) -> CpuFeatures:
    """Turn raw cpuid registers (keyed by (leaf, subleaf)) and XCR0 into CpuFeatures."""
    zero = (0, 0, 0, 0)
    l0 = regs.get((0, 0), zero)
    vendor = struct.pack("<III", l0[1], l0[3], l0[2]).decode("ascii", "replace").strip("\0")
    brand_raw = b"".join(struct.pack("<IIII", *regs.get((leaf, 0), zero)) for leaf in
                         (0x80000002, 0x80000003, 0x80000004))
    brand = brand_raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()
    _, _, ecx1, _ = regs.get((1, 0), zero)
    _, ebx7, ecx7, edx7 = regs.get((7, 0), zero)
    eax71 = regs.get((7, 1), zero)[0]
    avx_os = _bit(ecx1, 27) and (xcr0 & _XCR0_AVX) == _XCR0_AVX
    avx512_os = avx_os and (xcr0 & _XCR0_AVX512) == _XCR0_AVX512
    f512 = avx512_os and _bit(ebx7, 16)
    return CpuFeatures(
        vendor=vendor,
        brand=brand,
        avx2=avx_os and _bit(ebx7, 5),
        fma=avx_os and _bit(ecx1, 12),
        avx512f=f512,
        avx512bw=f512 and _bit(ebx7, 30),
        avx512vl=f512 and _bit(ebx7, 31),
        avx512dq=f512 and _bit(ebx7, 17),
        avx512_vnni=f512 and _bit(ecx7, 11),
        avx512_vbmi=f512 and _bit(ecx7, 1),
        avx512_bf16=f512 and _bit(eax71, 5),
        amx_tile=_bit(edx7, 24),
        amx_bf16=_bit(edx7, 22),
        amx_int8=_bit(edx7, 25),
        amx_os_enabled=(xcr0 & _XCR0_AMX) == _XCR0_AMX,
        xcr0=xcr0,
    )


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """Read this CPU's features with cpuid/xgetbv (cached)."""
    regs: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    max_leaf = cpuid(0)[0]
    regs[(0, 0)] = cpuid(0)
    for leaf, sub in ((1, 0), (7, 0), (7, 1)):
        if leaf <= max_leaf:
            regs[(leaf, sub)] = cpuid(leaf, sub)
    if cpuid(0x80000000)[0] >= 0x80000004:
        for leaf in (0x80000002, 0x80000003, 0x80000004):
            regs[(leaf, 0)] = cpuid(leaf)
    xcr0 = xgetbv(0) if _bit(regs.get((1, 0), (0, 0, 0, 0))[2], 27) else 0
    return _decode(regs, xcr0)
