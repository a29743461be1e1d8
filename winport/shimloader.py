"""Import-name shims: `import sgl_kernel` (and friends) resolves to `shims.sgl_kernel`.

A meta-path finder placed first on sys.meta_path redirects each Linux-only kernel library that
SGLang imports to the package of the same name under `shims/`, when the real library is missing
(always on Windows) or always when WINPORT_SHIMS=force. WINPORT_SHIMS=off disables it.

It is installed in every interpreter by a .pth file the installer writes into the venv
(`winport_shims.pth`), so processes SGLang spawns get it before they import anything. This module
must stay cheap to import: standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from winport import envs, importhooks, linux_only, winemu

# Upstream import name -> pip distribution that provides it (for messages and `winport doctor`).
SHIMMED_LIBRARIES: dict[str, str] = {**linux_only.SHIMMED_PACKAGES, **linux_only.POSIX_ONLY_MODULES}

# Standard-library modules Windows lacks: their stand-ins are used only where the real module is
# missing, never forced (WINPORT_SHIMS=force is for testing the kernel shims on Linux).
STDLIB_STANDINS = frozenset(linux_only.POSIX_ONLY_MODULES)

SHIM_PACKAGE = "shims"


def shim_mode() -> str:
    """Return the WINPORT_SHIMS mode: 'auto' (default), 'force' or 'off'."""
    return envs.WINPORT_SHIMS.get()


class _AliasLoader(importlib.abc.Loader):
    """Loads `name` by importing `shims.name` and handing back that very module object."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        # The shim module was fully executed by import_module in create_module.
        return None


class ShimFinder(importhooks.NameFinder):
    """Meta-path finder that maps shimmed top-level names (and their submodules) to `shims.*`."""

    def __init__(self) -> None:
        self._decided: dict[str, bool] = {}

    def _real_exists(self, top: str) -> bool:
        if winemu.is_blocked(top):
            return False
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, winemu.BlockFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                if find(top, None) is not None:
                    return True
            except (ImportError, ValueError):
                continue
        return False

    def use_shim(self, top: str) -> bool:
        """Whether the top-level name `top` goes to the shim in this process."""
        if top not in self._decided:
            mode = shim_mode()
            forced = mode == "force" and top not in STDLIB_STANDINS
            self._decided[top] = forced or (mode != "off" and not self._real_exists(top))
        return self._decided[top]

    def find(
        self, fullname: str, top: str, path: importhooks.SearchPath, target: types.ModuleType | None
    ) -> importhooks.Spec:
        if top not in SHIMMED_LIBRARIES or not self.use_shim(top):
            return None
        shim_name = f"{SHIM_PACKAGE}.{fullname}"
        shim_spec = importlib.util.find_spec(shim_name)
        if shim_spec is None:
            raise ModuleNotFoundError(
                f"{fullname} (from {SHIMMED_LIBRARIES[top]}) has no winport shim yet: "
                f"winport provides {shim_name.rsplit('.', 1)[0]} but not this submodule",
                name=fullname,
            )
        is_package = shim_spec.submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(shim_name), is_package=is_package
        )


def install() -> ShimFinder | None:
    """Put the shim finder first on sys.meta_path (idempotent). Returns it, or None when off."""
    if shim_mode() == "off":
        return None
    for finder in sys.meta_path:
        if isinstance(finder, ShimFinder):
            return finder
    finder = ShimFinder()
    sys.meta_path.insert(0, finder)
    return finder


def active_shims() -> dict[str, bool]:
    """Map each shimmed library name to True when this process would use the shim for it."""
    finder = install()
    if finder is None:
        return {name: False for name in SHIMMED_LIBRARIES}
    return {name: finder.use_shim(name) for name in SHIMMED_LIBRARIES}
