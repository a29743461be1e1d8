"""`python -m winport install`: create .venv at the repository root and install the port into it.

One installer for both systems (scripts/install.sh and scripts/install.ps1 only find a Python and
call this). Steps, each idempotent and each printed before it runs:
  1. venv      .venv with the running interpreter
  2. torch     Linux: torch/torchvision from PyPI or this machine's wheel store (CPU or CUDA build);
               Windows: the CUDA build from the PyTorch index
  3. triton    triton (Linux) / triton-windows (Windows)
  4. deps      SGLang's dependencies on our serving path (pins.SERVING_DEPS), or on Windows the
               locked set in requirements/windows.lock
  5. sglang    the manylinux wheel repacked as py3-none-any without its compiled files
               (winport.install.wheels.repack_pure), installed with --no-deps
  6. kt-kernel Linux: the PyPI wheel reduced to kt_kernel itself; Windows: the .pyd build from
               build/ktkernel (python build/ktkernel/make.py), else a clear note
  7. winport   this repository in editable mode (+ test tools with --dev)
  8. shims     winport_shims.pth, so every interpreter of the venv (spawned children too) resolves
               the Linux-only kernel libraries to winport's shims
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

from winport import pins
from winport.install import wheels

REPO_ROOT = Path(__file__).resolve().parents[2]
PTH_NAME = "winport_shims.pth"
PTH_LINE = "import winport._bootstrap; winport._bootstrap.activate()\n"
WINDOWS_LOCK = REPO_ROOT / "requirements" / "windows.lock"
SGLANG_WHEEL_PLATFORM = "manylinux_2_34_x86_64"
KT_KERNEL_KEEP = ("kt_kernel", "kt_kernel.libs")


class InstallError(RuntimeError):
    """An install step failed; the message says which and what to do."""


class Installer:
    """Runs (or, with dry_run, prints) the install steps."""

    def __init__(self, venv: Path, *, dev: bool, dry_run: bool, is_windows: bool, cache: Path,
                 kt_source: Path | None = None):
        self.kt_source = kt_source
        self.venv = venv
        self.dev = dev
        self.dry_run = dry_run
        self.is_windows = is_windows
        self.cache = cache

    # -- helpers -------------------------------------------------------------------------
    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        if self.is_windows:
            return self.venv / "Scripts" / "python.exe"
        return self.venv / "bin" / "python"

    def step(self, title: str) -> None:
        """Announce a step."""
        print(f"==> {title}", flush=True)

    def run(self, cmd: list[str]) -> None:
        """Run a command (or print it in dry-run mode); raise InstallError on failure."""
        print("    $ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
        if self.dry_run:
            return
        proc = subprocess.run([str(c) for c in cmd])
        if proc.returncode != 0:
            raise InstallError(f"command failed with exit code {proc.returncode}: {' '.join(map(str, cmd))}")

    def pip(self, *args: str) -> None:
        """pip inside the venv."""
        self.run([str(self.python), "-m", "pip", "--disable-pip-version-check", *args])

    # -- steps ---------------------------------------------------------------------------
    def make_venv(self) -> None:
        """Step 1."""
        self.step(f"venv at {self.venv}")
        if self.python.exists():
            print("    exists, reused")
            return
        self.run([sys.executable, "-m", "venv", str(self.venv)])
        self.pip("install", "-q", "--upgrade", "pip")

    def install_torch_triton(self) -> None:
        """Steps 2 and 3."""
        self.step(f"torch {pins.TORCH}, torchvision {pins.TORCHVISION}, Triton")
        if self.is_windows:
            self.pip("install", "-q", f"torch=={pins.TORCH}", f"torchvision=={pins.TORCHVISION}",
                     "--index-url", pins.TORCH_WINDOWS_INDEX)
            self.pip("install", "-q", f"triton-windows=={pins.TRITON_WINDOWS}")
        else:
            self.pip("install", "-q", f"torch=={pins.TORCH}", f"torchvision=={pins.TORCHVISION}",
                     f"triton=={pins.TRITON_LINUX}")

    def install_deps(self) -> None:
        """Step 4."""
        self.step("SGLang's serving-path dependencies")
        if self.is_windows:
            if not WINDOWS_LOCK.exists():
                raise InstallError(f"{WINDOWS_LOCK} is missing; run `winport lock` on a machine with uv")
            reqs = self.cache / "windows-lock-without-torch.txt"
            if not self.dry_run:
                self.cache.mkdir(parents=True, exist_ok=True)
                reqs.write_text(lock_without_torch(WINDOWS_LOCK.read_text()))
            self.pip("install", "-q", "--no-deps", "-r", str(reqs))
        else:
            self.pip("install", "-q", *pins.SERVING_DEPS)

    def download(self, requirement: str, *, platform: str | None = None) -> Path:
        """Fetch one wheel into the cache (no dependencies) and return its path."""
        dest = self.cache / "upstream"
        name = requirement.split("==")[0].replace("-", "_")
        cmd = ["download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest), requirement]
        if platform:
            cmd += ["--platform", platform, "--python-version", pins.PYTHON_LINUX, "--implementation", "cp"]
        existing = sorted(dest.glob(f"{name}-{requirement.split('==')[1]}-*.whl")) if dest.exists() else []
        if existing:
            print(f"    cached: {existing[0].name}")
            return existing[0]
        self.pip(*cmd)
        if self.dry_run:
            return dest / f"{name}-DRYRUN.whl"
        found = sorted(dest.glob(f"{name}-*.whl"))
        if not found:
            raise InstallError(f"pip download {requirement} produced no wheel in {dest}")
        return found[-1]

    def install_sglang(self) -> None:
        """Step 5."""
        self.step(f"sglang {pins.SGLANG} (pure-Python repack of the manylinux wheel)")
        wheel = self.download(f"sglang=={pins.SGLANG}", platform=SGLANG_WHEEL_PLATFORM)
        if self.dry_run:
            print(f"    would repack {wheel.name} as py3-none-any without compiled files")
            return
        pure = wheels.repack_pure(wheel, self.cache / "repacked")
        print(f"    repacked -> {pure.name}")
        self.pip("install", "-q", "--no-deps", "--force-reinstall", str(pure))

    def install_kt_kernel(self) -> None:
        """Step 6."""
        self.step(f"kt-kernel {pins.KT_KERNEL}")
        if self.is_windows:
            if self.kt_source is None:
                print("    Windows: no kt-kernel source given (--kt-source DIR, a ktransformers checkout at "
                      f"v{pins.KT_KERNEL}); skipped, CPU experts use the torch path. build/README.md explains")
                return
            make = [str(self.python), str(REPO_ROOT / "build" / "ktkernel" / "make.py"), "--source", str(self.kt_source)]
            self.run(make + (["--dry-run"] if self.dry_run else []))
            self.pip("install", "-q", *pins.KT_KERNEL_DEPS)
            return
        wheel = self.download(f"kt-kernel=={pins.KT_KERNEL}")
        if self.dry_run:
            return
        slim = wheels.repack_subset(wheel, self.cache / "repacked", KT_KERNEL_KEEP)
        print(f"    kept only {', '.join(KT_KERNEL_KEEP)} (the wheel's own sgl_kernel/deep_gemm would shadow the shims)")
        self.pip("install", "-q", "--no-deps", "--force-reinstall", str(slim))
        self.pip("install", "-q", *pins.KT_KERNEL_DEPS)

    def install_project(self) -> None:
        """Step 7."""
        self.step("winport (editable)" + (" + test tools" if self.dev else ""))
        self.pip("install", "-q", "--no-deps", "--no-build-isolation", "-e", str(REPO_ROOT))
        if self.dev:
            self.pip("install", "-q", *pins.DEV_DEPS)
            if not self.is_windows:
                self.pip("install", "-q", "--upgrade", "--no-deps", "--target", str(self.venv / pins.TEST_EXTRAS_DIR),
                         *pins.LINUX_DEV_DEPS)

    def install_pth(self) -> None:
        """Step 8."""
        self.step(f"shim loader ({PTH_NAME})")
        if self.dry_run:
            print("    would write it into the venv's site-packages")
            return
        out = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        )
        target = Path(out.stdout.strip()) / PTH_NAME
        target.write_text(PTH_LINE)
        print(f"    wrote {target}")

    def verify(self) -> None:
        """Import the stack once inside the venv."""
        self.step("check")
        self.run([str(self.python), "-c",
                  "import torch, triton, sglang, winport, sgl_kernel; "
                  "print('    torch', torch.__version__, '| triton', triton.__version__, "
                  "'| sglang', sglang.__version__, '| sgl_kernel ->', sgl_kernel.__name__)"])

    def all(self) -> None:
        """Every step in order."""
        self.make_venv()
        self.install_torch_triton()
        self.install_deps()
        self.install_sglang()
        self.install_kt_kernel()
        self.install_project()
        self.install_pth()
        self.verify()


def lock_without_torch(lock_text: str) -> str:
    """The Windows lock minus torch/torchvision (those come from the PyTorch CUDA index)."""
    kept = []
    for line in lock_text.splitlines():
        name = line.strip().split("==")[0].strip().lower()
        if name in {"torch", "torchvision"}:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m winport install`."""
    ap = argparse.ArgumentParser(prog="winport install", description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=REPO_ROOT / ".venv", help="venv folder (default: .venv)")
    ap.add_argument("--dev", action="store_true", help="also install the test tools")
    ap.add_argument("--dry-run", action="store_true", help="print the steps and commands, change nothing")
    ap.add_argument("--kt-source", type=Path, default=None,
                    help="Windows: kt-kernel source tree to build with clang-cl (build/ktkernel/make.py)")
    ap.add_argument("--cache", type=Path, default=REPO_ROOT / ".cache" / "install",
                    help="where downloaded and repacked wheels are kept")
    args = ap.parse_args(argv)
    is_windows = sys.platform == "win32"
    lo, hi = pins.PYTHON_WINDOWS_RANGE
    version = sys.version_info[:2]
    if is_windows and not (lo <= version <= hi):
        print(f"winport install: Python {version[0]}.{version[1]} is not supported on Windows "
              f"(need {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]} from python.org)", file=sys.stderr)
        return 2
    if not is_windows and version != tuple(int(x) for x in pins.PYTHON_LINUX.split(".")):
        print(f"winport install: on Linux use Python {pins.PYTHON_LINUX} (the torch wheels here are "
              f"cp311); this is {version[0]}.{version[1]}", file=sys.stderr)
        return 2
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        print("winport install: free-threaded Python is not supported", file=sys.stderr)
        return 2
    inst = Installer(args.venv.resolve(), dev=args.dev, dry_run=args.dry_run, is_windows=is_windows,
                     cache=args.cache.resolve(), kt_source=args.kt_source)
    try:
        inst.all()
    except InstallError as exc:
        print(f"winport install: {exc}", file=sys.stderr)
        return 1
    activate = r".venv\Scripts\Activate.ps1" if is_windows else "source .venv/bin/activate"
    print("==> dry run: nothing was changed" if args.dry_run else f"==> done. Activate with: {activate}")
    return 0
