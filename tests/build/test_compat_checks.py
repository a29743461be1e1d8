"""The kt-kernel compat layer and the project's C++ checks: native build vs Windows build under Wine.

Each check prints key=value lines; the Windows build (compat layer: stand-in headers, Win32 calls)
must print what the native Linux build prints, and both must be right.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.wine


@pytest.mark.parametrize("check", ["pool", "numa", "alloc", "amx", "variant", "posix"])
def test_windows_build_matches_native(check: str, run_native, run_wine) -> None:
    """Same subcommand, same output on Linux (native) and Windows (Wine)."""
    native = run_native(check)
    windows = run_wine(check)
    assert native, f"native {check} printed nothing"
    assert windows == native


def test_thread_pool_named_and_pinned(run_wine) -> None:
    """Workers carry their Windows thread description and run on the CPU they were pinned to."""
    out = run_wine("pool")
    assert out["pool.set_ok"] == "1"
    assert out["pool.name_from_creator_ok"] == "1"
    assert out["pool.name_from_self_ok"] == "1"
    assert out["pool.pinned_ok"] == "1"
    assert out["pool.sum"] == out["pool.sum_expected"]
    assert out["pool.name0"] == "numa_0_t_0"


def test_numa_falls_back_to_one_node(run_wine) -> None:
    """Wine lacks GetNumaNodeProcessorMaskEx: the layer must report one node holding every CPU."""
    out = run_wine("numa")
    assert out == {"numa.nodes": "1", "numa.fell_back": "1", "numa.node_of_cpu0": "0", "numa.node_of_bad_cpu": "-1"}


def test_aligned_blocks_released_by_free(run_wine) -> None:
    """posix_memalign/aligned_alloc/realloc blocks are released by plain free() and std::free."""
    out = run_wine("alloc")
    assert out == {"alloc.ok": "1", "alloc.live_after": "0", "alloc.bad_alignment_rc": "1"}


def test_amx_permission_follows_xcr0(run_wine, run_native) -> None:
    """ARCH_REQ_XCOMP_PERM succeeds exactly when XCR0 has the tile bits (17, 18)."""
    out = run_wine("amx")
    if out["amx.xcr0_tile_bits"] == "3":
        assert out["amx.req_rc"] == "0"
    else:
        assert out["amx.req_rc"] == "-1" and out["amx.req_errno_einval"] == "1"
    posix = run_native("posix")
    assert posix["posix.amx_permitted"] == ("1" if out["amx.xcr0_tile_bits"] == "3" else "0")


def test_variant_ladder(run_wine) -> None:
    """The C++ ladder on synthetic feature sets, including AMX without OS tile state."""
    out = run_wine("variant")
    assert out["variant.ladder"] == "avx2,avx512_base,avx512_vnni,avx512_vbmi,avx512_bf16,amx,avx512_bf16"
