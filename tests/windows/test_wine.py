"""The port's own code under Windows CPython 3.12 (Wine 8), with Windows wheels: the `wine` tier.

tests/windows/wine_harness.py provisions the interpreter (cached in .cache/wine/). What runs here:
  - the interpreter really is Windows CPython and imports the repository and the shim loader
  - `winport doctor`: Windows OS, and the cpuid ISA list of the Win64 machine-code stub equal to what
    the SysV stub and /proc/cpuinfo report on Linux for the same CPU
  - install.ps1's interpreter probe refusing an embeddable Python
  - the op-equivalence suite (tests/ops) on CPU, torch path and Triton's interpreter: a core part in
    every CI run, the whole suite in the slow tier
  - engram rows read through a memory map of the GGUF (tests/gguf/test_engram_rows.py) and served to
    SGLang from it (tests/patches/test_engram_rows_from_gguf.py)
  - `winport serve --demo` answering one chat completion over tcp
  - kt-kernel's package imported through winport's loader, up to the Windows binary it lacks
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.windows import pwsh, wine_harness, wine_progress_plugin

# Modules whose import the demo server and the op tests need.
SGLANG_MODULES_NEEDED = ("sglang", "sglang.srt.layers.moe.topk", "sglang.srt.managers.scheduler",
                         "sglang.srt.entrypoints.http_server")

# tests/ops files (passed as --ignore) or node ids (--deselect) that cannot run under Windows CPython
# here, with the reason. Remove an entry as soon as its reason is gone.
OPS_EXCLUDED: dict[str, str] = {
    "tests/ops/test_triton_compile.py": "compiles every kernel to CUDA cubins (ptxas): the output does not depend on "
    "the host OS, the Linux run of the same test covers it, and under Wine it would push this tier past its time "
    "limit (one kernel was compiled under Wine by hand: it works)",
}

# /proc/cpuinfo spells one of doctor's ISA names differently.
PROC_CPUINFO_NAME = {"avx512_vbmi": "avx512vbmi"}


@pytest.fixture(scope="module")
def windows_python() -> Iterator[wine_harness.Provisioned]:
    """Provisioned Windows CPython; missing Wine fails in CI (where it must exist) and skips elsewhere."""
    if wine_harness.find_wine() is None:
        message = "Wine is not installed (scripts/ci/apt-test-tools.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        done = wine_harness.provision(log=lambda line: print(line, flush=True))
    except wine_harness.HarnessError as exc:
        pytest.fail(f"provisioning Windows CPython failed: {exc}")
    yield done


def _check(proc: subprocess.CompletedProcess[str] | wine_harness.Watched, what: str) -> str:
    """stdout of a finished Windows process, or a failure showing its output."""
    out, err = proc.stdout, wine_harness.strip_wine_noise(proc.stderr)
    assert proc.returncode == 0, f"{what} exited {proc.returncode}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}"
    return out


@pytest.mark.wine
def test_windows_cpython_runs_the_repository(windows_python: wine_harness.Provisioned) -> None:
    code = (
        "import json, os, sys, platform, struct, winport, sgl_kernel\n"
        "print(json.dumps({'platform': sys.platform, 'system': platform.system(), 'bits': struct.calcsize('P') * 8,"
        " 'sep': os.sep, 'winport': winport.__file__, 'sgl_kernel': sgl_kernel.__name__}))\n"
    )
    info = json.loads(_check(wine_harness.run_python(["-c", code], timeout=300), "python -c").strip().splitlines()[-1])
    assert info["platform"] == "win32" and info["system"] == "Windows" and info["sep"] == "\\"
    assert info["bits"] == 64
    assert info["winport"].lower() == wine_harness.windows_path(REPO_ROOT / "winport" / "__init__.py").lower()
    assert info["sgl_kernel"] == "shims.sgl_kernel", "winport_shims.pth did not activate the shim loader"


@pytest.mark.wine
def test_kt_kernel_import_under_windows_goes_as_far_as_the_linux_wheel_allows(
        windows_python: wine_harness.Provisioned, tmp_path: Path) -> None:
    """kt-kernel's own package (the installed Linux wheel's files, extensions included) imported by
    Windows CPython through winport's loader: kt-kernel's `_cpu_detect` is patched (cpuid variant
    choice, Windows suffixes), the variant ladder is walked, and the import stops only at the binary
    a Windows build provides (a `.pyd`); the server then says kt-kernel cannot load and keeps the
    torch experts. Whether the `.pyd` itself loads and computes is what only a Windows build shows."""
    import importlib.util
    import shutil

    from winport.cpu_features import cpu_features, kt_kernel_variant

    spec = importlib.util.find_spec("kt_kernel")  # found, not imported: nothing of it runs on Linux here
    assert spec is not None and spec.submodule_search_locations, "kt-kernel is not installed"
    site = tmp_path / "site"
    shutil.copytree(next(iter(spec.submodule_search_locations)), site / "kt_kernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {wine_harness.windows_path(site)!r})\n"
        "from winport.ktkernel import loader\n"
        "out = {'hook': loader.is_installed()}\n"
        "try:\n"
        "    import kt_kernel\n"
        "    out['imported'] = True\n"
        "except ImportError as exc:\n"
        "    out['error'] = str(exc)\n"
        "cpu_detect = sys.modules.get('kt_kernel._cpu_detect')\n"
        "out['patched'] = bool(getattr(cpu_detect, '__winport_patched__', False))\n"
        "out['variant'] = cpu_detect.detect_cpu_features() if cpu_detect else None\n"
        "from winport.hybrid.serve_plan import expert_plan\n"
        "out['plan'] = expert_plan('cpu', 1, None, None).line\n"
        "print(json.dumps(out))\n"
    )
    proc = wine_harness.run_python(["-c", code], timeout=300)
    info = json.loads(_check(proc, "import kt_kernel under Windows CPython").strip().splitlines()[-1])
    assert info["hook"] and info["patched"], info
    assert "imported" not in info, "a Linux .so must not load into Windows CPython"
    assert info["variant"] == kt_kernel_variant(cpu_features()), info
    assert "no kt-kernel extension found" in info["error"] and ".pyd" in info["error"], info
    assert "build/ktkernel/make.py" in info["error"], info
    assert "kt-kernel cannot load" in info["plan"] and "torch W4A16" in info["plan"], info


def _linux_isa_from_proc_cpuinfo(names: list[str]) -> list[str]:
    text = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).split())  # type: ignore[union-attr]
    # Each name once: callers add names that may already be in the cpuid list (avx512_bf16 is, on a
    # CPU that has it), and the comparison is with that list.
    return [n for n in dict.fromkeys(names) if PROC_CPUINFO_NAME.get(n, n) in flags]


@pytest.mark.wine
def test_doctor_under_windows_matches_linux_cpuid(windows_python: wine_harness.Provisioned) -> None:
    """winport doctor on the Windows code path (Win64 cpuid stub via VirtualAlloc) vs Linux."""
    from winport.cpu_features import cpu_features, kt_kernel_variant

    proc = wine_harness.run_python(["-m", "winport", "doctor", "--json"], timeout=300)
    report = json.loads(_check(proc, "winport doctor --json"))
    checks = {(section, c["name"]): c for section, items in report.items() for c in items}

    assert checks[("system", "OS")]["value"].startswith("Windows "), checks[("system", "OS")]
    assert "AMD64" in checks[("system", "OS")]["value"]
    assert checks[("system", "Python")]["value"].startswith("3.12.")
    windows_isa = checks[("cpu", "ISA (cpuid)")]["value"].split()
    linux = cpu_features()
    assert windows_isa == linux.isa_list, "the Win64 cpuid stub disagrees with the SysV one"
    assert windows_isa == _linux_isa_from_proc_cpuinfo(linux.isa_list + ["avx512_bf16", "amx_tile"]), \
        "cpuid under Windows disagrees with the Linux kernel's /proc/cpuinfo"
    assert checks[("cpu", "model")]["value"] == f"{linux.brand} ({linux.vendor})"
    assert checks[("cpu", "kt-kernel variant")]["value"] == kt_kernel_variant(linux)
    amx = "enabled by the OS" if linux.amx_os_enabled else "not enabled"
    assert checks[("cpu", "AMX tile state")]["value"] == amx
    # Wine has no NUMA API beyond the highest node number: one node is the documented fallback.
    assert checks[("cpu", "NUMA nodes")]["value"] == "1"
    assert checks[("gpu", "Triton")]["value"].startswith("triton-windows ")
    assert checks[("libraries", "shim loader (.pth)")]["ok"] is True
    assert checks[("libraries", "sglang")]["ok"] is True


@pytest.mark.wine
def test_install_ps1_probe_refuses_the_embeddable_python(windows_python: wine_harness.Provisioned) -> None:
    """install.ps1 runs this probe on the chosen python.exe; an embeddable one must be refused."""
    code = pwsh.here_string((REPO_ROOT / "scripts" / "install.ps1").read_bytes(), "probe")
    info = json.loads(_check(wine_harness.run_python(["-c", code], timeout=300), "install.ps1 probe"))
    assert info["minor"] == 312 and info["bits"] == 64
    # the conditions install.ps1 refuses on: a ._pth next to python.exe, no include\ and libs\
    assert info["embeddable"] is True and info["headers"] is False and info["importlib"] is False
    assert info["executable"].lower().endswith("\\python.exe")


@pytest.mark.wine
@pytest.mark.slow
def test_sglang_imports_on_windows(windows_python: wine_harness.Provisioned) -> None:
    """SGLang (repacked pure-Python, as installed on Windows) imports what the server needs.

    The two Windows import failures this tier found (mmap.PROT_*, zmq.MAX_SOCKETS) are fixed by
    winport/platform/windows_compat.py, applied at interpreter start. Slow tier (about 75-190 s): in
    every CI run test_demo_server_answers_a_chat_completion imports these modules under Windows
    CPython too (its launcher and scheduler serve through them); this test names the module that
    fails, for when that one does.
    """
    # faulthandler dumps every thread's stack if the import hangs (see _run_watched); os._exit skips
    # interpreter teardown, which is not what this test is about.
    code = ("import faulthandler, importlib, os, sys\nfaulthandler.dump_traceback_later(200)\n"
            f"for m in {SGLANG_MODULES_NEEDED!r}:\n    importlib.import_module(m)\n"
            "print('ok')\nsys.stdout.flush()\nos._exit(0)")
    proc = _run_watched(["-c", code], what="importing SGLang's server modules", timeout=300)
    _check(proc, "importing SGLang's server modules")


def _run_watched(args: list[str], *, what: str, timeout: float, stall: float | None = None,
                 env: dict[str, str] | None = None) -> wine_harness.Watched:
    """Run Windows CPython; after a hang or a native crash (WINE_WORKAROUNDS["watchdog"]) warn with its
    output and run it once more. A second one fails with both outputs; any other failure is the
    caller's to judge."""
    first = wine_harness.run_python_watched(args, env=env, timeout=timeout, stall=stall)
    if first.hung is None and not _native_crash(first):
        return first
    why = first.hung or f"native crash, exit {first.returncode}"
    report = f"{what}: Windows CPython under Wine: {why}; ran it again.\n{_hang_excerpt(first)}"
    warnings.warn(report, stacklevel=2)
    second = wine_harness.run_python_watched(args, env=env, timeout=timeout, stall=stall)
    assert second.hung is None and not _native_crash(second), (
        f"{report}\n\nand again ({second.hung or f'exit {second.returncode}'}):\n{_hang_excerpt(second)}")
    return second


