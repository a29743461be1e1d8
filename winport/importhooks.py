"""Run a function on a module right after it is imported: one meta-path finder for every such hook.

Used by Windows emulation (zmq, torch.distributed) and by kt-kernel's Windows loader. The finder
asks the other finders for the real spec and wraps its loader, so the module is imported normally
and then patched before anyone else sees it. Standard library only (installed at interpreter start).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence

Patch = Callable[[types.ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Patch) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)  # type: ignore[attr-defined]
        self.patch(module)


SearchPath = Sequence[str] | None
Spec = importlib.machinery.ModuleSpec | None


class NameFinder(importlib.abc.MetaPathFinder):
    """The meta-path protocol spelled once for winport's finders, which each decide by the module's name.

    Subclasses implement `find`, which also gets the top-level package name (`top`) most of them key on.
    """

    def find_spec(
        self,
        fullname: str,
        path: SearchPath = None,
        target: types.ModuleType | None = None,
    ) -> Spec:
        return self.find(fullname, fullname.partition(".")[0], path, target)

    def find(self, fullname: str, top: str, path: SearchPath, target: types.ModuleType | None) -> Spec:
        """The spec for `fullname` (top-level package `top`), or None to let the later finders look."""
        raise NotImplementedError


class PostImportFinder(NameFinder):
    """Wraps the loader of each registered module name so its patch runs after it executes."""

    def __init__(self) -> None:
        self.patches: dict[str, Patch] = {}

    def find(self, fullname: str, top: str, path: SearchPath, target: types.ModuleType | None) -> Spec:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PostImportFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


_finder = PostImportFinder()


def on_import(name: str, patch: Patch) -> None:
    """Run patch(module) once `name` is imported (now, if it already is). Idempotent per name."""
    _finder.patches[name] = patch
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    if name in sys.modules and sys.modules[name] is not None:
        patch(sys.modules[name])


def cancel(name: str) -> None:
    """Stop patching `name` on future imports (a module already patched stays patched)."""
    _finder.patches.pop(name, None)


def is_registered(name: str) -> bool:
    """Whether a patch is registered for `name`."""
    return name in _finder.patches and _finder in sys.meta_path
