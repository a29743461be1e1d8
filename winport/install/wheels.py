"""Repack upstream wheels so they install where upstream publishes none.

SGLang 0.5.11+ ships only manylinux wheels and no sdist, yet almost all of it is pure Python: its
compiled parts (Rust extensions under srt/rust_extensions and mem_cache/rust_tree_core) are
optional on our serving path. `repack_pure` rewrites such a wheel as `py3-none-any` without its
compiled files, so pip installs it on Windows (and, for one tested code path, on Linux too).

kt-kernel's wheel also carries other top-level packages (its own `sgl_kernel`, `deep_gemm`,
`triton_kernels`, mscclpp libraries) that would shadow our shims and are not used by kt_kernel
itself; `repack_subset` keeps only the named top-level packages.
Standard library only: runs before the venv exists.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")
_SO_VERSIONED = re.compile(r"\.so(\.\d+)*$")


class WheelError(ValueError):
    """A wheel that cannot be repacked (names the file and the problem)."""


def is_compiled(member: str) -> bool:
    """Whether a wheel member is a native binary (extension module or shared library)."""
    name = member.rsplit("/", 1)[-1]
    return name.endswith(COMPILED_SUFFIXES) or bool(_SO_VERSIONED.search(name))


def _record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def _csv_text(rows: list[list[str]]) -> str:
    # RECORD is CSV: SGLang ships file names with commas (tuned-config JSONs), which need quoting.
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _dist_info_dir(names: Iterable[str], wheel: Path) -> str:
    dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise WheelError(f"{wheel}: expected one .dist-info folder, found {sorted(dirs) or 'none'}")
    return dirs.pop()


def _rewrite(
    src: Path,
    dest_dir: Path,
    keep: Callable[[str], bool],
    wheel_tag: str | None,
) -> Path:
    """Copy `src` to dest_dir keeping members where keep(name) holds; fix WHEEL and RECORD."""
    try:
        zin = zipfile.ZipFile(src)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{src}: not a readable wheel ({exc})") from exc
    with zin:
        names = zin.namelist()
        dist_info = _dist_info_dir(names, src)
        name_parts = src.name[: -len(".whl")].split("-")
        if len(name_parts) < 5:
            raise WheelError(f"{src}: file name is not a wheel name (dist-version-py-abi-plat.whl)")
        dist, version = name_parts[0], name_parts[1]
        tag = wheel_tag or "-".join(name_parts[-3:])
        out_path = dest_dir / f"{dist}-{version}-{tag}.whl"
        dest_dir.mkdir(parents=True, exist_ok=True)
        records: list[list[str]] = []
        record_name = f"{dist_info}/RECORD"
        with zipfile.ZipFile(out_path, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                name = info.filename
                if name == record_name or name.endswith("/"):
                    continue
                if not name.startswith(dist_info + "/") and not keep(name):
                    continue
                data = zin.read(info)
                if name == f"{dist_info}/WHEEL" and wheel_tag is not None:
                    data = _retag(data.decode(), wheel_tag).encode()
                zout.writestr(name, data)
                records.append(_record_row(name, data))
            records.append([record_name, "", ""])
            zout.writestr(record_name, _csv_text(records))
    return out_path


def _retag(wheel_text: str, tag: str) -> str:
    lines = [ln for ln in wheel_text.splitlines() if not ln.startswith(("Tag:", "Root-Is-Purelib:"))]
    lines.append("Root-Is-Purelib: true")
    lines.append(f"Tag: {tag}")
    return "\n".join(lines) + "\n"


def repack_pure(src: Path, dest_dir: Path) -> Path:
    """Repack a platform wheel as py3-none-any, dropping every compiled member."""
    return _rewrite(src, dest_dir, lambda name: not is_compiled(name), "py3-none-any")


def repack_subset(src: Path, dest_dir: Path, top_level: Iterable[str]) -> Path:
    """Repack a wheel keeping only the given top-level packages/folders (same tag)."""
    wanted = set(top_level)
    return _rewrite(src, dest_dir, lambda name: name.split("/", 1)[0] in wanted, None)


def wheel_members(path: Path) -> list[str]:
    """List the member names of a wheel."""
    with zipfile.ZipFile(path) as z:
        return z.namelist()


def read_member(path: Path, member: str) -> bytes:
    """Read one member of a wheel."""
    with zipfile.ZipFile(path) as z:
        return z.read(member)


def verify_record(path: Path) -> list[str]:
    """Return problems with a wheel's RECORD (missing entries or wrong hashes); [] when sound."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as z:
        dist_info = _dist_info_dir(z.namelist(), path)
        rows = csv.reader(io.StringIO(z.read(f"{dist_info}/RECORD").decode()))
        recorded = {row[0]: row[1] for row in rows if len(row) == 3}
        for name in z.namelist():
            if name.endswith("/") or name == f"{dist_info}/RECORD":
                continue
            want = _record_row(name, z.read(name))[1]
            if recorded.get(name) != want:
                problems.append(f"{name}: RECORD has {recorded.get(name)!r}, content is {want!r}")
    return problems