def _native_crash(run: wine_harness.Watched) -> bool:
    """A Windows process that died of an unhandled native exception (not a Python error)."""
    return run.returncode not in (None, 0) and ("Windows fatal exception" in run.stderr or "Unhandled" in run.stderr)


def _hang_excerpt(run: wine_harness.Watched) -> str:
    """The parts of a hung run's output that locate the hang: the stdout tail, faulthandler's report
    of a Windows exception, and the head of its stack dump (the test's own frames come first)."""
    err = wine_harness.strip_wine_noise(run.stderr)
    parts = [f"stdout tail:\n{run.stdout[-1500:]}"]
    for marker in ("Windows fatal exception", "Unhandled", "Timeout ("):
        at = err.find(marker)
        if at >= 0:
            parts.append(f"stderr from {marker!r}:\n{err[at:at + 2500]}")
    parts.append(f"stderr tail:\n{err[-1500:]}")
    return "\n".join(parts)


@pytest.mark.wine
def test_watchdog_ends_a_silent_run(windows_python: wine_harness.Provisioned) -> None:
    """run_python_watched ends a Windows process whose stdout went silent, and keeps what it printed."""
    start = time.monotonic()
    got = wine_harness.run_python_watched(
        ["-c", "import time\nprint('before the hang', flush=True)\ntime.sleep(600)"], timeout=120, stall=15)
    assert got.hung is not None and "no output for 15 s" in got.hung
    assert "before the hang" in got.stdout and got.returncode is None
    assert time.monotonic() - start < 90
    done = wine_harness.run_python_watched(["-c", "print('fine')"], timeout=120, stall=60)
    assert done.hung is None and done.returncode == 0 and "fine" in done.stdout


