"""The environment registry (winport.envs + kernels_triton._env): one home for every variable.

- no module of winport/, shims/ or kernels_triton/ touches os.environ / os.getenv except the two
  registry modules (an AST walk, so aliases like `from os import environ` are caught too);
- every variable name those packages spell out is declared;
- the one boolean parser, the typed parsers and their errors;
- the README carries exactly the generated table between its envs markers.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernels_triton import _env
from winport import envs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("winport", "shims", "kernels_triton")
REGISTRY = {Path("winport/envs.py"), Path("kernels_triton/_env.py")}
# os functions and attributes that read or write the process environment.
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def env_accesses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every access to the process environment through the os module in `tree`."""
    hits = []
    os_aliases = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_aliases |= {a.asname or a.name for a in node.names if a.name == "os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name) \
                and node.value.id in os_aliases:
            hits.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            hits += [(node.lineno, f"from os import {a.name}") for a in node.names if a.name in ENV_NAMES]
    return hits


def test_no_environment_access_outside_the_registry() -> None:
    offenders = []
    for path in _sources():
        rel = path.relative_to(REPO)
        if rel in REGISTRY:
            continue
        for line, text in env_accesses(ast.parse(path.read_text(encoding="utf-8"), str(rel))):
            offenders.append(f"{rel}:{line}: {text}")
    assert not offenders, "read environment variables through winport.envs / kernels_triton._env:\n" + "\n".join(offenders)


def test_the_walk_finds_what_it_forbids() -> None:
    src = ("import os\nimport os as o\nfrom os import getenv, path\n"
           "a = os.environ.get('X')\nb = o.getenv('Y')\nos.environ['Z'] = '1'\nd = dict(os.environ)\nc = os.path.sep\n")
    assert [t for _, t in sorted(env_accesses(ast.parse(src)))] == [
        "from os import getenv", "os.environ", "o.getenv", "os.environ", "os.environ"]


# Names in the packages' strings that look like variables but are not (prefixes, ids).
NOT_VARIABLES: set[str] = set()


def test_every_variable_named_in_the_packages_is_declared() -> None:
    """Each WINPORT_*/KT_KERNEL_* name in a string (message, docstring, help) is a declared variable."""
    pattern = re.compile(r"\b((?:WINPORT|KT_KERNEL)_[A-Z0-9_]*[A-Z0-9])\b")
    named = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named |= set(pattern.findall(node.value))
    missing = sorted(named - set(envs.VARIABLES) - NOT_VARIABLES)
    assert not missing, f"declare these in winport/envs.py (or kernels_triton/_env.py): {missing}"


def test_the_kernel_variables_are_in_the_one_table() -> None:
    for var in _env.KERNEL_VARIABLES:
        assert envs.VARIABLES[var.name] is var


def test_every_variable_is_documented() -> None:
    for var in envs.VARIABLES.values():
        assert var.why.strip() and "\n" not in var.why, var.name
        assert var.type in _env.TYPES, var.name
        if var.default is not None:
            assert var.parse(str(var.default) if var.type != "bool" else var.true[0] if var.default
                             else var.false[0]) == var.default, var.name


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_boolean_true_spellings(raw: str) -> None:
    assert envs.WINPORT_EMULATE_WINDOWS.get({"WINPORT_EMULATE_WINDOWS": raw}) is True


@pytest.mark.parametrize("raw", ["0", "false", "No", "OFF"])
def test_boolean_false_spellings(raw: str) -> None:
    assert envs.WINPORT_CUDA_GRAPH.get({"WINPORT_CUDA_GRAPH": raw}) is False


def test_unset_and_empty_mean_the_default() -> None:
    assert envs.WINPORT_CUDA_GRAPH.get({}) is True
    assert envs.WINPORT_CUDA_GRAPH.get({"WINPORT_CUDA_GRAPH": ""}) is True
    assert envs.WINPORT_GGUF_DEQUANT_CHUNK.get({}) == 1 << 22


def test_unknown_boolean_names_the_variable() -> None:
    with pytest.raises(envs.EnvError, match="WINPORT_GPU_MXFP4_MOE='maybe'"):
        envs.WINPORT_GPU_MXFP4_MOE.get({"WINPORT_GPU_MXFP4_MOE": "maybe"})


def test_a_foreign_boolean_takes_only_its_owners_spellings() -> None:
    # Triton reads 1/true/on as on and everything else as off: `yes` would mean on here, off there.
    assert envs.TRITON_INTERPRET.get({"TRITON_INTERPRET": "true"}) is True
    with pytest.raises(envs.EnvError, match="TRITON_INTERPRET"):
        envs.TRITON_INTERPRET.get({"TRITON_INTERPRET": "yes"})
    with pytest.raises(envs.EnvError, match="SGLANG_USE_CPU_ENGINE"):
        envs.SGLANG_USE_CPU_ENGINE.get({"SGLANG_USE_CPU_ENGINE": "on"})


def test_typed_values_and_their_errors() -> None:
    assert envs.WINPORT_READY_TIMEOUT.get({"WINPORT_READY_TIMEOUT": "12.5"}) == 12.5
    assert envs.WINPORT_FP8_GEMV_CONFIG.get({"WINPORT_FP8_GEMV_CONFIG": "8,512,1,4,1"}) == (8, 512, 1, 4, 1)
    with pytest.raises(envs.EnvError, match="WINPORT_GGUF_THREADS='many': expected an integer"):
        envs.WINPORT_GGUF_THREADS.get({"WINPORT_GGUF_THREADS": "many"})
    with pytest.raises(envs.EnvError, match="WINPORT_SHIMS must be auto, force or off, not 'sometimes'"):
        envs.WINPORT_SHIMS.get({"WINPORT_SHIMS": "sometimes"})
    # A choice of on/off also takes the boolean spellings (WINPORT_PLATFORM=1, WINPORT_FP8_GEMV_PDL=0).
    assert envs.WINPORT_PLATFORM.get({"WINPORT_PLATFORM": "TRUE"}) == "on"
    assert envs.WINPORT_FP8_GEMV_PDL.get({"WINPORT_FP8_GEMV_PDL": "0"}) == "off"
    assert envs.WINPORT_FP8_GEMV_PDL.get({"WINPORT_FP8_GEMV_PDL": "force"}) == "force"


def test_child_environment_helpers() -> None:
    env: dict[str, str] = {}
    envs.set_for_child(env, envs.SGLANG_IS_FLASHINFER_AVAILABLE, "false")
    assert env == {"SGLANG_IS_FLASHINFER_AVAILABLE": "false"}
    with pytest.raises(envs.EnvError, match="OMP_NUM_THREADS"):
        envs.set_for_child(env, envs.OMP_NUM_THREADS, "four")
    target = {"SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS": "100"}
    assert not envs.set_default(envs.SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS, "8192", target)
    assert target["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "100"
    assert envs.child_environ({"X_WINPORT_TEST": "1"})["X_WINPORT_TEST"] == "1"


def test_the_two_emulation_readers_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """winemu and the kt-kernel loader once read WINPORT_EMULATE_WINDOWS by different rules."""
    from winport import winemu
    from winport.ktkernel import loader

    monkeypatch.setattr(loader.importhooks, "on_import", lambda *a: None)
    for raw, on in (("true", True), ("1", True), ("off", False)):
        monkeypatch.setenv("WINPORT_EMULATE_WINDOWS", raw)
        assert winemu.enabled() is on
        assert loader.install() is (on or sys.platform == "win32")


def test_the_two_cache_roots_agree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """paths.cache_dir and the GGUF tokenizer cache once had different defaults."""
    from winport.gguf.tokenizer import tokenizer_cache_dir
    from winport.paths import cache_dir

    monkeypatch.delenv("WINPORT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
    root = tokenizer_cache_dir({"tokenizer.ggml.model": "gpt2"}).parent.parent
    assert root == cache_dir() == tmp_path / "winport"


def test_interpreting_follows_triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "true")
    assert _env.interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _env.interpreting()


README_BEGIN, README_END = "<!-- envs:begin -->", "<!-- envs:end -->"


def test_readme_carries_the_generated_table() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1, "README.md lacks the envs markers"
    block = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert block.strip() == envs.markdown_table().strip(), \
        "README.md's table of variables is stale: paste `python -m winport envs --markdown` between the markers"


def test_the_printer_prints_the_table() -> None:
    out = subprocess.run([sys.executable, "-m", "winport", "envs", "--markdown"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == envs.markdown_table().strip()
    assert all(f"`{name}`" in out for name in envs.VARIABLES)
