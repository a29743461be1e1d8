"""The shim finder: name resolution, modes, clear errors, and activity in spawned children."""

from __future__ import annotations

import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_python
from winport import shimloader


def _fake_real_library(tmp_path: Path, name: str) -> Path:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    return tmp_path


def test_force_mode_names_the_shim() -> None:
    proc = run_python("import sgl_kernel; print(sgl_kernel.__name__)", env={"WINPORT_SHIMS": "force"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "shims.sgl_kernel"


@pytest.mark.parametrize("name", sorted(set(shimloader.SHIMMED_LIBRARIES) - shimloader.STDLIB_STANDINS))
def test_every_library_resolves_to_its_shim_when_missing(name: str) -> None:
    proc = run_python(f"import {name}; print({name}.__name__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"shims.{name}"


def test_force_mode_never_replaces_the_real_standard_library() -> None:
    proc = run_python("import fcntl, resource; print(fcntl.__name__, resource.__name__)",
                      env={"WINPORT_SHIMS": "force"})
    assert proc.stdout.split() == ["fcntl", "resource"], proc.stderr


def test_auto_mode_prefers_a_real_library(tmp_path: Path) -> None:
    path = _fake_real_library(tmp_path, "flash_mla")
    code = "import flash_mla; print(flash_mla.__name__, getattr(flash_mla, 'REAL', False))"
    auto = run_python(code, env={"PYTHONPATH": str(path)})
    assert auto.stdout.split() == ["flash_mla", "True"], auto.stderr
    forced = run_python(code, env={"PYTHONPATH": str(path), "WINPORT_SHIMS": "force"})
    assert forced.stdout.split() == ["shims.flash_mla", "False"], forced.stderr


def test_off_mode_leaves_imports_alone() -> None:
    proc = run_python("import sgl_kernel", env={"WINPORT_SHIMS": "off"})
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr


def test_invalid_mode_is_reported() -> None:
    proc = run_python("from winport import shimloader; shimloader.shim_mode()", env={"WINPORT_SHIMS": "maybe"})
    assert "WINPORT_SHIMS must be auto, force or off" in proc.stderr


def test_missing_function_raises_a_named_import_error() -> None:
    code = textwrap.dedent(
        """
        import sgl_kernel
        assert not hasattr(sgl_kernel, "no_such_op_xyz")
        try:
            from sgl_kernel import no_such_op_xyz
        except ImportError as exc:
            print("IMPORT", exc)
        try:
            sgl_kernel.no_such_op_xyz
        except AttributeError as exc:
            print("ATTR", exc)
        """
    )
    proc = run_python(code, env={"WINPORT_SHIMS": "force"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("IMPORT sgl_kernel.no_such_op_xyz (upstream sglang-kernel")
    assert "has no winport shim yet" in lines[0]
    assert lines[1].startswith("ATTR sgl_kernel.no_such_op_xyz") and "has no winport shim yet" in lines[1]


def test_missing_submodule_is_named() -> None:
    proc = run_python("import deep_gemm.no_such_submodule", env={"WINPORT_SHIMS": "force"})
    assert proc.returncode != 0
    assert "deep_gemm.no_such_submodule (from sgl-deep-gemm) has no winport shim yet" in proc.stderr


def test_pth_file_is_installed_in_the_venv() -> None:
    pth = Path(sysconfig.get_paths()["purelib"]) / "winport_shims.pth"
    assert pth.exists(), "run `python -m winport install`: the shim .pth is missing"
    assert "winport._bootstrap" in pth.read_text()


def test_spawned_child_resolves_shims() -> None:
    # The parent never imports winport: only the .pth can have put the finder into the child.
    code = textwrap.dedent(
        """
        import multiprocessing as mp

        def child_name():
            import flash_mla
            return flash_mla.__name__

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            with ctx.Pool(1) as pool:
                print(pool.apply(child_name))
        """
    )
    proc = run_python(
        "import runpy, sys; sys.argv=['child.py']; runpy.run_path(sys.argv[0], run_name='__main__')",
        env={"WINPORT_SHIMS": "force"},
        cwd=_write(code),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "shims.flash_mla"


def _write(code: str) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="winport-spawn-"))
    (folder / "child.py").write_text(code)
    return folder


def test_prometheus_client_imports_under_windows_emulation() -> None:
    """SGLang's --enable-metrics imports prometheus_client, which calls resource.getpagesize() at
    import and falls back only on ImportError: the resource stand-in must answer it (it did not, and
    the server died at start under WINPORT_EMULATE_WINDOWS=1 on the H200, 2026-12-03)."""
    import mmap

    proc = run_python("import prometheus_client, resource; print(resource.__name__, resource.getpagesize())",
                      env={"WINPORT_EMULATE_WINDOWS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["shims.resource", str(mmap.PAGESIZE)], proc.stdout