@dataclass
class _OpsRun:
    """One Windows CPython process of the op suite: its output and what the progress file recorded."""

    proc: wine_harness.Watched
    outcomes: dict[str, str]  # node id -> PASSED / FAILED / SKIPPED (last phase report that decides)
    started: list[str]  # node ids in start order
    end_status: int | None  # pytest's exit status, None when the process never reached the end

    @property
    def died_in(self) -> str | None:
        """The test the process was running when it crashed or hung (None: it ended normally)."""
        if self.end_status is not None or not self.started:
            return None
        return self.started[-1]


def _run_ops(args: list[str], env: dict[str, str], progress: Path, timeout: float, stall: float) -> _OpsRun:
    progress.unlink(missing_ok=True)
    env = {**env, wine_progress_plugin.PROGRESS_ENV: wine_harness.windows_path(progress)}
    proc = wine_harness.run_python_watched(args, env=env, timeout=timeout, stall=stall)
    outcomes: dict[str, str] = {}
    started: list[str] = []
    end: int | None = None
    for line in progress.read_text(encoding="utf-8").splitlines() if progress.exists() else []:
        word, _, rest = line.partition(" ")
        if word == "START":
            started.append(rest)
        elif word == "END":
            end = int(rest)
        else:
            outcomes[rest] = "FAILED" if outcomes.get(rest) == "FAILED" else word
    return _OpsRun(proc, outcomes, started, end)


