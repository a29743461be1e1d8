"""Named patches to SGLang 0.5.23. Each module fixes one thing, names the upstream file it targets,
asserts that the upstream code still looks as expected (failing loudly otherwise) and has a test."""

from __future__ import annotations

# Module names under winport.patches, applied in this order by register_all().
PATCHES: tuple[str, ...] = ()


def register_all() -> None:
    """Register every patch with SGLang's HookRegistry."""
    import importlib

    for name in PATCHES:
        importlib.import_module(f"winport.patches.{name}").register()
