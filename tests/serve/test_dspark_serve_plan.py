"""`winport serve --speculative-algorithm DSPARK`: refused on the CPU with the reason, passed to SGLang on CUDA.

No server is started (tests/serve/test_dspark_live.py serves it on a GPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from winport.demo.config import demo_config
from winport.serve import command


def _folder(tmp_path: Path, variant: str) -> Path:
    folder = tmp_path / f"demo-{variant}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(demo_config(variant)))
    return folder


def _never_build(variant: str) -> Path:
    raise AssertionError(f"the {variant} demo must not be built for a refused flag")


@pytest.mark.parametrize("spelling", ["DSPARK", "dspark"])
def test_cpu_refuses_dspark_before_building_anything(monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    monkeypatch.setattr(command, "_cuda_available", lambda: False)
    monkeypatch.setattr("winport.demo.build.ensure_demo", _never_build)
    with pytest.raises(command.ServeError) as err:
        command.build_plan(["--demo", "--demo-variant", "v41", "--speculative-algorithm", spelling])
    msg = str(err.value)
    assert "--speculative-algorithm DSPARK" in msg and "only on CUDA, NPU or XPU" in msg
    assert "runs on the CPU" in msg and "without the flag" in msg


def test_unknown_algorithm_is_an_argparse_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "_cuda_available", lambda: False)
    with pytest.raises(SystemExit):
        command.build_plan(["--demo", "--speculative-algorithm", "EAGLE"])


def test_cuda_passes_dspark_with_the_bundled_draft(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = _folder(tmp_path, "v41")
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: folder)
    plan = command.build_plan(["--demo", "--demo-variant", "v41", "--speculative-algorithm", "dspark"])
    a = plan.argv
    assert plan.device == "cuda"
    assert a[a.index("--speculative-algorithm") + 1] == "DSPARK" and a.count("--speculative-algorithm") == 1
    assert a[a.index("--speculative-draft-model-path") + 1] == str(folder)
    # Without the flag the same model is served without speculation.
    plain = command.build_plan(["--demo", "--demo-variant", "v41"])
    assert "--speculative-algorithm" not in plain.argv


def test_cuda_refuses_dspark_for_a_model_without_a_draft(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = _folder(tmp_path, "v4")
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: folder)
    with pytest.raises(command.ServeError, match="bundles no DSpark draft"):
        command.build_plan(["--demo", "--speculative-algorithm", "DSPARK"])


def test_bundle_keys_are_the_ones_sglang_looks_for() -> None:
    """The demo configs agree with SGLang's own test for a bundled draft, which our check mirrors."""
    from sglang.srt.speculative.dspark_components.dspark_config import (
        checkpoint_bundles_dspark_draft,
        parse_dspark_draft_config,
    )

    v41, v4 = demo_config("v41"), demo_config("v4")
    assert checkpoint_bundles_dspark_draft(v41) and not checkpoint_bundles_dspark_draft(v4)
    assert bool(set(v41) & set(command.DSPARK_BUNDLE_KEYS)) and not set(v4) & set(command.DSPARK_BUNDLE_KEYS)
    parsed = parse_dspark_draft_config(draft_hf_config=v41)
    assert (parsed.gamma, parsed.markov_rank, parsed.mask_token_id) == (5, 32, v41["pad_token_id"])
    assert parsed.target_layer_ids == [3, 4, 5]


RESOLVE = """
import argparse, json, os, sys
from pathlib import Path
import winport.demo.build as build
from winport.serve import command
command._cuda_available = lambda: True
build.ensure_demo = lambda variant: Path(sys.argv[1])
plan = command.build_plan(["--demo", "--demo-variant", "v41", "--speculative-algorithm", "DSPARK"])
os.environ.update(plan.env)
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = ServerArgs.from_cli_args(parser.parse_args(plan.argv))
args.resolve_once()
v = resolved_view(args)
print("RESOLVED " + json.dumps([v.speculative_algorithm, v.speculative_draft_model_path,
                                v.speculative_num_draft_tokens, v.speculative_num_steps, v.speculative_eagle_topk]))
"""


def test_sglang_resolves_the_cuda_dspark_plan(tmp_path: Path) -> None:
    """SGLang's own server-argument resolution (no GPU needed) accepts the CUDA plan for the V4.1 demo:
    the draft path is the checkpoint, one step, top-1, and 6 draft tokens = the config's block 5 + 1
    (SGLang's default block would give 8)."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    folder = _folder(tmp_path, "v41")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    env.update({"WINPORT_PLATFORM": "on", "HF_HUB_OFFLINE": "1"})
    proc = subprocess.run([sys.executable, "-c", RESOLVE, str(folder)], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESOLVED ")), None)
    assert line is not None, proc.stderr[-3000:]
    assert json.loads(line[len("RESOLVED "):]) == ["DSPARK", str(folder), 6, 1, 1]