def _run_resumable(args: list[str], env: dict[str, str], workdir: Path, what: str, *, timeout: float = 900,
                   stall: float = 300, rerun_env: dict[str, str] | None = None) -> tuple[list[_OpsRun], dict[str, str]]:
    """Run pytest under Windows CPython (args must load tests.windows.wine_progress_plugin). If the
    process dies or hangs inside a test, warn with its output and run once more from that test on in
    a fresh process (WINE_WORKAROUNDS["resume after a crash (ops)"]); a second death fails. Returns
    the runs and every test's outcome (a rerun's verdict wins). ``rerun_env`` is added for the rerun."""
    first = _run_ops(args, env, workdir / "progress-1.txt", timeout, stall)
    runs = [first]
    if first.died_in is not None:
        report = (f"{what}: Windows CPython died in {first.died_in} "
                  f"({first.proc.hung or f'exit {first.proc.returncode}'}); running again from that test"
                  f"{f' with {rerun_env}' if rerun_env else ''}.\n"
                  f"{_hang_excerpt(first.proc)}")
        warnings.warn(report, stacklevel=2)
        second = _run_ops(args, {**env, **(rerun_env or {}), wine_progress_plugin.RESUME_ENV: first.died_in},
                          workdir / "progress-2.txt", timeout, stall)
        assert second.died_in is None, (f"{report}\n\nand again, in {second.died_in} "
                                        f"({second.proc.hung or second.proc.returncode}):\n{_hang_excerpt(second.proc)}")
        runs.append(second)
    last = runs[-1]
    assert last.end_status is not None, f"{what}: no pytest session end recorded\n{_hang_excerpt(last.proc)}"
    return runs, {k: v for run in runs for k, v in run.outcomes.items()}


