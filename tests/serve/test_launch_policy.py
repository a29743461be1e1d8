"""winport.platform.launch_policy: the server defaults come from winport's platform, through SGLang's
own resolution, so `winport serve` and a plain `python -m sglang.launch_server` agree.

Each case resolves real SGLang 0.5.23 ServerArgs (`prepare_server_args` + `resolve_once`) in a fresh
interpreter with winport's platform on, for a model folder holding the demo's config.json: on CPU, and
on a CUDA GPU faked as an SM90 (tests.helpers.FAKE_SM90_CUDA, plus a fake free-memory query), with
each switch that decides a default, and with the user's own flag, which must win.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import FAKE_SM90_CUDA, SGLANG_ON_WINPORT_ENV, run_python

RESOLVE = """
import json, os, sys
import torch
torch.cuda.mem_get_info = lambda *a, **k: (130 * 2**30, 140 * 2**30)
from sglang.srt.arg_groups.overrides import resolution_result
from sglang.srt.server_args import prepare_server_args
out = []
for env, argv in json.loads(sys.argv[1]):
    os.environ.update(env)
    sa = prepare_server_args(argv)
    sa.resolve_once()
    r = {f: resolution_result(sa, f) for f in ("max_total_tokens", "swa_full_tokens_ratio", "skip_server_warmup",
         "disable_cuda_graph", "moe_runner_backend", "disable_custom_all_reduce")}
    graphs = resolution_result(sa, "cuda_graph_config")
    r["graphs"] = [str(graphs.decode.backend), str(graphs.prefill.backend)] if graphs is not None else None
    r["engram_env"] = os.environ.get("WINPORT_ENGRAM_GGUF")
    r["kt_env"] = [os.environ.get("WINPORT_KT_MOE"), os.environ.get("KT_FORCE_SYNC_SUBMIT")]
    r["kt_pools"] = resolution_result(sa, "kt_threadpool_count")
    for k in {*env, "WINPORT_KT_MOE", "KT_FORCE_SYNC_SUBMIT", "WINPORT_ENGRAM_GGUF"}:
        os.environ.pop(k, None)
    out.append(r)
print("RESULT " + json.dumps(out))
"""
BASE_ENV = SGLANG_ON_WINPORT_ENV


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winport.demo.config import demo_config

    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps(demo_config()))
    return path


def _resolve(cases: list[tuple[dict[str, str], list[str]]], *, cuda: bool) -> list[dict]:
    """Resolve each (environment, argv) case in one fresh interpreter; the resolved fields per case."""
    code = (FAKE_SM90_CUDA if cuda else "") + RESOLVE.replace("sys.argv[1]", repr(json.dumps(cases)))
    proc = run_python(code, env={**BASE_ENV, **({} if cuda else {"SGLANG_USE_CPU_ENGINE": "1"})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("RESULT "))


def _argv(folder: Path, device: str, *extra: str) -> list[str]:
    return ["--model-path", str(folder), "--device", device, "--trust-remote-code", *extra]


def test_cpu_defaults_and_the_users_flags_win(folder: Path) -> None:
    plain, own, tp2 = _resolve([
        ({}, _argv(folder, "cpu")),
        ({}, _argv(folder, "cpu", "--max-total-tokens", "999", "--swa-full-tokens-ratio", "0.7")),
        ({}, _argv(folder, "cpu", "--tp-size", "2")),
    ], cuda=False)
    assert (plain["max_total_tokens"], plain["swa_full_tokens_ratio"], plain["skip_server_warmup"]) == (16384, 0.5, True)
    assert plain["disable_custom_all_reduce"] is False and plain["disable_cuda_graph"] is False
    assert (own["max_total_tokens"], own["swa_full_tokens_ratio"]) == (999, 0.7)
    assert tp2["disable_custom_all_reduce"] is True
    # kt-kernel serves the experts of a CPU-only server at --tp 1 (its synchronous path), as in winport serve.
    from winport.hybrid.settings import numa_nodes

    assert plain["kt_env"] == ["1", "1"] and plain["kt_pools"] == numa_nodes()
    assert tp2["kt_env"][0] is None


def test_cuda_defaults_follow_the_switches(folder: Path) -> None:
    plain, eager, mxfp4, own, hybrid, kt_off = _resolve([
        ({}, _argv(folder, "cuda")),
        ({"WINPORT_CUDA_GRAPH": "0"}, _argv(folder, "cuda")),
        ({"WINPORT_GPU_MXFP4_MOE": "1"}, _argv(folder, "cuda")),
        ({"WINPORT_GPU_MXFP4_MOE": "1"}, _argv(folder, "cuda", "--moe-runner-backend", "marlin")),
        ({}, _argv(folder, "cuda", "--kt-num-gpu-experts", "4")),
        ({"WINPORT_KT_MOE": "0"}, _argv(folder, "cuda", "--kt-num-gpu-experts", "4")),
    ], cuda=True)
    # kt-kernel on CUDA only when a GPU expert count is given (what `--gpu-experts N` becomes), stream path.
    # (only WINPORT_KT_MOE: KT_FORCE_SYNC_SUBMIT may come from the test run's own environment)
    assert plain["kt_env"][0] is None and hybrid["kt_env"][0] == "1" and kt_off["kt_env"][0] == "0"
    # Nothing of the CPU's: the GPU's KV pool is SGLang's own sizing.
    assert plain["max_total_tokens"] is None and plain["skip_server_warmup"] is False
    assert plain["disable_cuda_graph"] is False and plain["graphs"][0].endswith("full")
    assert plain["moe_runner_backend"] == "auto"
    # WINPORT_CUDA_GRAPH=0 turns off the per-phase config SGLang parsed before the platform ran.
    assert eager["disable_cuda_graph"] is True and all(g.endswith("disabled") for g in eager["graphs"])
    assert mxfp4["moe_runner_backend"] == "triton"
    assert own["moe_runner_backend"] == "marlin"


def test_an_engram_map_turns_graphs_off_and_reaches_the_schedulers(folder: Path, tmp_path: Path) -> None:
    from winport.gguf.engram_rows import SIDECAR

    mapped = tmp_path / "mapped"
    mapped.mkdir()
    (mapped / "config.json").write_text((folder / "config.json").read_text())
    (mapped / SIDECAR).write_text('{"engram_tables": []}')
    cuda, cpu = _resolve([({}, _argv(mapped, "cuda"))], cuda=True) + _resolve([({}, _argv(mapped, "cpu"))], cuda=False)
    assert cuda["disable_cuda_graph"] is True and all(g.endswith("disabled") for g in cuda["graphs"])
    assert cuda["engram_env"] == str(mapped / SIDECAR) and cpu["engram_env"] == str(mapped / SIDECAR)


def test_the_platform_exports_sglangs_switches_unless_set() -> None:
    code = (
        "import os\n"
        "os.environ['SGLANG_ENABLE_JIT_DEEPGEMM'] = '1'\n"
        "from winport.platform.plugin import activate_platform\n"
        "from winport.platform.launch_policy import sglang_switches\n"
        "print(activate_platform())\n"
        "want = sglang_switches('cpu')\n"
        "print(sorted(k for k, v in want.items() if os.environ.get(k) != v))\n"
    )
    proc = run_python(code, env={"WINPORT_PLATFORM": "on", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    platform, differ = proc.stdout.strip().splitlines()[-2:]
    assert platform.endswith("WinportCpuPlatform")
    # Every switch is in the process's environment, except the one the user had set already.
    assert differ == "['SGLANG_ENABLE_JIT_DEEPGEMM']"
