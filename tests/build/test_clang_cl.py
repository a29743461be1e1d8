"""The clang-cl side of the kt-kernel build, checked with clang-cl's driver (no Windows headers here).

- initial-cache.cmake, loaded by a language-less CMake project, yields per-variant flags and options;
- those C flags compile a header-free TU using each variant's intrinsics with clang-cl (MSVC target),
  while upstream's MSVC branch (/arch:AVX512 + macros) fails on _mm512_dpbf16_ps;
- clang-cl ignores -O3 and -ffast-math but honours /clang:-ffast-math;
- the C++ flags (with /FI of the compat header) parse with `-###`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KTK = REPO / "build" / "ktkernel"
VARIANTS = ["avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx"]

# One intrinsic that needs the newest feature of each variant (clang's own headers; freestanding
# so that no CRT header is needed).
TU = {
    "avx2": "__m256 f(__m256 a){return _mm256_fmadd_ps(a,a,a);}",
    "avx512_base": "__m512i f(__m512i a){return _mm512_adds_epi16(a,a);}",
    "avx512_vnni": "__m512i f(__m512i a){return _mm512_dpbusd_epi32(a,a,a);}",
    "avx512_vbmi": "__m512i f(__m512i a){return _mm512_permutexvar_epi8(a,a);}",
    "avx512_bf16": "__m512 f(__m512 a,__m512bh b){return _mm512_dpbf16_ps(a,b,b);}",
    "amx": "void f(void){_tile_zero(0);}",
}


def clang() -> str:
    """clang-19 (run as clang-cl through --driver-mode=cl), or skip."""
    exe = shutil.which("clang-19") or shutil.which("clang")
    if exe is None:
        pytest.skip("clang-19 missing: run scripts/ci/apt-test-tools.sh")
    return exe


def clang_cl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run clang in clang-cl mode for the MSVC target."""
    cmd = [clang(), "--driver-mode=cl", "--target=x86_64-pc-windows-msvc", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """CMakeCache.txt entries after `-D... -C initial-cache.cmake` for every variant."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake missing")
    src = tmp_path_factory.mktemp("proj")
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(p LANGUAGES NONE)\n")
    out = {}
    for v in VARIANTS:
        b = src / f"b_{v}"
        proc = subprocess.run(
            [cmake, "-S", str(src), "-B", str(b), f"-DKTWIN_VARIANT={v}", "-DKTWIN_COMPAT_LIB=C:/x/ktwin_compat.lib",
             "-DKTWIN_LLVM_DIR=C:/LLVM", "-C", str(KTK / "cmake" / "initial-cache.cmake")],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        entries = {}
        for line in (b / "CMakeCache.txt").read_text().splitlines():
            m = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line)
            if m:
                value = m.group(2)
                if len(value) > 1 and value[0] == value[-1] == "'":  # CMake quotes odd values
                    value = value[1:-1]
                entries[m.group(1)] = value
        out[v] = entries
    return out


def test_cache_options(caches: dict[str, dict[str, str]]) -> None:
    """llama.cpp ISA options off, CUDA on, AMX/AVX512 umbrella per variant, compat lib as libnuma."""
    for v, c in caches.items():
        for opt in ("LLAMA_NATIVE", "LLAMA_AVX2", "LLAMA_AVX512", "LLAMA_AVX512_VBMI", "LLAMA_AVX512_VNNI",
                    "LLAMA_AVX512_BF16", "LLAMA_AVX512_FANCY_SIMD"):
            assert c[opt] == "OFF", (v, opt)
        assert c["KTRANSFORMERS_USE_CUDA"] == "ON"
        assert c["KTRANSFORMERS_CPU_USE_AMX_AVX512"] == ("OFF" if v == "avx2" else "ON")
        assert c["KTRANSFORMERS_CPU_USE_AMX"] == ("ON" if v == "amx" else "OFF")
        assert c["NUMA_LIBRARY"] == "C:/x/ktwin_compat.lib"
        assert c["CMAKE_BUILD_TYPE"] == "Release"
        assert "/clang:-ffast-math" in c["CMAKE_CXX_FLAGS"]
        assert "ktwin_compat.h" in c["CMAKE_CXX_FLAGS"] and "/FI" in c["CMAKE_CXX_FLAGS"]
        assert "/arch:" not in c["CMAKE_CXX_FLAGS"]


def test_bad_variant_is_refused(tmp_path: Path) -> None:
    """A misspelt variant stops the configure instead of building avx2 silently."""
    cmake = shutil.which("cmake") or pytest.skip("cmake missing")
    (tmp_path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(p LANGUAGES NONE)\n")
    proc = subprocess.run([cmake, "-S", str(tmp_path), "-B", str(tmp_path / "b"), "-DKTWIN_VARIANT=avx512",
                           "-C", str(KTK / "cmake" / "initial-cache.cmake")], capture_output=True, text=True)
    assert proc.returncode != 0 and "KTWIN_VARIANT=avx512" in proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_flags_compile_its_intrinsics(variant: str, caches, tmp_path: Path) -> None:
    """Each variant's cached C flags let clang-cl compile that variant's newest intrinsic, and the
    next-lower variant's flags do not (the flags are real, not macro-only)."""
    src = tmp_path / "isa.c"
    src.write_text("#include <immintrin.h>\n" + TU[variant] + "\n")
    flags = caches[variant]["CMAKE_C_FLAGS"].split()
    ok = clang_cl("/clang:-ffreestanding", *flags, "/c", str(src), f"/Fo{tmp_path / 'isa.obj'}")
    assert ok.returncode == 0, ok.stderr
    idx = VARIANTS.index(variant)
    if idx > 0:
        lower = caches[VARIANTS[idx - 1]]["CMAKE_C_FLAGS"].split()
        bad = clang_cl("/clang:-ffreestanding", *lower, "/c", str(src), f"/Fo{tmp_path / 'isa2.obj'}")
        assert bad.returncode != 0


def test_upstream_msvc_branch_fails_on_bf16(tmp_path: Path) -> None:
    """Why the cache exists: /arch:AVX512 plus the __AVX512BF16__ macro is not enough for clang-cl."""
    src = tmp_path / "isa.c"
    src.write_text("#include <immintrin.h>\n" + TU["avx512_bf16"] + "\n")
    proc = clang_cl("/clang:-ffreestanding", "/arch:AVX512", "-D__AVX512BF16__", "/c", str(src),
                    f"/Fo{tmp_path / 'x.obj'}")
    assert proc.returncode != 0 and "avx512bf16" in proc.stderr


def test_fast_math_spelling(tmp_path: Path) -> None:
    """clang-cl drops -ffast-math and -O3 (kt-kernel's spellings) but honours /clang:-ffast-math."""
    src = tmp_path / "a.c"
    src.write_text("float f(float a){return a*2.0f;}\n")
    plain = clang_cl("-###", "-ffast-math", "-O3", "/c", str(src))
    assert "unknown argument ignored in clang-cl: '-ffast-math'" in plain.stderr
    assert "argument unused during compilation: '-O3'" in plain.stderr
    good = clang_cl("-###", "/clang:-ffast-math", "/c", str(src))
    assert '"-ffast-math"' in good.stderr and "unknown argument" not in good.stderr


def test_cxx_flags_parse(caches, tmp_path: Path) -> None:
    """The full C++ flag string (force-include, include dirs, ISA) is accepted by the driver."""
    src = tmp_path / "a.cpp"
    src.write_text("int main(){}\n")
    flags = caches["amx"]["CMAKE_CXX_FLAGS"].replace('"', "").split()
    proc = clang_cl("-###", *flags, "/c", str(src))
    assert proc.returncode == 0, proc.stderr
    assert "unknown argument" not in proc.stderr and "unused" not in proc.stderr
    assert "ktwin_compat.h" in proc.stderr and '"-target-feature" "+amx-tile"' in proc.stderr


def test_make_py_dry_run(tmp_path: Path) -> None:
    """make.py plans the compat library and all six variants, with -D values before -C."""
    kt = tmp_path / "ktransformers" / "kt-kernel"
    (kt / "python").mkdir(parents=True)
    (kt / "CMakeLists.txt").write_text("# stand-in\n")
    (tmp_path / "ktransformers" / "version.py").write_text('__version__ = "0.7.2"\n')
    proc = subprocess.run([sys.executable, str(KTK / "make.py"), "--source", str(tmp_path / "ktransformers"),
                           "--dry-run", "--no-install", "--llvm", "C:/LLVM", "--build-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("+ cmake -G Ninja -S") and "kt-kernel" in ln]
    assert len(lines) == 6
    for v, line in zip(VARIANTS, lines, strict=True):
        assert f"-DKTWIN_VARIANT={v}" in line
        assert line.index("-DKTWIN_VARIANT") < line.index(" -C ") < line.index("CMAKE_TOOLCHAIN_FILE")
    assert "compat" in proc.stdout and "warning" not in proc.stderr