def test_native_crash_is_told_from_a_python_error() -> None:
    """Only an unhandled native exception counts as a crash worth a rerun, not a failing script."""
    fault = "Windows fatal exception: access violation\n\nCurrent thread 0x0330 (most recent call first):\n"
    assert _native_crash(wine_harness.Watched(5, "", fault + "wine: Unhandled page fault on read access", None))
    assert not _native_crash(wine_harness.Watched(1, "", "Traceback ...\nValueError: bad", None))
    assert not _native_crash(wine_harness.Watched(0, "", fault, None))  # a handled first-chance report
    assert not _native_crash(wine_harness.Watched(None, "", fault, "no output for 300 s"))  # a hang, not a crash


@pytest.mark.wine
def test_a_crashed_test_is_rerun_in_a_fresh_process(windows_python: wine_harness.Provisioned,
                                                     tmp_path: Path) -> None:
    """The crash bookkeeping itself: a native access violation ends the Windows process at once
    (no winedbg), the progress file names the test it died in, and the rerun starts from that test,
    so the tests before it run once and the ones after it run too."""
    marker = tmp_path / "crashed-once"
    (tmp_path / "test_crash_once.py").write_text(
        "import faulthandler, pathlib\n"
        "def test_before():\n    pass\n"
        f"def test_crash():\n    m = pathlib.Path(r'{wine_harness.windows_path(marker)}')\n"
        "    if m.is_dir() or not m.exists():  # a directory: crash every time\n"
        "        if not m.exists():\n            m.write_text('x')\n        faulthandler._read_null()\n"
        "def test_after():\n    pass\n")
    # Its own rootdir and (empty) ini: with the repository's, pytest walks up from the file and stats
    # whatever else lies in /tmp (in CI an unreadable entry there failed the collection).
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    args = ["-m", "pytest", wine_harness.windows_path(tmp_path / "test_crash_once.py"), "-q", "-p", "no:cacheprovider",
            "-c", wine_harness.windows_path(tmp_path / "pytest.ini"), "--rootdir", wine_harness.windows_path(tmp_path),
            "-p", "tests.windows.wine_progress_plugin"]
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"died in .*test_crash .*running again from that test"):
        runs, outcomes = _run_resumable(args, {}, tmp_path, "crash-once suite", timeout=300, stall=120)
    assert time.monotonic() - start < 240, "the crash was not a prompt exit"
    assert len(runs) == 2 and runs[0].proc.hung is None, "the crashed process should end by itself"
    assert "Unhandled page fault" in wine_harness.strip_wine_noise(runs[0].proc.stderr)
    assert _native_crash(runs[0].proc) and not _native_crash(runs[1].proc)
    assert [n.split("::")[1] for n in runs[0].started] == ["test_before", "test_crash"]
    assert [n.split("::")[1] for n in runs[1].started] == ["test_crash", "test_after"]
    assert sorted((n.split("::")[1], o) for n, o in outcomes.items()) == [
        ("test_after", "PASSED"), ("test_before", "PASSED"), ("test_crash", "PASSED")]
    marker.unlink()
    marker.mkdir()
    with pytest.raises(AssertionError, match="and again, in .*test_crash"), pytest.warns(UserWarning):
        _run_resumable(args, {}, tmp_path, "crash-always suite", timeout=300, stall=120)


