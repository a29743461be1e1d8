"""`winport doctor` and the command-line dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import run_python

WINPORT = [sys.executable, "-m", "winport"]


def test_doctor_reports_every_section() -> None:
    proc = subprocess.run([*WINPORT, "doctor"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for section in ("[system]", "[cpu]", "[gpu]", "[libraries]"):
        assert section in proc.stdout
    assert "kt-kernel variant" in proc.stdout
    assert "sgl_kernel" in proc.stdout and "winport shim" in proc.stdout


def test_doctor_json_agrees_with_cpuid() -> None:
    from winport.cpu_features import cpu_features, kt_kernel_variant

    proc = subprocess.run([*WINPORT, "doctor", "--json"], capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    cpu = {c["name"]: c["value"] for c in data["cpu"]}
    assert cpu["kt-kernel variant"] == kt_kernel_variant(cpu_features())
    libs = {c["name"]: c for c in data["libraries"]}
    assert libs["shim loader (.pth)"]["ok"] is True


def test_doctor_runs_under_windows_emulation() -> None:
    proc = run_python("from winport.doctor import main; raise SystemExit(main([]))",
                      env={"WINPORT_EMULATE_WINDOWS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "NUMA nodes" in proc.stdout


def test_cli_help_and_unknown_command() -> None:
    ok = subprocess.run([*WINPORT, "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "doctor" in ok.stdout and "serve" in ok.stdout
    bad = subprocess.run([*WINPORT, "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'frobnicate'" in bad.stderr


def test_console_script_is_installed() -> None:
    from pathlib import Path

    exe = Path(sys.executable).with_name("winport")
    assert exe.exists()
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
