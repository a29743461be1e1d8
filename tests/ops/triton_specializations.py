"""Which Triton specializations the op tests launch, and compiling them for real CUDA targets.

The CPU op tests run kernels_triton's kernels under TRITON_INTERPRET=1, which never runs Triton's
compiler, so a kernel can pass every CPU test and still fail to compile on a GPU. This module:

* records launches (`WINPORT_RECORD_TRITON=1 .venv/bin/python -m pytest tests/ops -m "not gpu"`):
  every launch of a kernels_triton @triton.jit function (InterpretedFunction.run on CPU,
  JITFunction.run on a GPU) is turned into the signature Triton's own launcher would compute
  (pointer dtypes, i32/i64, ints equal to 1 as constexpr, 16-divisibility), its constexpr values and
  launch options (num_warps, num_stages), deduplicated and written to triton_specializations.json.
  Launches in child interpreters (tests that use tests.helpers.run_python) are recorded too, through
  _triton_record_site/sitecustomize.py, which the recorder puts on the children's PYTHONPATH;
* compiles recorded specializations with `triton.compile(ASTSource(...), target=GPUTarget(...))`,
  which runs TTIR -> TTGIR -> LLIR -> PTX -> cubin (Triton's bundled ptxas) without any GPU, in
  worker processes without TRITON_INTERPRET (tests/ops/test_triton_compile.py and
  `python -m tests.ops.triton_specializations compile [--arch 90 120] [--all-attrs]`);
* lists the launchable kernels of kernels_triton (JIT functions no other JIT function calls), so
  the CI test can fail when one has no recorded specialization.

Hook points (Triton 3.6-3.9): `triton.runtime.interpreter.InterpretedFunction.run` and
`triton.runtime.jit.JITFunction.run`, both called as `run(*args, grid=..., warmup=..., **kwargs)` by
`kernel[grid](...)` (KernelInterface.__getitem__). The signature is computed with Triton's own binder
(`create_function_from_signature`) when it has the 3.4+ form, else by a plain-Python equivalent.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SPECS_PATH = Path(__file__).with_name("triton_specializations.json")
PACKAGE = "kernels_triton"
RECORD_ENV = "WINPORT_RECORD_TRITON"
# Not WINPORT_-prefixed: tests.helpers.run_python drops WINPORT_* from a child's environment.
CHILD_DIR_ENV = "RECORD_TRITON_SPECS_DIR"
SITE_DIR = Path(__file__).with_name("_triton_record_site")
REGENERATE = f'{RECORD_ENV}=1 .venv/bin/python -m pytest tests/ops -m "not gpu" -q'
# Triton's signature for a cuda launch does not depend on the arch; this one is only used to
# build the binder (a backend instance is required by native_specialize_impl).
_BINDER_ARCH = 90
# Launch keyword arguments that are not kernel parameters and that a compile does not take.
_LAUNCH_ONLY = {"grid", "warmup", "stream", "device"}

Json = dict[str, Any]


# ============================================================================ value encoding
def encode_constexpr(value: Any, where: str) -> Any:
    """A constexpr value as JSON (dtype, JIT function and tuple values tagged); ValueError if not encodable."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    cls = type(value).__name__
    if cls == "constexpr":
        return encode_constexpr(value.value, where)
    if cls in ("dtype", "pointer_type") or type(value).__module__.startswith("triton.language"):
        return {"tl_dtype": str(value)}
    if hasattr(value, "fn") and callable(getattr(value, "fn", None)):
        return {"jit_function": f"{value.fn.__module__}:{value.fn.__qualname__}"}
    if isinstance(value, tuple):
        return {"tuple": [encode_constexpr(v, where) for v in value]}
    raise ValueError(f"{where}: constexpr value {value!r} of type {cls} cannot be recorded")


def decode_constexpr(value: Any) -> Any:
    """Inverse of encode_constexpr (imports triton.language / the named module as needed)."""
    if not isinstance(value, dict):
        return value
    if "tl_dtype" in value:
        import triton.language as tl

        return tl.dtype(value["tl_dtype"])
    if "jit_function" in value:
        return resolve_kernel(value["jit_function"])
    if "tuple" in value:
        return tuple(decode_constexpr(v) for v in value["tuple"])
    raise ValueError(f"unknown encoded constexpr {value!r}")


