"""Every Triton specialization the op tests launch compiles for cuda sm_90 (H200) and sm_120 (RTX 5090 /
RTX PRO 6000), without a GPU.

The CPU op tests run kernels_triton under TRITON_INTERPRET=1, which never runs Triton's compiler: a
kernel can pass them all and still fail to compile on a GPU (a loop-carried variable that changes
shape, a dtype the target lacks, a layout the backend rejects, ptxas errors). Here each recorded
specialization (tests/ops/triton_specializations.json: signature, constexprs, num_warps/num_stages
and 16-divisibility, as Triton's own launcher computes them for the launches the op tests make) goes
through triton.compile for GPUTarget("cuda", 90 / 120, 32): TTIR -> TTGIR -> LLIR -> PTX -> cubin
with the ptxas in the Triton wheel, in two fresh worker processes with an empty Triton cache.

Regenerate the JSON after changing a kernel or its launcher (README, "Compile check"):
    WINPORT_RECORD_TRITON=1 .venv/bin/python -m pytest tests/ops -m "not gpu" -q
"""

from __future__ import annotations

import os

import pytest

from tests.ops import triton_specializations as ts

# A recording run (WINPORT_RECORD_TRITON=1) rewrites the JSON this module compiles: nothing to check then.
pytestmark = pytest.mark.skipif(bool(os.environ.get(ts.RECORD_ENV)), reason="recording run: the JSON is being rewritten")
ARCHS = (90, 120)
# sm_120 (the users' RTX 5090 / PRO 6000, which no machine here runs) in every CI run; sm_90 in the
# slow tier: the H200 compiles and runs the same kernels for real (scripts/gpu/run_all.sh). Half the
# check's ~5 minutes on 2 cores.
ARCH_PARAMS = [pytest.param(90, marks=pytest.mark.slow, id="sm_90"), pytest.param(120, id="sm_120")]
SPECS = ts.load_specs() if ts.SPECS_PATH.exists() else {}
CANARY = "tests.ops._compile_canary:_loop_shape_canary"
CANARY_FIXED = "tests.ops._compile_canary:_loop_shape_fixed"
_CANARY_SPEC = {"signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, "constexprs": {"BLOCK": 64},
                "options": {"num_warps": 4}, "attrs": [{"x_ptr": "D", "out_ptr": "D"}], "test": ""}
# Launch roots of kernels_triton that the CPU op tests cannot launch, each with the reason. An entry
# here is a hole in the check: prefer a CPU test that launches the kernel.
EXEMPT: dict[str, str] = {}
# Worker processes: CI has 2 cores; WINPORT_TRITON_COMPILE_PROCS overrides.
PROCS = int(os.environ.get("WINPORT_TRITON_COMPILE_PROCS", "2"))


def _selected(request: pytest.FixtureRequest, prefix: str) -> set[tuple[str, int]]:
    """(kernel, arch) pairs of the selected test_compiles items (so -k runs compile only those)."""
    pairs = set()
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if item.name.startswith(prefix) and cs is not None:
            pairs.add((cs.params["kernel"], cs.params["arch"]))
    return pairs


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest) -> dict[tuple[str, int], list[str]]:
    """Compile the selected kernels' recorded specializations (plus the canaries); failures per (kernel, arch)."""
    wanted = _selected(request, "test_compiles[")
    specs = {k: v for k, v in SPECS.items() if any(k == w[0] for w in wanted)}
    specs[CANARY] = [_CANARY_SPEC]
    specs[CANARY_FIXED] = [_CANARY_SPEC]
    jobs = [j for j in ts.make_jobs(specs, ARCHS)
            if (j["kernel"], j["arch"]) in wanted or j["kernel"] in (CANARY, CANARY_FIXED)]
    results, stderr = ts.compile_all(jobs, procs=PROCS, timeout=900)
    failures: dict[tuple[str, int], list[str]] = {}
    for job in jobs:
        r = results.get(job["id"])
        msg = r["error"] if r is not None else f"no result (worker crashed or timed out); stderr:\n{stderr}"
        failures.setdefault((job["kernel"], job["arch"]), [])
        if msg:
            failures[(job["kernel"], job["arch"])].append(f"{ts.describe_job(job)}\n{msg}")
    return failures