# The part of tests/ops run under Windows CPython in every CI run: the number formats against
# gguf-py and float64, the KV layout, and torch references and interpreted Triton kernels of several
# families (activation, norm, quant, rope, sampling, routing, attention-state merge, bitmask), plus
# the shim and dispatch checks; about 2 minutes under Wine. The whole suite takes about 9 minutes there
# (540 s on the 2-core dev VM, 2026-12-02) and runs in the slow tier (test_ops_suite_on_windows_cpu).
OPS_CORE = ("tests/ops/test_formats.py", "tests/ops/test_ggml.py", "tests/ops/test_dsv4_kv.py",
            "tests/ops/test_activation.py", "tests/ops/test_norm.py", "tests/ops/test_quant.py",
            "tests/ops/test_rotary.py", "tests/ops/test_sampling.py", "tests/ops/test_moe_routing.py",
            "tests/ops/test_merge_state.py", "tests/ops/test_bitmask.py", "tests/ops/test_dispatch.py",
            "tests/ops/test_shim_coverage.py")


def _ops_under_windows(paths: tuple[str, ...], tmp_path: Path) -> None:
    """Run `paths` (tests/ops files or the folder) on CPU under Windows CPython: torch references and
    Triton kernels in the interpreter. A process that dies or hangs inside a test runs once more from
    that test on (_run_resumable); every collected test must then have passed or been skipped with a
    reason."""
    # faulthandler_timeout: a test running 240 s (the longest takes ~90 s here) dumps every thread's
    # stack to stderr, before the 300 s silence that ends the run (run_python_watched).
    args = ["-m", "pytest", *paths, "-m", "not gpu", "-q", "-p", "no:cacheprovider", "-x",
            "-p", "tests.windows.wine_pytest_plugin", "-p", "tests.windows.wine_progress_plugin",
            "-rs", "--durations=5", "-o", "faulthandler_timeout=240"]
    for node in OPS_EXCLUDED:
        args += ["--deselect" if "::" in node else "--ignore", node]
    start = time.monotonic()
    env = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}  # WINE_WORKAROUNDS["OMP_NUM_THREADS=1 (ops)"]
    # The one crash seen sat in torch's own CPU kernels; a rerun also takes torch off its AVX-512
    # kernels (the other difference from the Linux run that could not be ruled out), and says so.
    runs, outcomes = _run_resumable(args, env, tmp_path, "pytest tests/ops under Windows CPython",
                                    rerun_env={"ATEN_CPU_CAPABILITY": "avx2"})
    last = runs[-1]
    summary = [line for line in last.proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    counts = {o: sum(v == o for v in outcomes.values()) for o in ("PASSED", "FAILED", "SKIPPED")}
    print(f"{' '.join(paths)} under Wine in {time.monotonic() - start:.0f} s, {len(runs)} process(es): {counts}; "
          f"last: {summary[-1] if summary else 'no summary'}")
    print("\n".join(line for run in runs for line in run.proc.stdout.splitlines() if line.startswith("SKIPPED")))
    assert last.end_status != 5 and counts["PASSED"], "pytest under Windows collected no ops tests"
    _check(last.proc, "pytest tests/ops under Windows CPython")
    failed = sorted(k for k, v in outcomes.items() if v == "FAILED")
    assert not failed, f"failed under Windows CPython: {failed}"


@pytest.mark.wine
def test_ops_core_on_windows_cpu(windows_python: wine_harness.Provisioned, tmp_path: Path) -> None:
    """OPS_CORE under Windows CPython (every CI run)."""
    assert all((REPO_ROOT / p).is_file() for p in OPS_CORE)
    _ops_under_windows(OPS_CORE, tmp_path)


@pytest.mark.wine
@pytest.mark.slow
def test_ops_suite_on_windows_cpu(windows_python: wine_harness.Provisioned, tmp_path: Path) -> None:
    """All of tests/ops under Windows CPython (slow tier: about 9 minutes under Wine)."""
    _ops_under_windows(("tests/ops",), tmp_path)


ENGRAM_TESTS = ("tests/gguf/test_engram_rows.py", "tests/patches/test_engram_rows_from_gguf.py")


@pytest.mark.wine
def test_engram_rows_from_the_gguf_map_on_windows(windows_python: wine_harness.Provisioned) -> None:
    """Engram rows gathered through a read-only memory map of the GGUF (winport.gguf.engram_rows and
    its SGLang patch) under Windows CPython, where mmap offsets must sit on 64 KiB boundaries."""
    proc = _run_watched(["-m", "pytest", *ENGRAM_TESTS, "-q", "-p", "no:cacheprovider"],
                        what="pytest of the engram-row tests under Windows CPython", timeout=600, stall=400)
    out = _check(proc, "pytest of the engram-row tests under Windows CPython")
    # Every test the modules have on Linux must have run and passed under Windows.
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *ENGRAM_TESTS], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    n = sum("::" in line for line in listed.stdout.splitlines())
    assert n >= 10, listed.stdout[-2000:]
    assert re.search(rf"\b{n} passed\b", out) and "skipped" not in out, (n, out[-2000:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: dict[str, object] | None = None, timeout: float = 10) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


@pytest.mark.wine
def test_demo_server_answers_a_chat_completion(windows_python: wine_harness.Provisioned) -> None:
    """`winport serve --demo` under Windows CPython answers over tcp on the loopback interface."""
    port = _free_port()
    proc = wine_harness.start_python(["-m", "winport", "serve", "--demo", "--device", "cpu",
                                      "--host", "127.0.0.1", "--port", str(port)])
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        # Wine + torch import + SGLang start on 2 cores: 480 s was enough until 2026-11-29; on
        # 2026-11-30 a quiet run of this test alone reached SGLang's "Tree cache initialized" (seconds
        # before ready) at 480 s, so the wait is 720 s. A start that never finishes still fails.
        deadline = time.monotonic() + 720
        models: dict[str, object] | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                models = _request(f"{base}/v1/models", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(3)
        tail = wine_harness.strip_wine_noise("".join(output))[-4000:]
        assert models is not None, f"server never answered /v1/models (exit {proc.poll()}):\n{tail}"
        model_id = models["data"][0]["id"]  # type: ignore[index]
        try:
            reply = _request(f"{base}/v1/chat/completions", {
                "model": model_id, "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 8, "temperature": 0,
            }, timeout=300)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            # The server's own words say why (a CI run of 2026-12-02 saw only "Remote end closed").
            time.sleep(5)
            tail = wine_harness.strip_wine_noise("".join(output))[-6000:]
            raise AssertionError(f"chat completion failed ({exc!r}; server exit {proc.poll()}):\n{tail}") from exc
        message = reply["choices"][0]["message"]  # type: ignore[index]
        assert isinstance(message["content"], str) and message["role"] == "assistant"
        assert reply["usage"]["completion_tokens"] >= 1  # type: ignore[index]
    finally:
        wine_harness.stop_python(proc)


PRODUCT_DIRS = ("winport", "shims", "kernels_triton")
# Markers of the harness's Wine workarounds; none may appear in shipped code.
WORKAROUND_MARKERS = ("_wmi.pyd", "bcryptprimitives", "WINEPREFIX", "msvc_runtime", "crealf")


def test_wine_workarounds_stay_in_the_harness() -> None:
    """Real Windows needs none of WINE_WORKAROUNDS, so the product must not carry them."""
    offenders = []
    for folder in PRODUCT_DIRS:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            text = path.read_text(errors="replace")
            offenders += [f"{path.relative_to(REPO_ROOT)}: {m}" for m in WORKAROUND_MARKERS if m in text]
    assert offenders == []
    assert len(wine_harness.WINE_WORKAROUNDS) >= 6
