"""The PowerShell entry points: they parse, they are documented, and serve.ps1 matches `winport serve`.

No PowerShell runs here (shared/WINDOWS_PROXY.md): tree-sitter-pwsh parses the scripts. The Python
snippet inside install.ps1 is real Python and is run. The Windows lock's win_amd64 resolution is
tested in tests/foundation/test_install.py, not repeated here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.windows import pwsh
from winport.serve.args import build_parser

SCRIPTS = REPO_ROOT / "scripts"
SERVE_PS1 = SCRIPTS / "serve.ps1"
INSTALL_PS1 = SCRIPTS / "install.ps1"
# Every flag of `winport serve` that serve.ps1 deliberately does not offer, with the reason.
# Empty: all of them are reachable.
SERVE_FLAG_EXCEPTIONS: dict[str, str] = {}
# argparse type -> the PowerShell type a parameter must be declared with.
PS_TYPE_FOR = {int: "int", float: "double", str: "string", Path: "string", None: "string"}


def _all_ps1() -> list[Path]:
    skip = {".venv", ".cache", ".git", "node_modules"}
    return sorted(p for p in REPO_ROOT.rglob("*.ps1") if not skip.intersection(p.relative_to(REPO_ROOT).parts))


def test_the_entry_points_exist() -> None:
    names = {p.name for p in _all_ps1()}
    assert {"install.ps1", "serve.ps1", "test.ps1"} <= names


@pytest.mark.parametrize("script", _all_ps1(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_ps1_parses(script: Path) -> None:
    assert pwsh.syntax_problems(script.read_bytes()) == []


# Each mutation breaks serve.ps1 in one way PowerShell would refuse to parse.
PLANTED = {
    "unclosed brace": lambda s: s.replace(b"if ($value.IsPresent) { $argv += $FlagOf[$name] }",
                                          b"if ($value.IsPresent) { $argv += $FlagOf[$name]"),
    "unterminated string": lambda s: s.replace(b"Model         = '--model'", b"Model         = '--model"),
    "unclosed param block": lambda s: s.replace(b"    [string]$LogLevel\n)", b"    [string]$LogLevel\n"),
    "unclosed sub-expression": lambda s: s.replace(b'("running: $python "', b'("running: $($python "'),
}


@pytest.mark.parametrize("mutation", sorted(PLANTED))
def test_planted_syntax_error_is_caught(mutation: str) -> None:
    original = SERVE_PS1.read_bytes()
    broken = PLANTED[mutation](original)
    assert broken != original, "the mutation no longer applies: update PLANTED"
    assert pwsh.syntax_problems(broken), f"{mutation} was not detected"


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.ps1")), ids=lambda p: p.name)
def test_comment_help_documents_every_parameter(script: Path) -> None:
    """The user-facing entry points (scripts/*.ps1) answer Get-Help for each parameter."""
    source = script.read_bytes()
    help_text = pwsh.comment_help(source)
    assert ".SYNOPSIS" in help_text and ".EXAMPLE" in help_text
    missing = [p.name for p in pwsh.script_parameters(source) if f".PARAMETER {p.name}\n" not in help_text]
    assert missing == [], f"Get-Help would not describe {missing}"


def _serve_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


def mapping_problems(source: bytes, parser: argparse.ArgumentParser) -> list[str]:
    """Every way serve.ps1's parameters and `winport serve`'s flags disagree (empty: they agree)."""
    params = {p.name: p for p in pwsh.script_parameters(source)}
    flag_of = pwsh.hashtable(source, "FlagOf")
    flags = _serve_flags(parser)
    problems = [f"parameter -{n} has no flag in $FlagOf" for n in params if n not in flag_of]
    problems += [f"$FlagOf names -{n}, which is no parameter" for n in flag_of if n not in params]
    problems += [f"-{n} maps to {f}, which `winport serve` does not have" for n, f in flag_of.items()
                 if f not in flags]
    mapped = set(flag_of.values())
    problems += [f"{f} of `winport serve` is unreachable from serve.ps1" for f in flags
                 if f not in mapped and f not in SERVE_FLAG_EXCEPTIONS]
    for name, flag in flag_of.items():
        if name not in params or flag not in flags:
            continue
        param, action = params[name], flags[flag]
        if isinstance(action, argparse._StoreTrueAction):
            if not param.is_switch:
                problems.append(f"-{name} must be a [switch]: {flag} takes no value")
            continue
        want = PS_TYPE_FOR.get(action.type, "string")  # type: ignore[call-overload]
        if (param.type or "").lower() != want:
            problems.append(f"-{name} is [{param.type}], {flag} needs [{want}]")
        if action.choices is not None and sorted(param.validate_set or []) != sorted(map(str, action.choices)):
            problems.append(f"-{name} ValidateSet {param.validate_set} != {flag} choices {list(action.choices)}")
    # A required either/or group (--demo | --model) must become mandatory, distinct parameter sets.
    for group in parser._mutually_exclusive_groups:
        if not group.required:
            continue
        by_flag = {f: n for n, f in flag_of.items()}
        sets = []
        for action in group._group_actions:
            param = params.get(by_flag.get(action.option_strings[-1], ""))
            if param is None or param.attributes.get("Mandatory") != "$true":
                problems.append(f"{action.option_strings[-1]} is required either/or: its parameter must be "
                                "Mandatory in its own parameter set")
            else:
                sets.append(param.attributes.get("ParameterSetName"))
        if len(set(sets)) != len(sets):
            problems.append(f"parameters of the either/or group share a parameter set: {sets}")
    return problems


def test_serve_ps1_matches_winport_serve() -> None:
    assert mapping_problems(SERVE_PS1.read_bytes(), build_parser()) == []


def test_exceptions_name_real_flags() -> None:
    assert set(SERVE_FLAG_EXCEPTIONS) <= set(_serve_flags(build_parser()))


def test_mapping_check_catches_drift() -> None:
    """The comparison fails for each kind of drift (a new flag, a typo, a wrong type, a lost choice)."""
    source = SERVE_PS1.read_bytes()
    parser = build_parser()
    parser.add_argument("--new-flag", type=int)
    assert any("--new-flag" in p for p in mapping_problems(source, parser))
    typo = source.replace(b"Mmproj        = '--mmproj'", b"Mmproj        = '--mm-proj'")
    assert any("--mm-proj" in p for p in mapping_problems(typo, build_parser()))
    wrong_type = source.replace(b"[int]$CpuThreads", b"[string]$CpuThreads")
    assert any("-CpuThreads is [string]" in p for p in mapping_problems(wrong_type, build_parser()))
    lost_choice = source.replace(b"[ValidateSet('auto', 'cpu', 'cuda')]", b"[ValidateSet('auto', 'cpu')]")
    assert any("-Device ValidateSet" in p for p in mapping_problems(lost_choice, build_parser()))
    unmapped = source.replace(b"    Tp            = '--tp'\n", b"")
    problems = mapping_problems(unmapped, build_parser())
    assert "parameter -Tp has no flag in $FlagOf" in problems
    assert "--tp of `winport serve` is unreachable from serve.ps1" in problems


def test_install_ps1_is_a_should_process_wrapper_over_the_python_installer() -> None:
    source = INSTALL_PS1.read_bytes()
    assert "SupportsShouldProcess = $true" in pwsh.script_attributes(source)
    text = source.decode()
    # -WhatIf maps onto the installer's --dry-run; both paths call the same Python installer.
    assert "$WhatIfPreference" in text and "'--dry-run'" in text
    assert "@('-m', 'winport', 'install')" in text
    assert {p.name for p in pwsh.script_parameters(source)} == {"Python", "Dev", "KtSource", "SkipGpuCheck"}
    assert "@('--kt-source', $KtSource)" in text


def _run_probe(python: str) -> dict[str, object]:
    code = pwsh.here_string(INSTALL_PS1.read_bytes(), "probe")
    assert '"' not in code, "Windows PowerShell 5.1 mangles double quotes in native arguments"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_install_ps1_python_probe_runs() -> None:
    """The interpreter probe in install.ps1 is Python: run it here (a full, non-embeddable CPython)."""
    info = _run_probe(sys.executable)
    assert info["minor"] == sys.version_info[0] * 100 + sys.version_info[1]
    assert info["bits"] == 64 and info["embeddable"] is False and info["store"] is False
    assert set(info) >= {"version", "executable", "headers", "importlib", "freethreaded"}
