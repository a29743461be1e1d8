"""`winport doctor`: what this machine has for the port, and what to do about what it lacks.

Works on Linux and Windows: CPU features come from cpuid (winport.cpu_features), memory and cores
from psutil, NUMA nodes from the OS API (Windows) or sysfs (Linux), never from /proc.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

from winport import pins, shimloader


@dataclass
class Check:
    """One line of the report: a name, what was found, whether it is fine, and advice if not."""

    name: str
    value: str
    ok: bool = True
    advice: str = ""


@dataclass
class Report:
    """All checks, grouped by section."""

    sections: dict[str, list[Check]] = field(default_factory=dict)

    def add(self, section: str, check: Check) -> None:
        """Append a check to a section."""
        self.sections.setdefault(section, []).append(check)

    @property
    def problems(self) -> list[Check]:
        """Checks that failed."""
        return [c for checks in self.sections.values() for c in checks if not c.ok]

    def as_dict(self) -> dict[str, list[dict[str, object]]]:
        """JSON-ready form."""
        return {s: [c.__dict__ for c in checks] for s, checks in self.sections.items()}

    def render(self) -> str:
        """Human-readable text."""
        lines = []
        for section, checks in self.sections.items():
            lines.append(f"[{section}]")
            width = max(len(c.name) for c in checks)
            for c in checks:
                mark = "ok " if c.ok else "!! "
                lines.append(f"  {mark}{c.name.ljust(width)}  {c.value}")
                if c.advice:
                    lines.append(f"      -> {c.advice}")
        problems = self.problems
        lines.append("")
        lines.append(f"{len(problems)} problem(s)" if problems else "no problems found")
        return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def numa_nodes() -> int:
    """Number of NUMA nodes; 1 when the OS does not say (Wine lacks the Windows calls)."""
    if sys.platform == "win32":
        import ctypes

        highest = ctypes.c_ulong(0)
        try:
            ok = ctypes.windll.kernel32.GetNumaHighestNodeNumber(ctypes.byref(highest))  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            return 1
        return int(highest.value) + 1 if ok else 1
    node_dir = Path("/sys/devices/system/node")
    if node_dir.is_dir():
        nodes = [p for p in node_dir.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
        return max(1, len(nodes))
    return 1


def _system(report: Report) -> None:
    report.add("system", Check("OS", f"{platform.system()} {platform.release()} ({platform.machine()})"))
    ok_py = (3, 10) <= sys.version_info[:2] <= (3, 13)
    report.add("system", Check("Python", f"{platform.python_version()} ({sys.executable})", ok_py,
                               "" if ok_py else "use Python 3.10-3.13"))
    in_venv = sys.prefix != sys.base_prefix
    report.add("system", Check("venv", sys.prefix if in_venv else "not in a venv", in_venv,
                               "" if in_venv else "run scripts/install.sh (Linux) or scripts\\install.ps1 (Windows)"))


def _cpu(report: Report) -> None:
    try:
        import psutil
    except ImportError:
        psutil = None  # type: ignore[assignment]
    try:
        from winport.cpu_features import cpu_features, kt_kernel_variant

        f = cpu_features()
        report.add("cpu", Check("model", f"{f.brand} ({f.vendor})"))
        report.add("cpu", Check("ISA (cpuid)", " ".join(f.isa_list) or "none of interest",
                                f.avx2, "" if f.avx2 else "kt-kernel needs at least AVX2"))
        report.add("cpu", Check("AMX tile state", "enabled by the OS" if f.amx_os_enabled else "not enabled"))
        variant = kt_kernel_variant(f)
        report.add("cpu", Check("kt-kernel variant", variant))
    except OSError as exc:
        report.add("cpu", Check("cpuid", f"unavailable: {exc}", False, "x86-64 CPU required"))
    cores = psutil.cpu_count(logical=False) if psutil else None
    logical = os.cpu_count()
    report.add("cpu", Check("cores", f"{cores or '?'} physical, {logical} logical"))
    if psutil:
        ram = psutil.virtual_memory().total / 2**30
        report.add("cpu", Check("RAM", f"{ram:.1f} GiB", ram >= 8, "" if ram >= 8 else "8 GiB is too little even for the demo"))
    report.add("cpu", Check("NUMA nodes", str(numa_nodes())))


def _gpu(report: Report) -> None:
    try:
        import torch
    except ImportError:
        report.add("gpu", Check("torch", "not installed", False, "run the installer"))
        return
    report.add("gpu", Check("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
                            torch.__version__.startswith(pins.TORCH), "" if torch.__version__.startswith(pins.TORCH)
                            else f"the port is tested with torch {pins.TORCH}"))
    triton_dist = "triton-windows" if _version("triton-windows") else "triton"
    tv = _version(triton_dist)
    report.add("gpu", Check("Triton", f"{triton_dist} {tv}" if tv else "not installed", tv is not None,
                            "" if tv else "pip install " + ("triton-windows" if sys.platform == "win32" else "triton")))
    if not torch.cuda.is_available():
        report.add("gpu", Check("CUDA GPU", "none (the demo runs on CPU)"))
        return
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        report.add("gpu", Check(f"GPU {i}", f"{p.name}, SM{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB"))


def _libraries(report: Report) -> None:
    active = shimloader.active_shims()
    for name, dist in shimloader.SHIMMED_LIBRARIES.items():
        real = _version(dist)
        using = "winport shim" if active[name] else f"real {dist} {real or ''}".strip()
        report.add("libraries", Check(name, using))
    sg = _version("sglang")
    report.add("libraries", Check("sglang", sg or "not installed", sg == pins.SGLANG,
                                  "" if sg == pins.SGLANG else f"the port targets sglang=={pins.SGLANG}: run the installer"))
    kt = _version("kt-kernel")
    kt_found = importlib.util.find_spec("kt_kernel") is not None
    report.add("libraries", Check("kt-kernel", kt or ("present" if kt_found else "not installed"), kt_found,
                                  "" if kt_found else "CPU experts fall back to torch; build it (build/README.md)"))
    pth_ok = any((Path(p) / "winport_shims.pth").exists() for p in sys.path if p)
    report.add("libraries", Check("shim loader (.pth)", "installed" if pth_ok else "missing", pth_ok,
                                  "" if pth_ok else "re-run the installer: spawned SGLang processes need it"))


def collect() -> Report:
    """Gather every check."""
    report = Report()
    _system(report)
    _cpu(report)
    _gpu(report)
    _libraries(report)
    return report


def main(argv: list[str] | None = None) -> int:
    """`winport doctor [--json]`; exit 0 even with problems (they are advice, not errors)."""
    import argparse

    ap = argparse.ArgumentParser(prog="winport doctor", description="Report what this machine has for the port.")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    report = collect()
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 0
