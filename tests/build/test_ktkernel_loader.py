"""winport.ktkernel: cpuid-based variant choice and .pyd discovery, applied to kt-kernel at import time.

A stand-in `kt_kernel` package (written here, shaped like kt-kernel 0.7.2's: `__init__` calls
`_cpu_detect.initialize()`, which calls the module-level `detect_cpu_features` and `load_extension`)
checks that the hook swaps both without editing the package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from winport.ktkernel import choose_variant, find_extension, install, uninstall
from winport.ktkernel.variant import VARIANTS

FLAGS = ["avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi", "avx512_bf16",
         "amx_tile", "amx_int8", "amx_bf16", "amx_os_enabled"]


def features(**on: bool) -> SimpleNamespace:
    """A winport.cpu_features-like object with the given flags on, the rest off."""
    return SimpleNamespace(**{f: on.get(f, False) for f in FLAGS})


def test_ladder() -> None:
    """Same ladder as the C++ compat layer prints (variant.ladder in test_compat_checks)."""
    steps = [("avx2",), ("avx512f", "avx512bw"), ("avx512_vnni",), ("avx512_vbmi",), ("avx512_bf16",),
             ("amx_tile", "amx_int8", "amx_bf16", "amx_os_enabled")]
    on: dict[str, bool] = {}
    seen = []
    for step in steps:
        on.update(dict.fromkeys(step, True))
        seen.append(choose_variant(features(**on)))
    assert seen == [name for name, _ in reversed(VARIANTS)]
    on["amx_os_enabled"] = False  # AMX CPU, OS does not save tile state
    assert choose_variant(features(**on)) == "avx512_bf16"
    assert choose_variant(features()) == "avx2"


def test_matches_cpp_on_this_cpu(run_native) -> None:
    """Python (winport.cpu_features) and the C++ layer pick the same variant on this machine."""
    cpu_features = pytest.importorskip("winport.cpu_features").cpu_features
    assert choose_variant(cpu_features()) == run_native("variant")["variant.choice"]


def test_find_extension_pyd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows suffixes are found; kt-kernel's `*.so` glob would find nothing here."""
    monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".cp312-win_amd64.pyd", ".pyd"])
    (tmp_path / "_kt_kernel_ext_avx2.cp312-win_amd64.pyd").write_bytes(b"")
    (tmp_path / "_kt_kernel_ext_amx.cp311-win_amd64.pyd").write_bytes(b"")  # other Python: ignored
    assert find_extension(tmp_path, "avx2") == tmp_path / "_kt_kernel_ext_avx2.cp312-win_amd64.pyd"
    assert find_extension(tmp_path, "amx") is None
    assert not list(tmp_path.glob("_kt_kernel_ext_avx2.*.so"))


STAND_IN_INIT = """
from ._cpu_detect import initialize as _initialize_cpu
kt_kernel_ext, __cpu_variant__ = _initialize_cpu()
"""
STAND_IN_DETECT = """
import glob, os

def detect_cpu_features():
    try:
        open("/nonexistent/cpuinfo").close()
    except FileNotFoundError:
        return "avx2"

def load_extension(variant):
    here = os.path.dirname(os.path.abspath(__file__))
    if not glob.glob(os.path.join(here, f"_kt_kernel_ext_{variant}.*.so")):
        raise ImportError("no .so for " + variant)

def initialize():
    variant = detect_cpu_features()
    ext = load_extension(variant)
    return ext, str(getattr(ext, "__cpu_variant__", variant))
"""


@pytest.fixture
def stand_in_kt_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kt_kernel package on sys.path whose 'extensions' are Python files (suffix patched in)."""
    pkg = tmp_path / "kt_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(STAND_IN_INIT))
    (pkg / "_cpu_detect.py").write_text(textwrap.dedent(STAND_IN_DETECT))
    for variant in ("avx512_vnni", "avx2"):
        (pkg / f"_kt_kernel_ext_{variant}.ext.py").write_text(f"__cpu_variant__ = {variant!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".ext.py"])
    for name in ("kt_kernel", "kt_kernel._cpu_detect", "kt_kernel_ext"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield pkg
    uninstall()
    for name in ("kt_kernel", "kt_kernel._cpu_detect", "kt_kernel_ext"):
        sys.modules.pop(name, None)


def test_hook_swaps_detection_and_loading(stand_in_kt_kernel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the hook, kt_kernel picks the cpuid variant and loads it; AMX-less avx512_bf16 request
    falls back down the ladder to the variant that exists (avx512_vnni)."""
    import winport.cpu_features as cf

    monkeypatch.delenv("KT_KERNEL_CPU_VARIANT", raising=False)
    fake = features(avx2=True, avx512f=True, avx512bw=True, avx512_vnni=True, avx512_vbmi=True, avx512_bf16=True)
    monkeypatch.setattr(cf, "cpu_features", lambda: fake)
    assert install(force=True)
    kt = importlib.import_module("kt_kernel")
    assert kt.__cpu_variant__ == "avx512_vnni"
    assert sys.modules["kt_kernel._cpu_detect"].__winport_patched__


def test_without_hook_upstream_logic_fails(stand_in_kt_kernel: Path) -> None:
    """Control: the unpatched stand-in cannot load anything here (proves the hook does the work)."""
    uninstall()
    with pytest.raises(ImportError):
        importlib.import_module("kt_kernel")


def test_env_override(stand_in_kt_kernel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KT_KERNEL_CPU_VARIANT keeps working as in kt-kernel."""
    monkeypatch.setenv("KT_KERNEL_CPU_VARIANT", "avx2")
    assert install(force=True)
    assert importlib.import_module("kt_kernel").__cpu_variant__ == "avx2"


def test_install_is_platform_gated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not active on plain Linux; active under WINPORT_EMULATE_WINDOWS=1."""
    monkeypatch.delenv("WINPORT_EMULATE_WINDOWS", raising=False)
    if sys.platform != "win32":
        assert install() is False
    monkeypatch.setenv("WINPORT_EMULATE_WINDOWS", "1")
    assert install() is True
    uninstall()