def kernel_name(fn: Callable[..., Any]) -> str:
    """'module:qualname' of the Python function under a JITFunction / InterpretedFunction."""
    return f"{fn.__module__}:{fn.__qualname__}"


def resolve_kernel(name: str) -> Any:
    """The JIT object (JITFunction, or InterpretedFunction under TRITON_INTERPRET) named 'module:qualname'."""
    mod_name, _, qual = name.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# ============================================================================ specialization
def _jit_for(obj: Any) -> Any:
    """A (non-interpreted) JITFunction for obj: obj itself, or one built from an InterpretedFunction's fn."""
    from triton.runtime.jit import JITFunction

    if isinstance(obj, JITFunction):
        return obj
    cached = getattr(obj, "_winport_shadow_jit", None)
    if cached is None:
        kwargs = {k: v for k, v in getattr(obj, "kwargs", {}).items()
                  if k in inspect.signature(JITFunction.__init__).parameters}
        cached = JITFunction(obj.fn, **kwargs)
        obj._winport_shadow_jit = cached
    return cached


_BINDERS: dict[int, Any] = {}


def _triton_binder(jf: Any) -> Callable[..., Any] | None:
    """Triton's own argument binder for jf (3.4+ form), or None when this Triton has another form."""
    key = id(jf)
    if key in _BINDERS:
        return _BINDERS[key]
    binder = None
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        if len(inspect.signature(create_function_from_signature).parameters) == 3:
            backend = make_backend(GPUTarget("cuda", _BINDER_ARCH, 32))
            binder = create_function_from_signature(jf.signature, jf.params, backend)
    except (ImportError, AttributeError, TypeError):
        binder = None
    _BINDERS[key] = binder
    return binder


def _python_specialize(value: Any, specialize: bool, align: bool) -> tuple[Any, Any]:
    """Plain-Python stand-in for Triton's specialize_impl (used only when the binder is unavailable)."""
    if value is None:
        return "constexpr", None
    if isinstance(value, bool):
        return "u1", None
    if isinstance(value, int):
        if specialize and value == 1:
            return "constexpr", 1
        ty = "i32" if -(2**31) <= value < 2**31 else ("u64" if value >= 2**63 else "i64")
        return ty, ("D" if specialize and align and value % 16 == 0 else "")
    if isinstance(value, float):
        return "fp32", None
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        from triton.runtime.jit import mangle_type

        ty = mangle_type(value)
        return ty, ("D" if align and value.data_ptr() % 16 == 0 else "")
    raise ValueError(f"argument of type {type(value).__name__} is not supported by the fallback specializer")


def specialize_launch(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], use_binder: bool = True) -> Json:
    """What a CUDA launch of obj(*args, **kwargs) compiles: signature, constexprs, attrs and options.

    signature maps each non-constexpr parameter to Triton's type string; constexprs holds the
    constexpr parameters (annotated, None-valued, or ints equal to 1 that Triton specializes);
    attrs maps parameters to Triton's attribute string ("D": divisible by 16); options holds the
    launch options given (num_warps, num_stages, ...), Triton's defaults apply to the rest.
    use_binder=False forces the plain-Python path (tests compare the two).
    """
    jf = _jit_for(obj)
    names = [p.name for p in jf.params]
    options = {k: v for k, v in kwargs.items() if k not in names and k not in _LAUNCH_ONLY}
    binder = _triton_binder(jf) if use_binder else None
    if binder is not None:
        bound, spec, _ = binder(*args, **kwargs)
        values = list(bound.values())
    else:
        sig = inspect.signature(obj.fn)
        bound_sig = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound_sig.apply_defaults()
        values = [bound_sig.arguments[n] for n in names]
        spec = [("constexpr", v) if p.is_constexpr
                else _python_specialize(v, not p.do_not_specialize, not p.do_not_specialize_on_alignment)
                for p, v in zip(jf.params, values, strict=True)]
    where = kernel_name(obj.fn)
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[str, str] = {}
    for name, value, (ty, attr) in zip(names, values, spec, strict=True):
        if not isinstance(ty, str):
            raise ValueError(f"{where}: tuple argument {name!r} is not supported by the recorder")
        if ty == "constexpr":
            constexprs[name] = encode_constexpr(value, f"{where} argument {name!r}")
        else:
            signature[name] = ty
            if isinstance(attr, str) and attr:
                attrs[name] = attr
    for key, value in options.items():
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ValueError(f"{where}: launch option {key}={value!r} cannot be recorded")
    return {"signature": signature, "constexprs": constexprs, "attrs": attrs, "options": options}


