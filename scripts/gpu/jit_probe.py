"""Debug aid for GPU runs: record every SGLang CUDA JIT module the serving path asks for.

Imported from a sitecustomize when WINPORT_JIT_PROBE_FILE is set (scripts/gpu/serve_demo.sh
--probe). SGLang's `load_jit` is replaced by one that appends the module name, its CUDA sources
and the calling frames to that file and returns a module whose functions do nothing, so a single
run lists every JIT kernel still to be replaced instead of stopping at the first. The outputs of
such a run are garbage by construction: it is for finding kernels, never for checking results.
"""

from __future__ import annotations

import os
import traceback
import types
from typing import Any

from winport.importhooks import on_import

LOADER = "sglang.kernels.jit.utils.compile.loader"


class _Inert:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return lambda *args, **kwargs: None


def _install(loader: types.ModuleType) -> None:
    path = os.environ["WINPORT_JIT_PROBE_FILE"]
    seen: set[str] = set()

    def load_jit(*args: str, **kwargs: Any) -> _Inert:
        name = args[0] if args else "?"
        if name not in seen:
            seen.add(name)
            frames = traceback.extract_stack()[-9:-1]
            where = "\n".join(f"    {f.filename.split('site-packages/')[-1].split('/tmp/site/')[-1]}:{f.lineno} {f.name}"
                              for f in frames)
            files = kwargs.get("cuda_files") or kwargs.get("cpp_files")
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{name} files={files}\n{where}\n")
        return _Inert(name)

    loader.load_jit = load_jit


if os.environ.get("WINPORT_JIT_PROBE_FILE"):
    on_import(LOADER, _install)
