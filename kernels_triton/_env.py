"""Environment variables read below `winport` (kernels and shims), and the registry's machinery.

This is the leaf of the environment registry: `kernels_triton` and `shims` cannot import `winport`
(dependencies point downward only), so the variables they read are declared here and
`winport.envs` adds its own to the same table (`winport.envs.VARIABLES`). Nothing else in the
three packages touches `os.environ` (tests/foundation/test_envs.py walks their ASTs).

Standard library only: `winport.envs` is imported at interpreter start (winport._bootstrap).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

# The project's spellings of a boolean, compared case-insensitively. A foreign variable accepts only
# the spellings its owner reads the same way (see EnvVar.true/false), so winport never reads a
# value one way while the program it belongs to reads it another.
TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")

TYPES = ("bool", "int", "float", "str", "path", "choice", "ints")


class EnvError(ValueError):
    """An environment variable holds a value winport cannot read (the message names it)."""


def parse_bool(name: str, raw: str, true: tuple[str, ...] = TRUE_SPELLINGS,
               false: tuple[str, ...] = FALSE_SPELLINGS) -> bool:
    """The boolean `raw` spells for variable `name`; an EnvError names the variable otherwise."""
    value = raw.strip().lower()
    if value in true:
        return True
    if value in false:
        return False
    raise EnvError(f"{name}={raw!r}: expected one of {'/'.join(true)} (on) or {'/'.join(false)} (off)")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: what it is, its default, and why the project reads or sets it.

    `owner` is "winport" for the project's own variables, else the program that defines the
    variable's meaning (winport only reads it or sets it for a child process). An empty value
    counts as unset, for every variable.
    """

    name: str
    type: str
    default: Any
    why: str
    owner: str = "winport"
    choices: tuple[str, ...] = ()
    true: tuple[str, ...] = TRUE_SPELLINGS
    false: tuple[str, ...] = FALSE_SPELLINGS
    default_text: str | None = None  # shown in the table where the default is computed

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"{self.name}: unknown type {self.type!r} (one of {', '.join(TYPES)})")
        if self.type == "choice" and self.default not in self.choices:
            raise ValueError(f"{self.name}: default {self.default!r} is not one of {self.choices}")

    @property
    def foreign(self) -> bool:
        """Whether another program defines this variable."""
        return self.owner != "winport" and not self.owner.startswith("winport ")

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text in `environ` (default: this process), None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name)
        return value if value is not None and value.strip() != "" else None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the variable holds a (non-empty) value."""
        return self.raw(environ) is not None

    def parse(self, raw: str) -> Any:
        """The value `raw` means for this variable; an EnvError names the variable when it means none."""
        if self.type == "bool":
            return parse_bool(self.name, raw, self.true, self.false)
        text = raw.strip()
        if self.type == "choice":
            value = text.lower()
            if value in self.choices:
                return value
            if "on" in self.choices and "off" in self.choices and value in TRUE_SPELLINGS + FALSE_SPELLINGS:
                return "on" if value in TRUE_SPELLINGS else "off"
            *head, last = self.choices
            raise EnvError(f"{self.name} must be {', '.join(head)} or {last}, not {raw!r}")
        try:
            if self.type == "int":
                return int(text)
            if self.type == "float":
                return float(text)
            if self.type == "ints":
                return tuple(int(x) for x in text.split(","))
        except ValueError:
            kind = {"int": "an integer", "float": "a number", "ints": "comma-separated integers"}[self.type]
            raise EnvError(f"{self.name}={raw!r}: expected {kind}") from None
        return text if self.type == "str" else raw  # a path keeps its spaces

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value in `environ` (default: this process), or the default when unset."""
        raw = self.raw(environ)
        return self.default if raw is None else self.parse(raw)

    def check(self, value: str) -> str:
        """`value` if the variable can hold it (an EnvError names the variable otherwise)."""
        self.parse(value)
        return value


def set_for_child(env: MutableMapping[str, str], var: EnvVar, value: str) -> None:
    """Put `var=value` into `env`, the environment of a child process, after checking the value."""
    env[var.name] = var.check(value)


def set_default(var: EnvVar, value: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Give `var` the value `value` in `environ` (default: this process) unless it is already set;
    returns whether it was set here."""
    target = os.environ if environ is None else environ
    if var.name in target:
        return False
    target[var.name] = var.check(value)
    return True


def child_environ(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with `overrides` on top: what a child process is started with."""
    return {**os.environ, **overrides}


# Triton's own rule (its C++ getenv_bool): 1/true/on, case-insensitive, is on and anything else off.
# Winport accepts the spellings both read alike and refuses the rest rather than guess.
_TRITON_TRUE = ("1", "true", "on")
_TRITON_FALSE = ("0", "false", "off")

TRITON_INTERPRET = EnvVar(
    "TRITON_INTERPRET", "bool", False, owner="Triton", true=_TRITON_TRUE, false=_TRITON_FALSE,
    why="Triton runs kernels in its interpreter (CPU tensors); the kernels then avoid what it cannot run "
        "(inline PTX, fp8 dots) and `winport serve` sets it on the CPU for SGLang's Triton kernels.")
WINPORT_TRITON_ON_CPU = EnvVar(
    "WINPORT_TRITON_ON_CPU", "bool", False,
    why="With TRITON_INTERPRET=1, send CPU tensors to the Triton kernels instead of their torch references "
        "(checks the Triton code itself on a machine without a GPU).")
WINPORT_FP8_GEMV_PDL = EnvVar(
    "WINPORT_FP8_GEMV_PDL", "choice", "on", choices=("on", "off", "force"),
    why="Programmatic dependent launch of the FP8 GEMV: on = where it was timed faster, off, or force "
        "wherever the GPU supports it (the benchmark's switch).")
WINPORT_FP8_GEMM_CONFIG = EnvVar(
    "WINPORT_FP8_GEMM_CONFIG", "ints", None, default_text="heuristic",
    why="Tuning override of the FP8 GEMM launch: `bm,bn,bk,split,warps,stages,dequant` (scripts/bench/gemm.py).")
WINPORT_FP8_GEMV_CONFIG = EnvVar(
    "WINPORT_FP8_GEMV_CONFIG", "ints", None, default_text="tuned table",
    why="Tuning override of the FP8 GEMV launch: `bn,bk,split,warps,stages` (scripts/bench/gemm.py).")

KERNEL_VARIABLES: tuple[EnvVar, ...] = (
    TRITON_INTERPRET, WINPORT_TRITON_ON_CPU, WINPORT_FP8_GEMV_PDL, WINPORT_FP8_GEMM_CONFIG,
    WINPORT_FP8_GEMV_CONFIG,
)


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET)."""
    return bool(TRITON_INTERPRET.get())