# ============================================================================ recording
class Recorder:
    """Collects deduplicated specializations of kernels_triton launches in this process."""

    def __init__(self) -> None:
        # kernel -> key (signature, constexprs, options) -> {"spec": ..., "attrs": {json: attrs}, "test": id}
        self.kernels: dict[str, dict[str, Json]] = {}
        self.errors: list[str] = []

    def record(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record one launch of obj (ignored unless obj's function lives in kernels_triton)."""
        fn = getattr(obj, "fn", None)
        if fn is None or not getattr(fn, "__module__", "").startswith(PACKAGE + "."):
            return
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        try:
            spec = specialize_launch(obj, args, kwargs)
        except Exception as exc:  # reported at the end of the session; the launch itself goes on
            self.errors.append(f"{kernel_name(fn)} launched by {test or '?'}: {exc!r}")
            return
        self.add(kernel_name(fn), spec, test)

    def add(self, kernel: str, spec: Json, test: str) -> None:
        """Merge one specialization (attrs variants kept apart; first test id kept, sorted)."""
        attrs = spec["attrs"]
        key = json.dumps({k: spec[k] for k in ("signature", "constexprs", "options")}, sort_keys=True)
        entry = self.kernels.setdefault(kernel, {}).setdefault(
            key, {"signature": spec["signature"], "constexprs": spec["constexprs"],
                  "options": spec["options"], "attrs": {}, "test": test})
        entry["attrs"][json.dumps(attrs, sort_keys=True)] = attrs
        if test and (not entry["test"] or test < entry["test"]):
            entry["test"] = test

    def dump(self) -> Json:
        """Plain JSON form: {kernel: [{signature, constexprs, options, attrs: [variants], test}]}."""
        out: Json = {}
        for kernel, entries in self.kernels.items():
            out[kernel] = [{**e, "attrs": list(e["attrs"].values())} for e in entries.values()]
        return out

    def load(self, kernels: Json) -> None:
        """Merge a dump() (from a child interpreter)."""
        for kernel, entries in kernels.items():
            for e in entries:
                for attrs in e["attrs"] or [{}]:
                    self.add(kernel, {**e, "attrs": attrs}, e.get("test", ""))


_RECORDER = Recorder()


def _wrap_run(cls: type) -> None:
    """Make cls.run record its launch before running (idempotent)."""
    original = cls.run
    if getattr(original, "_winport_records", False):
        return

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        _RECORDER.record(self, args, kwargs)
        return original(self, *args, **kwargs)

    run._winport_records = True  # type: ignore[attr-defined]
    run.__doc__ = original.__doc__
    cls.run = run


def start_recording() -> None:
    """Hook Triton's launch paths in this process and in child interpreters it starts."""
    from winport.importhooks import on_import

    on_import("triton.runtime.jit", lambda m: _wrap_run(m.JITFunction))
    on_import("triton.runtime.interpreter", lambda m: _wrap_run(m.InterpretedFunction))
    if not os.environ.get(CHILD_DIR_ENV):
        os.environ[CHILD_DIR_ENV] = tempfile.mkdtemp(prefix="triton-specs-")
        paths = [str(SITE_DIR)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)


def start_child_recording() -> None:
    """In a child interpreter (from sitecustomize): record, and write the records out at exit."""
    start_recording()

    def flush() -> None:
        if not _RECORDER.kernels and not _RECORDER.errors:
            return
        out = Path(os.environ[CHILD_DIR_ENV]) / f"child-{os.getpid()}.json"
        out.write_text(json.dumps({"kernels": _RECORDER.dump(), "errors": _RECORDER.errors}))

    atexit.register(flush)


def _sorted_entries(entries: list[Json]) -> list[Json]:
    for e in entries:
        # Most 16-divisible variant first: CI compiles that one (aligned production shapes).
        e["attrs"] = sorted(e["attrs"], key=lambda a: (-len(a), json.dumps(a, sort_keys=True)))
    return sorted(entries, key=lambda e: json.dumps([e["constexprs"], e["signature"], e["options"]],
                                                    sort_keys=True))


def _format(doc: Json) -> str:
    """JSON with one line per specialization, so a regenerated file diffs by specialization."""
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in doc.items() if k != "kernels"]
    lines.append(' "kernels": {')
    for i, (kernel, entries) in enumerate(doc["kernels"].items()):
        lines.append(f"  {json.dumps(kernel)}: [")
        lines += [f"   {json.dumps(e)}" + ("," if j < len(entries) - 1 else "") for j, e in enumerate(entries)]
        lines.append("  ]" + ("," if i < len(doc["kernels"]) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def write_specs(path: Path = SPECS_PATH) -> tuple[int, int, list[str]]:
    """Merge this session's records (and its children's) into path; returns (kernels, specs, errors).

    Kernels launched in this session get their records replaced; the other kernels' records stay,
    so a partial run (one test file) does not drop kernels it did not launch, unless the kernel no
    longer exists in kernels_triton.
    """
    import triton

    child_dir = os.environ.get(CHILD_DIR_ENV)
    errors = list(_RECORDER.errors)
    if child_dir and Path(child_dir).is_dir():
        for f in sorted(Path(child_dir).glob("child-*.json")):
            data = json.loads(f.read_text())
            _RECORDER.load(data["kernels"])
            errors += data["errors"]
            f.unlink()
        try:  # the folder start_recording made; a child still running keeps it (and its file)
            Path(child_dir).rmdir()
        except OSError:
            pass
    if errors:
        return 0, 0, errors
    old = json.loads(path.read_text())["kernels"] if path.exists() else {}
    existing = jit_functions()
    old = {k: v for k, v in old.items() if k in existing}  # a kernel removed from kernels_triton: drop its records
    kernels = {**old, **_RECORDER.dump()}
    kernels = {k: _sorted_entries(kernels[k]) for k in sorted(kernels)}
    doc = {
        "about": "Triton specializations the op tests launch; compiled for CUDA targets by "
                 "tests/ops/test_triton_compile.py. Generated, do not edit: " + REGENERATE,
        "triton": triton.__version__,
        "kernels": kernels,
    }
    path.write_text(_format(doc))
    return len(kernels), sum(len(v) for v in kernels.values()), errors


def record_path() -> Path:
    """Where a recording session writes: WINPORT_RECORD_TRITON's value if it is a *.json path, else SPECS_PATH."""
    value = os.environ.get(RECORD_ENV, "")
    return Path(value) if value.endswith(".json") else SPECS_PATH


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Pytest hook (imported by tests/ops/conftest.py when recording): write the JSON file."""
    path = record_path()
    n_kernels, n_specs, errors = write_specs(path)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    if errors:
        say(f"triton_specializations: NOT written, {len(errors)} launches could not be recorded:")
        for e in errors:
            say("  " + e)
        session.exitstatus = 1
    else:
        say(f"triton_specializations: {n_kernels} kernels, {n_specs} specializations -> {path}")


def load_specs(path: Path = SPECS_PATH) -> Json:
    """The recorded specializations: {kernel: [entries]} (see Recorder.dump)."""
    return json.loads(path.read_text())["kernels"]


# ============================================================================ kernel inventory
def _jit_types() -> tuple[type, ...]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return JITFunction, InterpretedFunction


def jit_functions() -> dict[str, Any]:
    """Every @triton.jit function defined in a kernels_triton module, by 'module:qualname'."""
    pkg = importlib.import_module(PACKAGE)
    types = _jit_types()
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(pkg.__path__, PACKAGE + "."):
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if isinstance(obj, types) and obj.fn.__module__ == mod.__name__:
                found[kernel_name(obj.fn)] = obj
    return found


def _called_jit(obj: Any, types: tuple[type, ...]) -> set[str]:
    """Names of the JIT functions obj's body calls (plain names and module attributes)."""
    fn = obj.fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    called: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target: Any = None
        if isinstance(node.func, ast.Name):
            target = fn.__globals__.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            target = getattr(fn.__globals__.get(node.func.value.id), node.func.attr, None)
        if isinstance(target, types):
            called.add(kernel_name(target.fn))
    return called


def launch_roots(functions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JIT functions of kernels_triton that no other JIT function calls: the launched kernels.

    Helpers (called from kernels) are compiled as part of their callers, so only roots need a
    recorded specialization of their own.
    """
    functions = jit_functions() if functions is None else functions
    types = _jit_types()
    called: set[str] = set()
    for obj in functions.values():
        called |= _called_jit(obj, types)
    return {k: v for k, v in functions.items() if k not in called}


# ============================================================================ compiling
# Constexprs whose launchers choose one value under TRITON_INTERPRET and another on a GPU (the
# interpreter cannot do bf16/fp8 tl.dot, rounding by .to(bf16), ...). The recorded value is then one
# no GPU ever runs, so jobs compile the GPU value instead (all_attrs, the slow variant: both).
# Each function maps a recorded entry to the constexprs a GPU launch of it would use.
GPU_CONSTEXPRS: dict[str, Callable[[Json], dict[str, Any]]] = {
    # flash_attn.py: UPCAST=q.device.type == "cpu" or q.dtype == torch.float32
    "kernels_triton.flash_attn:_fa_fwd_kernel": lambda e: {"UPCAST": e["signature"].get("q_ptr") == "*fp32"},
    # fp8_gemm.py: F32_DOT=TRITON_INTERPRET == "1"
    "kernels_triton.fp8_gemm:_fp8_block_gemm_kernel": lambda e: {"F32_DOT": False},
    # fp8_gemm.py: PDL=gemv_pdl(device), False off CUDA; True on SM90+ (griddepcontrol must compile for sm_120);
    # L2_PREFETCH=0 under the interpreter (inline PTX), GemvConfig.l2_prefetch on a GPU (2 in GEMV_TUNED, with
    # x as one row): compiled with 2 where x is one row, so both forms compile for sm_90 and sm_120
    "kernels_triton.fp8_gemm:_fp8_gemv_kernel": lambda e: {
        "PDL": True, "L2_PREFETCH": 2 if e["constexprs"].get("X_ROW") else 0},
    # fp8_gemm.py: ROUND_BY_HAND=TRITON_INTERPRET == "1"
    "kernels_triton.fp8_gemm:_dequant_bf16_kernel": lambda e: {"ROUND_BY_HAND": False},
    # indexer.py / sparse_mla.py: DOT_F32=interpreting()
    "kernels_triton.indexer:_mqa_logits_kernel": lambda e: {"DOT_F32": False},
    "kernels_triton.sparse_mla:_sparse_mla_fwd_kernel": lambda e: {"DOT_F32": False},
    # mxfp4_moe.py: EMULATE_BF16=TRITON_INTERPRET (fp32 dot of bf16-exact values, rounding by hand)
    "kernels_triton.mxfp4_moe:_mxfp4_moe_gate_up_kernel": lambda e: {"EMULATE_BF16": False},
    "kernels_triton.mxfp4_moe:_mxfp4_moe_down_kernel": lambda e: {"EMULATE_BF16": False},
    # mxfp4_moe_gemv.py: EMULATE_BF16=TRITON_INTERPRET (fp32 -> bf16 rounding by hand)
    "kernels_triton.mxfp4_moe_gemv:_mxfp4_gemv_gate_up_kernel": lambda e: {"EMULATE_BF16": False},
    "kernels_triton.mxfp4_moe_gemv:_mxfp4_gemv_down_kernel": lambda e: {"EMULATE_BF16": False},
}


def _gpu_entries(kernel: str, entry: Json, both: bool) -> list[Json]:
    """entry with GPU_CONSTEXPRS applied (and the recorded one too when both)."""
    rule = GPU_CONSTEXPRS.get(kernel)
    if rule is None:
        return [entry]
    gpu = {k: v for k, v in rule(entry).items() if k in entry["constexprs"]}
    twin = {**entry, "constexprs": {**entry["constexprs"], **gpu}}
    if twin["constexprs"] == entry["constexprs"]:
        return [entry]
    twin["test"] = f"{entry.get('test', '')} (with the GPU value of {sorted(gpu)})"
    return [entry, twin] if both else [twin]


def make_jobs(specs: Json, archs: Iterable[int], all_attrs: bool = False,
              kernels: Iterable[str] | None = None) -> list[Json]:
    """One compile job per (kernel, entry, arch[, attrs variant]), deduplicated.

    CI form: the first (most 16-divisible) attrs variant, and GPU_CONSTEXPRS' GPU values in place of
    interpreter-only ones; all_attrs: every attrs variant, and the recorded values as well.
    """
    jobs: list[Json] = []
    seen: set[str] = set()
    wanted = set(kernels) if kernels is not None else None
    for kernel, recorded in specs.items():
        if wanted is not None and kernel not in wanted:
            continue
        for entry in (g for e in recorded for g in _gpu_entries(kernel, e, all_attrs)):
            variants = entry["attrs"] if all_attrs else entry["attrs"][:1]
            for attrs in variants or [{}]:
                for arch in archs:
                    job = {"kernel": kernel, "arch": arch, "signature": entry["signature"],
                           "constexprs": entry["constexprs"], "attrs": attrs, "options": entry["options"]}
                    key = json.dumps(job, sort_keys=True)
                    if key in seen:
                        continue
                    seen.add(key)
                    jobs.append({"id": len(jobs), **job, "test": entry.get("test", "")})
    return jobs


def describe_job(job: Json) -> str:
    """Kernel, target, constexprs, options and the 16-divisible arguments of one job, on one line."""
    cx = ", ".join(f"{k}={v}" for k, v in job["constexprs"].items())
    opts = ", ".join(f"{k}={v}" for k, v in job["options"].items())
    return (f"{job['kernel']} [cuda sm_{job['arch']}] constexprs({cx}) options({opts}) "
            f"div16({', '.join(job['attrs'])}) first launched by {job['test'] or '?'}")


def compile_job(job: Json) -> None:
    """Compile one job with triton.compile for GPUTarget('cuda', arch, 32); raises Triton's error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    fn = resolve_kernel(job["kernel"])
    if type(fn).__name__ != "JITFunction":
        raise RuntimeError(f"{job['kernel']} is a {type(fn).__name__}, not a JITFunction "
                           "(is TRITON_INTERPRET set in the compile worker?)")
    target = GPUTarget("cuda", job["arch"], 32)
    backend = make_backend(target)
    names = fn.arg_names
    missing = set(job["signature"]) | set(job["constexprs"])
    missing -= set(names)
    absent = [n for n in names if n not in job["signature"] and n not in job["constexprs"]]
    if missing or absent:
        raise RuntimeError(f"recorded arguments {sorted(missing)} / kernel parameters {absent} do not match "
                           f"the kernel's parameters {names}: the record is stale, regenerate with {REGENERATE}")
    signature = {n: job["signature"].get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): decode_constexpr(v) for n, v in job["constexprs"].items()}
    attrs = {(names.index(n),): backend.parse_attr(a) for n, a in job["attrs"].items()}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    triton.compile(src, target=target, options=dict(job["options"]))


def _worker(jobs_path: Path, claims: Path, out_path: Path) -> None:
    """Compile jobs, claiming each with an exclusive file so workers share the list dynamically."""
    jobs = json.loads(jobs_path.read_text())
    with out_path.open("a") as out:
        for job in jobs:
            try:
                os.close(os.open(claims / str(job["id"]), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            t0, c0 = time.perf_counter(), _cpu_seconds()
            try:
                compile_job(job)
                error = ""
            except Exception as exc:  # Triton's CompilationError etc.: the message is the finding
                error = _error_text(exc)
            out.write(json.dumps({"id": job["id"], "error": error,
                                  "seconds": round(time.perf_counter() - t0, 3),
                                  "cpu_seconds": round(_cpu_seconds() - c0, 3)}) + "\n")
            out.flush()


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (ptxas): the cost on an idle machine.

    Windows has no getrusage (the Wine tier runs this too): there, this process's CPU time only.
    """
    try:
        import resource

        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    except (ImportError, AttributeError):
        return time.process_time()
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _error_text(exc: BaseException) -> str:
    """Triton's message (CompilationError carries the kernel source line) plus the raising frame."""
    text = f"{type(exc).__name__}: {exc}"
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        last = tb[-1]
        text += f"\n  (raised at {last.filename}:{last.lineno} in {last.name})"
    return text


def compile_all(jobs: list[Json], procs: int = 2, timeout: float = 900) -> tuple[dict[int, Json], str]:
    """Compile jobs in `procs` fresh worker processes (no TRITON_INTERPRET, a fresh empty Triton cache).

    Returns ({job id: {"error", "seconds"}}, workers' stderr tail); a job a worker did not finish
    (crash, timeout) has no entry.
    """
    repo_root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="triton-compile-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "claims").mkdir()
        (tmpd / "jobs.json").write_text(json.dumps(jobs))
        env = {k: v for k, v in os.environ.items()
               if k not in ("TRITON_INTERPRET", CHILD_DIR_ENV, RECORD_ENV)}
        env["TRITON_CACHE_DIR"] = str(tmpd / "cache")  # compile everything, reuse nothing between runs
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and Path(p) != SITE_DIR)
        workers = []
        for i in range(max(1, procs)):
            cmd = [sys.executable, "-m", "tests.ops.triton_specializations", "_worker",
                   str(tmpd / "jobs.json"), str(tmpd / "claims"), str(tmpd / f"out{i}.jsonl")]
            err = (tmpd / f"err{i}.txt").open("w")
            workers.append((subprocess.Popen(cmd, cwd=repo_root, env=env, stdout=err, stderr=err), err))
        deadline = time.monotonic() + timeout
        for proc, err in workers:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            err.close()
        results: dict[int, Json] = {}
        stderr = ""
        for i in range(len(workers)):
            out = tmpd / f"out{i}.jsonl"
            if out.exists():
                for line in out.read_text().splitlines():
                    if line.strip():
                        r = json.loads(line)
                        results[r["id"]] = r
            stderr += (tmpd / f"err{i}.txt").read_text()[-3000:]
    return results, stderr


def main(argv: list[str] | None = None) -> int:
    """CLI: `compile` the recorded specializations and print failures (and the internal `_worker`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        _worker(Path(argv[1]), Path(argv[2]), Path(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("compile", help="compile the recorded specializations for CUDA targets")
    cp.add_argument("--arch", type=int, nargs="+", default=[90, 120])
    cp.add_argument("--all-attrs", action="store_true", help="every recorded 16-divisibility variant")
    cp.add_argument("--kernel", nargs="*", help="only these 'module:qualname' kernels")
    cp.add_argument("--procs", type=int, default=2)
    cp.add_argument("--specs", type=Path, default=SPECS_PATH)
    args = ap.parse_args(argv)
    jobs = make_jobs(load_specs(args.specs), args.arch, args.all_attrs, args.kernel)
    t0 = time.perf_counter()
    results, stderr = compile_all(jobs, args.procs, timeout=3600)
    failed = 0
    for job in jobs:
        r = results.get(job["id"])
        if r is None or r["error"]:
            failed += 1
            print(f"FAIL {describe_job(job)}\n  {r['error'] if r else 'no result; worker stderr: ' + stderr}\n")
    per_kernel: dict[str, list[float]] = {}
    for job in jobs:
        if job["id"] in results:
            acc = per_kernel.setdefault(f"{job['kernel']} sm_{job['arch']}", [0, 0.0])
            acc[0] += 1
            acc[1] += results[job["id"]]["cpu_seconds"]
    print("CPU seconds by kernel and target (compiles):")
    for key, (n, cpu) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cpu:7.1f} s  ({n:3d})  {key}")
    total_cpu = sum(cpu for _, cpu in per_kernel.values())
    print(f"{len(jobs)} compiles, {failed} failed, {time.perf_counter() - t0:.1f} s wall with {args.procs} "
          f"processes, {total_cpu:.1f} CPU s in compiles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
