"""Shim for `sgl_kernel.kvcacheio`: the host-KV-cache transfer kernels (hierarchical cache).

SGLang imports these names at module level on CUDA (mem_cache/pool_host/*) but calls them only
when the hierarchical cache (`--enable-hierarchical-cache`, KV pages offloaded to host memory) is
on. winport does not offer that mode, so each name exists for the import and fails by name if it
is ever called. `get_device_accessible_ptr` stays missing on purpose: SGLang probes it with
try/except and falls back when it is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from shims._missing import missing_getattr

_REASON = ("SGLang's hierarchical KV cache (--enable-hierarchical-cache) needs CUDA host<->device "
           "copy kernels that winport does not provide; run the server without that flag")


def _unsupported(name: str) -> Callable[..., NoReturn]:
    def fn(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.kvcacheio.{name}: {_REASON}")

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Unsupported in winport: {_REASON}."
    return fn


_NAMES = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)
globals().update({n: _unsupported(n) for n in _NAMES})
__all__ = list(_NAMES)
__getattr__ = missing_getattr("sgl_kernel.kvcacheio", "sglang-kernel")