@pytest.mark.parametrize("arch", ARCH_PARAMS)
@pytest.mark.parametrize("kernel", sorted(SPECS))
def test_compiles(compiled: dict[tuple[str, int], list[str]], kernel: str, arch: int) -> None:
    """Every recorded specialization of kernel compiles to a cubin for cuda sm_{arch}."""
    errors = compiled[(kernel, arch)]
    assert not errors, f"{len(errors)} specialization(s) failed to compile:\n\n" + "\n\n".join(errors)


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_check_catches_loop_carried_shape_change(compiled: dict[tuple[str, int], list[str]], arch: int) -> None:
    """The canary (a loop-carried [1] -> [BLOCK] value) fails through the same workers; its fix compiles."""
    errors = compiled[(CANARY, arch)]
    assert len(errors) == 1, errors
    assert "_loop_shape_canary" in errors[0] and f"sm_{arch}" in errors[0] and "BLOCK=64" in errors[0]
    assert "Loop-carried variable acc has initial type" in errors[0], errors[0]
    assert compiled[(CANARY_FIXED, arch)] == []


def test_canary_runs_under_the_interpreter() -> None:
    """The point of the check: the canary is accepted wherever the op tests run it on CPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is not set (GPU machine): nothing to show")
    import torch

    from tests.ops import _compile_canary

    x = torch.randn(100)
    out = torch.full((64,), float("nan"))
    _compile_canary._loop_shape_canary[(1,)](x, out, 100, BLOCK=64)
    padded = torch.nn.functional.pad(x, (0, 28))
    torch.testing.assert_close(out, padded.view(2, 64).sum(0))


def test_every_kernel_has_a_recorded_specialization() -> None:
    """Each launchable @triton.jit kernel of kernels_triton was launched by the op tests (or is exempt)."""
    roots = ts.launch_roots()
    missing = sorted(set(roots) - set(SPECS) - set(EXEMPT))
    assert not missing, (f"kernels_triton kernels with no recorded specialization: {missing}. Launch them in a "
                         f"CPU op test and regenerate ({ts.REGENERATE}), or add them to EXEMPT with the reason")
    stale = sorted(k for k in EXEMPT if k not in roots or k in SPECS)
    assert not stale, f"EXEMPT entries that are no longer unrecorded launch roots: {stale}"


def test_records_match_the_kernels() -> None:
    """The JSON names existing kernels with their current parameter names (else it is stale)."""
    functions = ts.jit_functions()
    problems = []
    for kernel, entries in SPECS.items():
        fn = functions.get(kernel)
        if fn is None:
            problems.append(f"{kernel}: no such @triton.jit function in kernels_triton")
            continue
        names = set(fn.arg_names)
        for e in entries:
            recorded = set(e["signature"]) | set(e["constexprs"])
            if recorded != names:
                problems.append(f"{kernel}: recorded {sorted(recorded ^ names)} differ from its parameters")
                break
    for kernel, rule in ts.GPU_CONSTEXPRS.items():
        fn = functions.get(kernel)
        entries = SPECS.get(kernel, [])
        if fn is None or not entries or not set(rule(entries[0])) <= set(entries[0]["constexprs"]):
            problems.append(f"GPU_CONSTEXPRS[{kernel!r}] names a kernel or constexpr that is not recorded")
    assert not problems, "stale triton_specializations.json, regenerate (" + ts.REGENERATE + "):\n" + "\n".join(
        problems)


@pytest.mark.slow
def test_compiles_every_divisibility_variant() -> None:
    """Exhaustive: every recorded 16-divisibility variant of every specialization, both targets."""
    jobs = ts.make_jobs(SPECS, ARCHS, all_attrs=True)
    results, stderr = ts.compile_all(jobs, procs=PROCS, timeout=3000)
    errors = []
    for job in jobs:
        r = results.get(job["id"])
        if r is None or r["error"]:
            errors.append(f"{ts.describe_job(job)}\n{r['error'] if r else 'no result: ' + stderr}")
    assert not errors, f"{len(errors)} of {len(jobs)} compiles failed:\n\n" + "\n\n".join(errors)


def test_fallback_specializer_matches_triton() -> None:
    """The plain-Python specializer (for Triton versions without the 3.4+ binder) agrees with Triton's."""
    import torch

    from tests.ops import _compile_canary

    args = (torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.uint8),
            torch.zeros(8, dtype=torch.float8_e4m3fn), torch.zeros(9)[1:], 1, 32, 17, 2**33, 0.5, True, None)
    kwargs = {"C": 7, "num_warps": 2, "num_stages": 3, "grid": (1,), "warmup": False}
    via_triton = ts.specialize_launch(_compile_canary._arg_kinds, args, kwargs)
    via_python = ts.specialize_launch(_compile_canary._arg_kinds, args, kwargs, use_binder=False)
    assert via_triton == via_python
    assert via_triton["constexprs"] == {"one": 1, "none_arg": None, "C": 7}
    assert via_triton["signature"]["p_fp8"] == "*fp8e4nv" and via_triton["signature"]["big"] == "i64"
    assert "p_off" not in via_triton["attrs"] and via_triton["attrs"]["n16"] == "D" and "n17" not in via_triton["attrs"]
    assert via_triton["options"] == {"num_warps": 2, "num_stages": 3}
