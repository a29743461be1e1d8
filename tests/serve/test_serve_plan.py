"""`winport serve` flag translation and --vram-gib planning, without starting a server."""

from __future__ import annotations

import pytest

from winport.serve import command


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "_cuda_available", lambda: False)


def test_demo_plan_defaults_to_loopback_cpu_and_sglang_switches(cpu_only: None, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path))
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    plan = command.build_plan(["--demo"])
    argv = plan.argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--device") + 1] == "cpu"
    assert plan.url == "http://127.0.0.1:30000"
    assert plan.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert plan.env["SGLANG_CRASH_ON_JIT_COMPILE"] == "1"
    assert plan.env["WINPORT_PLATFORM"] == "on"
    assert plan.env["PYTHONUTF8"] == "1"  # Windows' ANSI code page cannot read DeepSeek's tokenizer files
    assert "--api-key" not in argv and plan.api_key is None
    assert argv[argv.index("--served-model-name") + 1] == "winport-demo-v4"  # never a path with a drive colon
    assert "--max-running-requests" not in argv  # on the CPU SGLang's own; the KV pool is sized in tokens there


def test_cuda_serves_a_workstation_share_of_requests(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """On CUDA `winport serve` passes 16 running requests unless told (winport.placement.kv), the number
    its --vram-gib plan prices the sliding-window pool for."""
    from winport.placement.kv import WORKSTATION_RUNNING_REQUESTS

    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path))
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    argv = command.build_plan(["--demo"]).argv
    assert argv[argv.index("--max-running-requests") + 1] == str(WORKSTATION_RUNNING_REQUESTS) == "16"
    argv = command.build_plan(["--demo", "--max-running-requests", "64"]).argv
    assert argv.count("--max-running-requests") == 1 and argv[argv.index("--max-running-requests") + 1] == "64"


def test_api_key_and_limits_are_passed(cpu_only: None, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    plan = command.build_plan(["--demo", "--api-key", "s3cret", "--max-running-requests", "3",
                               "--context-length", "2048", "--port", "31000"])
    a = plan.argv
    assert a[a.index("--api-key") + 1] == "s3cret"
    assert plan.api_key == "s3cret"  # the readiness probe authenticates with it
    assert a[a.index("--max-running-requests") + 1] == "3"
    assert a[a.index("--context-length") + 1] == "2048"
    assert plan.url.endswith(":31000")


def test_arguments_after_double_dash_reach_sglang_last(cpu_only: None, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    plan = command.build_plan(["--demo", "--", "--disable-radix-cache", "--chunked-prefill-size", "512"])
    assert plan.argv[-3:] == ["--disable-radix-cache", "--chunked-prefill-size", "512"]
    assert plan.argv.count("--disable-radix-cache") == 1
    # Flags winport sets itself (its ready line and API-key check rely on them) are refused there.
    for owned in (["--port", "31001"], ["--host=0.0.0.0"], ["--tp-size", "2"]):
        with pytest.raises(command.ServeError, match="winport serve sets it itself"):
            command.build_plan(["--demo", "--", *owned])
    # Without `--` an SGLang flag is still an error of winport's own parser.
    with pytest.raises(SystemExit):
        command.build_plan(["--demo", "--disable-radix-cache"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--demo", "--vram-gib", "8"], "no CUDA GPU"),
        (["--demo", "--device", "cuda"], "sees no CUDA GPU"),
        (["--demo", "--port", "70000"], "is not a TCP port"),
        (["--model", "/nonexistent/model"], "no such file or folder"),
        (["--demo", "--max-running-requests", "0"], "at least 1"),
        (["--demo", "--served-model-name", "a:b"], "cannot contain ':'"),
    ],
)
def test_impossible_settings_fail_with_a_reason(cpu_only: None, tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    with pytest.raises(command.ServeError, match=message):
        command.build_plan(argv)


def test_broken_gguf_model_is_named_in_the_error(cpu_only: None, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # truncated right after the magic
    with pytest.raises(command.ServeError, match="model.gguf"):
        command.build_plan(["--model", str(gguf)])


def test_main_reports_errors_with_exit_code_2(cpu_only: None, capsys) -> None:
    assert command.main(["--model", "/nonexistent"]) == 2
    assert "winport serve: --model /nonexistent: no such file or folder" in capsys.readouterr().err


def test_cpu_tensor_parallel_gets_a_thread_binding(cpu_only: None, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: tmp_path / "demo")
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    assert command.cpu_thread_bind(2, 32) == "0-15|16-31"
    assert command.cpu_thread_bind(4, 8) == "0-1|2-3|4-5|6-7"
    with pytest.raises(command.ServeError, match="needs at least 4 CPUs"):
        command.cpu_thread_bind(4, 2)
    plan = command.build_plan(["--demo", "--tp", "2"])
    assert plan.env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert int(plan.env["OPENBLAS_NUM_THREADS"]) == max(1, (__import__("os").cpu_count() or 1) // 2)
    # Custom all-reduce off at --tp 2 is the platform's default: tests/serve/test_launch_policy.py.
    with pytest.raises(command.ServeError, match="at least 1"):
        command.build_plan(["--demo", "--tp", "0"])


def test_cuda_decode_is_eager_when_engram_rows_come_from_the_gguf_map(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A converted V4.1 GGUF whose engram tables stay in the file (engram_gguf.json): SGLang's processes
    get the file's path, and on CUDA the user is told decode runs without graphs (the rows are gathered
    on the host; the platform turns them off: tests/serve/test_launch_policy.py)."""
    import json

    from winport.demo.config import demo_config
    from winport.gguf.engram_rows import ENV, SIDECAR

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(demo_config()))
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: folder)
    monkeypatch.delenv("WINPORT_CUDA_GRAPH", raising=False)
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    plan = command.build_plan(["--demo"])
    assert ENV not in plan.env
    (folder / SIDECAR).write_text('{"engram_tables": []}')
    plan = command.build_plan(["--demo"])
    assert plan.env[ENV] == str(folder / SIDECAR)
    assert "CUDA graphs are off for this model" in capsys.readouterr().out
    monkeypatch.setattr(command, "_cuda_available", lambda: False)
    plan = command.build_plan(["--demo"])
    assert plan.env[ENV] == str(folder / SIDECAR) and plan.device == "cpu"
