"""What exists on Linux only: the one list the shim finder (winport.shimloader) and Windows emulation
(winport.winemu) both read.

Kernel libraries SGLang imports have manylinux wheels only (shared/WINDOWS_PROXY.md lists what exists
for win_amd64); winport ships a shim of some (shims/<name>), the others SGLang probes for and does
without. Standard library only, no imports: it is read at interpreter start from a .pth file.
"""

from __future__ import annotations

# Linux-only packages winport shims: import name -> pip distribution (for messages and `winport doctor`).
SHIMMED_PACKAGES: dict[str, str] = {
    "sgl_kernel": "sglang-kernel",
    "flashinfer": "flashinfer-python",
    "flash_mla": "sgl-flash-mla",
    "deep_gemm": "sgl-deep-gemm",
    "flash_attn_interface": "flash-attn-3",
    "tilelang": "tilelang",
    "uvloop": "uvloop",  # no Windows build; asyncio's default loop stands in
}

# Standard-library modules Windows CPython lacks and SGLang imports without a platform check: their
# stand-ins are used only where the real module is missing. Other POSIX-only modules (termios, pwd,
# tty ...) stay importable: the libraries that use them (huggingface_hub, getpass) branch on
# sys.platform first, and blocking them would report Linux-branch imports Windows never runs.
POSIX_ONLY_MODULES: dict[str, str] = {
    "fcntl": "fcntl (POSIX-only standard library)",
    "resource": "resource (POSIX-only standard library)",
}

# Linux-only packages without a shim: SGLang takes another path when they are missing.
UNSHIMMED_PACKAGES = frozenset(
    {"flash_attn", "deep_ep", "cutlass", "nvshmem", "torch_memory_saver", "quack", "mooncake"}
)

# Every top-level name a Windows interpreter cannot import.
LINUX_ONLY_PACKAGES = frozenset(SHIMMED_PACKAGES) | UNSHIMMED_PACKAGES
