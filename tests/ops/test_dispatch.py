"""One rule picks Triton or the torch reference: kernels_triton._dispatch.use_triton.

Checks the rule itself (CUDA tensors -> Triton; CPU tensors -> the reference unless the interpreter is
on and WINPORT_TRITON_ON_CPU=1) and, by an AST walk of kernels_triton and shims, that no module
decides between a `*_triton` and a `*_reference` function with a predicate of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kernels_triton import _dispatch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("interp,on_cpu,want", [("1", "1", True), ("1", None, False), (None, "1", False),
                                                ("0", "1", False), (None, None, False)])
def test_rule_on_cpu_tensors(monkeypatch: pytest.MonkeyPatch, interp: str | None, on_cpu: str | None,
                             want: bool) -> None:
    for name, value in (("TRITON_INTERPRET", interp), ("WINPORT_TRITON_ON_CPU", on_cpu)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert _dispatch.use_triton(torch.zeros(2)) is want


@pytest.mark.gpu
def test_rule_on_cuda_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WINPORT_TRITON_ON_CPU", raising=False)
    assert _dispatch.use_triton(torch.zeros(2, device="cuda"))
    assert not _dispatch.use_triton(torch.zeros(2, device="cuda"), torch.zeros(2))  # mixed: the reference


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _own_predicate(test: ast.AST) -> bool:
    """A device test other than the rule: `.is_cuda`, `.device.type`, or an interpreter check."""
    names = _names(test)
    return bool(names & {"is_cuda", "type", "interpreting", "_interpreting"}) and not (names & {"use_triton",
                                                                                               "_use_triton"})


def _choice_sites() -> list[str]:
    """Places that pick between a `*_triton` and a `*_reference` callable with their own predicate."""
    bad = []
    for base in ("kernels_triton", "shims"):
        for path in sorted((ROOT / base).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.If, ast.IfExp)) or not _own_predicate(node.test):
                    continue
                body = node.body if isinstance(node, ast.If) else [node.body]
                orelse = node.orelse if isinstance(node, ast.If) else [node.orelse]
                names = set().union(*(_names(n) for n in body + orelse)) if body + orelse else set()
                if any(n.endswith("_triton") for n in names) and any(n.endswith(("_reference", "_ref")) for n in names):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return bad


def test_no_other_dispatch_predicates() -> None:
    assert _choice_sites() == [], "decide Triton vs torch with kernels_triton._dispatch.use_triton"
