"""Windows emulation for Linux tests (WINPORT_EMULATE_WINDOWS=1).

Makes this Linux interpreter refuse what a Windows one lacks, so Linux CI runs the code paths
Windows will: POSIX-only modules and Linux-only kernel libraries become unimportable, NCCL is
unavailable, zmq rejects ipc:// endpoints, and os/signal lose the fork/process-group/SIGQUIT
functions Windows has no equivalent for. It is a proxy, not Windows: what it cannot imitate is
listed in README.md. Standard library only (installed from a .pth file at interpreter start).
"""

from __future__ import annotations

import os
import signal
import sys
import types
from collections.abc import Callable

from winport import envs, importhooks, linux_only

ENV_VAR = envs.WINPORT_EMULATE_WINDOWS.name

# Modules with no Windows build (winport.linux_only says which and why).
BLOCKED_MODULES = frozenset(linux_only.POSIX_ONLY_MODULES) | linux_only.LINUX_ONLY_PACKAGES

# Functions Windows CPython does not have. SIGKILL stays: psutil's POSIX backend (which the
# emulated process still runs on) needs it, while real Windows uses TerminateProcess.
REMOVED_OS_FUNCTIONS = (
    "fork",
    "forkpty",
    "killpg",
    "getpgid",
    "setpgid",
    "setsid",
    "getsid",
    "sched_setaffinity",
    "memfd_create",
)
REMOVED_SIGNALS = ("SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2")

# Shared objects Windows cannot load (ctypes.CDLL name prefixes). libc stays loadable: the Linux
# torch build itself loads it at import (torch.distributed.elastic), which Windows torch does not.
BLOCKED_SHARED_LIBRARIES = ("libnccl", "libnuma", "libcuda.so")


class WindowsEmulationError(OSError):
    """Something that cannot work on Windows was attempted under WINPORT_EMULATE_WINDOWS=1."""


def enabled() -> bool:
    """Whether this process emulates Windows."""
    return bool(envs.WINPORT_EMULATE_WINDOWS.get())


def is_blocked(name: str) -> bool:
    """Whether `name` (a top-level module name) is unimportable in this process."""
    return enabled() and name.partition(".")[0] in BLOCKED_MODULES


def check_zmq_endpoint(endpoint: str | bytes) -> None:
    """Reject endpoints Windows' zmq cannot use (ipc:// fails there: 'Protocol not supported')."""
    text = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
    if text.startswith("ipc://"):
        raise WindowsEmulationError(
            f"zmq endpoint {text!r} uses ipc://, which Windows' libzmq does not support; "
            "use tcp://127.0.0.1:<port>"
        )


def _patch_zmq(module: types.ModuleType) -> None:
    socket_cls = module.Socket
    for method in ("bind", "connect"):
        original = getattr(socket_cls, method)

        def guarded(self, addr, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            check_zmq_endpoint(addr)
            return _original(self, addr, *args, **kwargs)

        setattr(socket_cls, method, guarded)


def _patch_torch_distributed(module: types.ModuleType) -> None:
    # Windows builds of torch ship without NCCL.
    module.is_nccl_available = lambda: False


POST_IMPORT_PATCHES: dict[str, Callable[[types.ModuleType], None]] = {
    "zmq": _patch_zmq,
    "torch.distributed": _patch_torch_distributed,
}


class BlockFinder(importhooks.NameFinder):
    """Refuses submodules of blocked packages (the packages themselves are None in sys.modules)."""

    def find(
        self, fullname: str, top: str, path: importhooks.SearchPath, target: types.ModuleType | None
    ) -> importhooks.Spec:
        if top in BLOCKED_MODULES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (WINPORT_EMULATE_WINDOWS=1: it has no Windows build)",
                name=fullname,
            )
        return None


def _guard_ctypes() -> None:
    import ctypes

    original_init = ctypes.CDLL.__init__
    if getattr(original_init, "_winport_guard", False):
        return

    def guarded_init(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
        base = os.path.basename(str(name)) if name is not None else ""
        if base.startswith(BLOCKED_SHARED_LIBRARIES):
            raise WindowsEmulationError(f"cannot load {name!r} on Windows")
        original_init(self, name, *args, **kwargs)

    guarded_init._winport_guard = True  # type: ignore[attr-defined]
    ctypes.CDLL.__init__ = guarded_init  # type: ignore[method-assign]


def install() -> bool:
    """Turn emulation on in this process if WINPORT_EMULATE_WINDOWS is set. Idempotent."""
    if not enabled():
        return False
    if any(isinstance(f, BlockFinder) for f in sys.meta_path):
        return True
    for name in list(sys.modules):
        if name.partition(".")[0] in BLOCKED_MODULES:
            del sys.modules[name]
    # A None entry makes `import x` fail and importlib.util.find_spec("x") return None, which is
    # how probing libraries (transformers, SGLang) must see a missing package. Names winport
    # shims are left to the shim finder, which sits ahead of BlockFinder on sys.meta_path.
    for name in BLOCKED_MODULES - set(linux_only.SHIMMED_PACKAGES) - set(linux_only.POSIX_ONLY_MODULES):
        sys.modules[name] = None  # type: ignore[assignment]
    sys.meta_path.insert(0, BlockFinder())
    for name in REMOVED_OS_FUNCTIONS:
        if hasattr(os, name):
            delattr(os, name)
    for name in REMOVED_SIGNALS:
        if hasattr(signal, name):
            delattr(signal, name)
    _guard_ctypes()
    import multiprocessing

    # Windows has only the spawn start method; a child must rebuild everything itself.
    multiprocessing.set_start_method("spawn", force=True)
    for name, patch in POST_IMPORT_PATCHES.items():
        importhooks.on_import(name, patch)
    return True
