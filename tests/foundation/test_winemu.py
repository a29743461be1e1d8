"""WINPORT_EMULATE_WINDOWS=1 makes Linux refuse what Windows lacks."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_python
from winport import winemu

EMULATE = {"WINPORT_EMULATE_WINDOWS": "1"}


@pytest.mark.parametrize("name", ["fcntl", "resource"])
def test_posix_modules_are_replaced_by_windows_standins(name: str) -> None:
    # Windows has neither; SGLang imports both unconditionally, so winport's stand-in answers.
    # A built-in module has no __file__ (Debian's python3.11 builds fcntl in).
    code = f"import {name}; print({name}.__name__, getattr({name}, '__file__', '(built in)'))"
    emulated = run_python(code, env=EMULATE)
    assert emulated.returncode == 0, emulated.stderr
    assert emulated.stdout.split()[0] == f"shims.{name}"
    real = run_python(code)
    assert real.stdout.split()[0] == name  # the test can fail: Linux has the real module


def test_standins_expose_only_what_they_implement() -> None:
    code = textwrap.dedent(
        """
        import fcntl, resource, tempfile
        print(resource.getrlimit(resource.RLIMIT_NOFILE))
        with tempfile.TemporaryFile() as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print("second lock refused")
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        print(hasattr(fcntl, "ioctl"))
        """
    )
    proc = run_python(code, env=EMULATE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["(-1, -1)", "second lock refused", "False"]


@pytest.mark.parametrize("name", ["flash_attn", "deep_ep", "cutlass", "torch_memory_saver"])
def test_linux_only_packages_are_unimportable_even_when_installed(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    env = {"PYTHONPATH": str(tmp_path)}
    assert run_python(f"import {name}", env=env).returncode == 0
    proc = run_python(f"import importlib.util; print(importlib.util.find_spec('{name}')); import {name}",
                      env={**env, **EMULATE})
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
    assert proc.stdout.strip() == "None"  # probes (find_spec) see it missing too


@pytest.mark.parametrize("name", ["sgl_kernel", "uvloop"])
def test_real_linux_only_library_is_replaced_by_its_shim(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    code = f"import {name}; print({name}.__name__)"
    env = {"PYTHONPATH": str(tmp_path)}
    assert run_python(code, env=env).stdout.strip() == name
    assert run_python(code, env={**env, **EMULATE}).stdout.strip() == f"shims.{name}"


def test_nccl_is_unavailable() -> None:
    code = "import torch.distributed as d; print(d.is_nccl_available())"
    assert run_python(code).stdout.strip() == "True"  # this Linux torch build has NCCL
    assert run_python(code, env=EMULATE).stdout.strip() == "False"
    proc = run_python("import ctypes; ctypes.CDLL('libnccl.so.2')", env=EMULATE)
    assert "cannot load 'libnccl.so.2' on Windows" in proc.stderr


def test_zmq_rejects_ipc_and_accepts_tcp() -> None:
    code = textwrap.dedent(
        """
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        print("tcp ok", port > 0)
        try:
            s.bind("ipc:///tmp/winport-test-ipc")
            print("ipc bound")
        except OSError as exc:
            print("ipc refused:", exc)
        """
    )
    emulated = run_python(code, env=EMULATE)
    assert emulated.returncode == 0, emulated.stderr
    assert "tcp ok True" in emulated.stdout
    assert "ipc refused: zmq endpoint 'ipc:///tmp/winport-test-ipc' uses ipc://" in emulated.stdout
    assert "ipc bound" in run_python(code).stdout


def test_async_zmq_sockets_are_guarded_too() -> None:
    code = "import zmq.asyncio as za; s = za.Context().socket(1); s.connect('ipc:///tmp/x')"
    proc = run_python(code, env=EMULATE)
    assert "WindowsEmulationError" in proc.stderr


def test_process_functions_and_signals_are_gone() -> None:
    code = textwrap.dedent(
        """
        import os, signal, multiprocessing
        print([n for n in ("fork", "killpg", "setsid") if hasattr(os, n)])
        print(hasattr(signal, "SIGQUIT"), hasattr(signal, "SIGTERM"), hasattr(signal, "SIGINT"))
        print(multiprocessing.get_start_method())
        """
    )
    out = run_python(code, env=EMULATE).stdout.splitlines()
    assert out == ["[]", "False True True", "spawn"]
    normal = run_python(code).stdout.splitlines()
    assert normal[0] != "[]"


def test_submodules_of_blocked_packages_are_refused(tmp_path: Path) -> None:
    (tmp_path / "deep_ep").mkdir()
    (tmp_path / "deep_ep" / "__init__.py").write_text("")
    (tmp_path / "deep_ep" / "sub.py").write_text("")
    proc = run_python("import deep_ep.sub", env={"PYTHONPATH": str(tmp_path), **EMULATE})
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_check_zmq_endpoint_unit() -> None:
    winemu.check_zmq_endpoint("tcp://127.0.0.1:5555")
    with pytest.raises(winemu.WindowsEmulationError, match="ipc://"):
        winemu.check_zmq_endpoint(b"ipc:///tmp/sock")
