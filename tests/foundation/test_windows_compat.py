"""winport.platform.windows_compat: what Windows CPython lacks and SGLang needs, filled in at interpreter start."""

from __future__ import annotations

import types


def test_windows_compat_fills_what_windows_lacks() -> None:
    from winport.platform import windows_compat

    fake_mmap = types.ModuleType("mmap")
    env: dict[str, str] = {}
    changed = windows_compat.apply(fake_mmap, env)
    assert fake_mmap.PROT_READ == 1 and fake_mmap.MAP_SHARED == 1  # type: ignore[attr-defined]
    assert env["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "8192"
    assert "mmap.PROT_READ" in changed
    env2 = {"SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS": "4096"}
    windows_compat.apply(fake_mmap, env2)
    assert env2["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "4096"  # a user's choice is kept
