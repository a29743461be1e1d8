"""Build kt-kernel 0.7.2 for Windows (every CPU variant, as .pyd) and install it into the venv.

    python build/ktkernel/make.py --source C:\\src\\ktransformers --hwloc C:\\deps\\hwloc --fmt C:\\deps\\fmt

Run it from a Visual Studio "Developer PowerShell for x64" (clang-cl needs the MSVC headers and
libraries) with LLVM, CMake, Ninja and the CUDA toolkit installed (build/README.md lists where to get
each). kt-kernel's sources are used unmodified: the compat layer is force-included and the build is
steered through build/ktkernel/cmake/initial-cache.cmake. `--dry-run` prints the commands only and
works on any OS (the tests use it).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
CMAKE_DIR = HERE / "cmake"
COMPAT_DIR = HERE / "compat"
VARIANTS = ("avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx")
KT_VERSION = "0.7.2"


def kt_kernel_dir(source: Path) -> Path:
    """The kt-kernel folder inside a ktransformers checkout (or `source` itself if it is one)."""
    for cand in (source / "kt-kernel", source):
        if (cand / "CMakeLists.txt").is_file() and (cand / "python").is_dir():
            return cand
    raise SystemExit(f"{source}: no kt-kernel source tree (expected kt-kernel/CMakeLists.txt and python/)")


def source_version(kt_dir: Path) -> str | None:
    """kt-kernel's version from the checkout's version.py, if there is one."""
    for cand in (kt_dir.parent / "version.py", kt_dir / "version.py"):
        if cand.is_file():
            m = re.search(r"""__version__\s*=\s*["']([^"']+)""", cand.read_text(encoding="utf-8"))
            if m:
                return m.group(1)
    return None


def cmake_configure_cmd(args: argparse.Namespace, kt_dir: Path, variant: str, build_dir: Path,
                        compat_lib: Path) -> list[str]:
    """The cmake configure command of one variant (-D values before -C, as the cache reads them)."""
    extra = []
    if args.fmt:
        extra.append(f'/I"{Path(args.fmt) / "include"}"')
    cmd = [
        "cmake", "-G", "Ninja", "-S", str(kt_dir), "-B", str(build_dir),
        f"-DKTWIN_VARIANT={variant}",
        f"-DKTWIN_COMPAT_LIB={compat_lib}",
        f"-DKTWIN_EXTRA_CXX_FLAGS={' '.join(extra)}",
    ]
    if args.llvm:
        cmd.append(f"-DKTWIN_LLVM_DIR={args.llvm}")
    cmd += [
        "-C", str(CMAKE_DIR / "initial-cache.cmake"),
        f"-DCMAKE_TOOLCHAIN_FILE={CMAKE_DIR / 'clang-cl-toolchain.cmake'}",
        f"-DPYTHON_EXECUTABLE={sys.executable}",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir / 'out'}",
    ]
    if args.cuda:
        cmd.append(f"-DCUDAToolkit_ROOT={args.cuda}")
    if args.cuda_archs:
        cmd.append(f"-DCMAKE_CUDA_ARCHITECTURES={args.cuda_archs}")
    return cmd


