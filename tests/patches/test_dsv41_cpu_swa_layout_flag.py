"""winport.patches.dsv41_cpu_swa_layout_flag: V4.1's SWA layout flag set off CUDA from the KV pool."""

from __future__ import annotations

import types

from winport.patches import dsv41_cpu_swa_layout_flag


def test_swa_layout_flag_is_set_off_cuda_from_the_pool() -> None:
    for interleaved in (False, True):
        layout = types.SimpleNamespace(is_interleaved=interleaved)
        backend = types.SimpleNamespace(token_to_kv_pool=types.SimpleNamespace(get_swa_key_layout=lambda lay=layout: lay))
        dsv41_cpu_swa_layout_flag._init(lambda self: None, backend)
        assert backend._swa_interleaved is interleaved


def test_swa_layout_flag_leaves_the_cuda_value_alone() -> None:
    def cuda_init(self: types.SimpleNamespace) -> None:
        self._swa_interleaved = "set by upstream"

    backend = types.SimpleNamespace(token_to_kv_pool=None)  # never read when upstream set the flag
    dsv41_cpu_swa_layout_flag._init(cuda_init, backend)
    assert backend._swa_interleaved == "set by upstream"
