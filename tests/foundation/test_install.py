"""The installer: wheel repacking (SGLang's Windows route), dry run, pins and the Windows lock."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from winport import pins
from winport.install import installer, lock, wheels


def _platform_wheel(tmp_path: Path) -> Path:
    path = tmp_path / "demo_pkg-1.2.3-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo_pkg/__init__.py", "VALUE = 42\n")
        z.writestr("demo_pkg/fast.cpython-311-x86_64-linux-gnu.so", b"\x7fELF not really")
        z.writestr("demo_pkg/libx.so.1.2", b"\x7fELF")
        z.writestr("demo_pkg/configs/E=8,N=16,device_name=X.json", "{}")
        z.writestr("other_top/__init__.py", "")
        z.writestr("demo_pkg-1.2.3.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo_pkg\nVersion: 1.2.3\n")
        z.writestr("demo_pkg-1.2.3.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-manylinux_2_34_x86_64\n")
        z.writestr("demo_pkg-1.2.3.dist-info/RECORD", "stale\n")
    return path


def test_repack_pure_drops_binaries_and_installs(tmp_path: Path) -> None:
    src = _platform_wheel(tmp_path)
    out = wheels.repack_pure(src, tmp_path / "out")
    assert out.name == "demo_pkg-1.2.3-py3-none-any.whl"
    members = wheels.wheel_members(out)
    assert not [m for m in members if wheels.is_compiled(m)]
    assert "demo_pkg/configs/E=8,N=16,device_name=X.json" in members
    assert wheels.verify_record(out) == []
    wheel_text = wheels.read_member(out, "demo_pkg-1.2.3.dist-info/WHEEL").decode()
    assert "Tag: py3-none-any" in wheel_text and "Root-Is-Purelib: true" in wheel_text
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", str(target), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (target / "demo_pkg" / "configs" / "E=8,N=16,device_name=X.json").exists()
    assert not list(target.rglob("*.so*"))


def test_repack_subset_keeps_only_named_top_levels(tmp_path: Path) -> None:
    out = wheels.repack_subset(_platform_wheel(tmp_path), tmp_path / "out", ["demo_pkg"])
    members = wheels.wheel_members(out)
    assert not [m for m in members if m.startswith("other_top/")]
    assert "demo_pkg/fast.cpython-311-x86_64-linux-gnu.so" in members
    assert out.name.endswith("manylinux_2_34_x86_64.whl")
    assert wheels.verify_record(out) == []


def test_verify_record_detects_tampering(tmp_path: Path) -> None:
    out = wheels.repack_pure(_platform_wheel(tmp_path), tmp_path / "out")
    tampered = tmp_path / "tampered.whl"
    with zipfile.ZipFile(out) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info.filename, b"VALUE = 0\n" if info.filename == "demo_pkg/__init__.py" else data)
    assert any("demo_pkg/__init__.py" in p for p in wheels.verify_record(tampered))


def test_bad_wheel_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(wheels.WheelError, match="broken-1.0-py3-none-any.whl: not a readable wheel"):
        wheels.repack_pure(bad, tmp_path)


def test_installed_sglang_is_the_pure_repack() -> None:
    dist = importlib.metadata.distribution("sglang")
    assert dist.version == pins.SGLANG
    files = [str(f) for f in dist.files or []]
    assert files and not [f for f in files if wheels.is_compiled(f)]
    wheel_meta = dist.read_text("WHEEL") or ""
    assert "Tag: py3-none-any" in wheel_meta


def test_kt_kernel_does_not_bring_its_own_sgl_kernel() -> None:
    dist = importlib.metadata.distribution("kt-kernel")
    tops = {str(f).split("/", 1)[0] for f in dist.files or []}
    assert "sgl_kernel" not in tops and "deep_gemm" not in tops
    assert "kt_kernel" in tops


def test_dry_run_lists_every_step_and_changes_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    proc = subprocess.run([sys.executable, "-m", "winport", "install", "--dry-run", "--venv", str(venv),
                           "--cache", str(tmp_path / "cache")], capture_output=True, text=True, cwd=REPO_ROOT)
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the Linux installer insists on Python 3.11")
    assert proc.returncode == 0, proc.stderr
    for step in ("venv at", "torch", "SGLang's serving-path dependencies", "sglang 0.5.23", "kt-kernel",
                 "winport (editable)", "winport_shims.pth"):
        assert step in proc.stdout
    assert not venv.exists()


def test_lock_without_torch() -> None:
    text = "numpy==2.2.6\n    # via x\ntorch==2.14.1\ntorchvision==0.29.1\npyzmq==27\n"
    out = installer.lock_without_torch(text)
    assert "torch==" not in out and "torchvision" not in out and "numpy==2.2.6" in out


def test_windows_in_matches_pins() -> None:
    assert lock.WINDOWS_IN.read_text() == lock.windows_requirements(), "run `winport lock`"


def test_windows_lock_covers_pins() -> None:
    text = lock.WINDOWS_LOCK.read_text()
    for line in (f"torch=={pins.TORCH}", f"triton-windows=={pins.TRITON_WINDOWS}",
                 f"transformers=={pins.TRANSFORMERS}", f"gguf=={pins.GGUF}"):
        assert line in text
    assert "uvloop" not in text  # no Windows wheel; SGLang's import of it is patched


def test_windows_lock_still_resolves(tmp_path: Path) -> None:
    out = tmp_path / "windows.lock"
    proc = lock.compile_lock(lock.WINDOWS_IN, out)
    assert proc.returncode == 0, proc.stderr
    assert f"torch=={pins.TORCH}" in out.read_text()