def compat_commands(args: argparse.Namespace, build_root: Path) -> list[list[str]]:
    """Configure + build ktwin_compat.lib with the same toolchain."""
    bdir = build_root / "compat"
    cfg = ["cmake", "-G", "Ninja", "-S", str(COMPAT_DIR), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_TOOLCHAIN_FILE={CMAKE_DIR / 'clang-cl-toolchain.cmake'}"]
    if args.llvm:
        cfg.append(f"-DKTWIN_LLVM_DIR={args.llvm}")
    return [cfg, ["cmake", "--build", str(bdir), "-j", str(args.jobs)]]


def run(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    """Print and (unless dry-run) run one command, stopping on failure."""
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True, env=env)


def build_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for the kt-kernel configure: PKG_CONFIG_PATH with a generated hwloc.pc."""
    env = dict(os.environ)
    if args.hwloc:
        pc_dir = Path(args.build_dir) / "pkgconfig"
        hw = Path(args.hwloc)
        if not args.dry_run:
            pc_dir.mkdir(parents=True, exist_ok=True)
            # Written here because the .pc inside hwloc's Windows zip names its build machine's prefix.
            (pc_dir / "hwloc.pc").write_text(
                f"prefix={hw.as_posix()}\nName: hwloc\nDescription: hwloc (winport)\nVersion: 2\n"
                "Cflags: -I${prefix}/include\nLibs: -L${prefix}/lib -lhwloc\n",
                encoding="utf-8",
            )
        env["PKG_CONFIG_PATH"] = os.pathsep.join(p for p in (str(pc_dir), env.get("PKG_CONFIG_PATH", "")) if p)
    return env


def find_built_module(out_dir: Path) -> Path:
    """kt_kernel_ext*.pyd produced by one variant's build."""
    found = sorted(out_dir.glob("kt_kernel_ext*.pyd")) + sorted(out_dir.rglob("kt_kernel_ext*.pyd"))
    if not found:
        raise SystemExit(f"no kt_kernel_ext*.pyd under {out_dir}")
    return found[0]


def install(kt_dir: Path, stage: dict[str, Path], args: argparse.Namespace) -> Path:
    """Copy kt-kernel's Python package, the variant .pyd files and runtime DLLs into site-packages."""
    site = Path(sysconfig.get_paths()["purelib"])
    pkg = site / "kt_kernel"
    print(f"installing into {pkg}")
    if args.dry_run:
        return pkg
    shutil.copytree(kt_dir / "python", pkg, dirs_exist_ok=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".pyd"
    files = []
    for variant, pyd in stage.items():
        dst = pkg / f"_kt_kernel_ext_{variant}{suffix}"
        shutil.copy2(pyd, dst)
        files.append(dst)
    # Load-time DLL dependencies of the .pyd files, found next to them by the Windows loader.
    dlls = []
    if args.llvm:
        dlls += list((Path(args.llvm) / "bin").glob("libomp*.dll"))
    if args.hwloc:
        dlls += list((Path(args.hwloc) / "bin").glob("*hwloc*.dll"))
    for dll in dlls:
        shutil.copy2(dll, pkg / dll.name)
        files.append(pkg / dll.name)
    dist = site / f"kt_kernel-{KT_VERSION}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: kt-kernel\nVersion: {KT_VERSION}\n"
        "Summary: kt-kernel built for Windows by winport build/ktkernel/make.py\n", encoding="utf-8")
    (dist / "INSTALLER").write_text("winport-make\n", encoding="utf-8")
    rel = [p.relative_to(site).as_posix() for p in pkg.rglob("*") if p.is_file()]
    rel += [f"{dist.name}/{n}" for n in ("METADATA", "INSTALLER", "RECORD")]
    (dist / "RECORD").write_text("".join(f"{r},,\n" for r in rel), encoding="utf-8")
    return pkg


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, build the compat library and every variant, install."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, type=Path, help="ktransformers checkout at tag v0.7.2 (or its kt-kernel/)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--hwloc", help="unpacked hwloc Windows build (include/, lib/, bin/)")
    ap.add_argument("--fmt", help="fmt source tree (header-only use; its include/ is added)")
    ap.add_argument("--llvm", help="LLVM install dir (default: from clang-cl on PATH)")
    ap.add_argument("--cuda", help="CUDA toolkit root (default: CMake's search, CUDA_PATH)")
    ap.add_argument("--cuda-archs", default="", help="CMAKE_CUDA_ARCHITECTURES, e.g. 86;89;120")
    ap.add_argument("--build-dir", default=str(HERE.parent / "out" / "ktkernel"))
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--no-install", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}")
    kt_dir = kt_kernel_dir(args.source)
    version = source_version(kt_dir)
    if version and version != KT_VERSION:
        print(f"warning: source is kt-kernel {version}; this build is made for {KT_VERSION}", file=sys.stderr)
    if not args.llvm and (cl := shutil.which("clang-cl")):
        args.llvm = str(Path(cl).resolve().parent.parent)
    if not args.dry_run and sys.platform != "win32":
        ap.error("building needs Windows (clang-cl + MSVC libraries); use --dry-run elsewhere")

    build_root = Path(args.build_dir)
    for cmd in compat_commands(args, build_root):
        run(cmd, args.dry_run)
    compat_lib = build_root / "compat" / "ktwin_compat.lib"
    env = build_env(args)
    stage: dict[str, Path] = {}
    for variant in variants:
        bdir = build_root / variant
        run(cmake_configure_cmd(args, kt_dir, variant, bdir, compat_lib), args.dry_run, env)
        run(["cmake", "--build", str(bdir), "--target", "kt_kernel_ext", "-j", str(args.jobs)], args.dry_run, env)
        stage[variant] = bdir / "out" / "kt_kernel_ext.pyd" if args.dry_run else find_built_module(bdir / "out")
    if not args.no_install:
        install(kt_dir, stage, args)
    print("done: " + ", ".join(variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
