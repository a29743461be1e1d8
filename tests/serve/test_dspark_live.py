"""DSpark speculative decoding of the V4.1 demo on CUDA: the same greedy tokens as without it.

Two servers, one after the other, each exactly as a user starts it under WINPORT_EMULATE_WINDOWS=1:
`winport serve --demo --demo-variant v41 --speculative-algorithm DSPARK` (the draft stages bundled in
the demo checkpoint: block 5, 3 stages) and then the same without the flag, as the judge. SGLang 0.5.23
runs DSpark on CUDA/NPU/XPU only, so the module is GPU-only (on the CPU the flag is refused:
tests/serve/test_dspark_serve_plan.py). Run it on the GPU machine with
`bash scripts/gpu/serve_demo.sh tests/serve/test_dspark_live.py`.

Both with every expert on the GPU and hybrid (4 of 8 experts a layer on the GPU, the rest in
kt-kernel: the verify block goes through the hybrid MoE; the draft's MoE is never wrapped).

Checked: the draft was loaded (SGLang names the DSpark draft arch, no unexpected draft weight) and
used (every request reports verify steps); 32 greedy tokens per prompt with DSpark equal those
without it. The accept length (tokens per verify step, SGLang's spec_accept_length) is printed and
written to $OUT/dspark_accept_<layout>.json; with the demo's random draft weights it is expected near 1 (the
draft rarely guesses the target's token), so it is reported, not asserted beyond >= 1.

Equality is judged tie-aware (tests/serve/_greedy_judge.py): a verify forward (6 tokens at once) and
a decode step are different kernels, and this random model has top-2 logit gaps under 0.05 nat every
few steps, so a legitimate numeric difference can flip a near-tie and the two free-running
continuations part there. So the DSpark continuation is teacher-forced through the plain server's
prefill and judged by the bar the plain server's own greedy decode meets against that same prefill
(measured in the same run on the same prompts): on CUDA, SGLang's FP8 activations make its own
decode and prefill part at about a third of the steps on this model (the judge module has the
numbers), so the CPU's fixed bar would fail a correct server. The free-running agreement (the first
differing step) is reported too. Controls (the continuations shifted by one) must fail the same bar.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serve._greedy_judge import bar_from_self, describe, meets, server_deficits
from tests.serve._server import Server, start, stop, wait_ready
from winport.demo.config import demo_config

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CFG = demo_config("v41")
TOKENS = 32
PROMPTS = [[0, *np.random.default_rng(seed).integers(5, CFG["vocab_size"], 40).tolist()] for seed in (1, 2, 3)]
# A repetitive prompt: where a draft has the best chance to be accepted.
PROMPTS.append([0, *([17, 230, 401, 52] * 10)])


def _post(srv: Server, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(srv.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def _greedy(srv: Server, ids: list[int]) -> dict[str, Any]:
    return _post(srv, {"input_ids": ids, "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0,
                                                             "ignore_eos": True}})


# All experts on the GPU, and hybrid (4 of 8 a layer on the GPU, the rest in kt-kernel on the host):
# the verify block then goes through the hybrid MoE, the draft's own MoE stays on the GPU.
LAYOUTS = {"all-gpu": [], "hybrid": ["--gpu-experts", "4", "--vram-gib", "32"]}


@pytest.fixture(scope="module", params=list(LAYOUTS), ids=list(LAYOUTS))
def runs(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The DSpark server's continuations and stats, then the plain server's (same expert layout)
    verdicts on them."""
    layout = LAYOUTS[request.param]
    spec = start(["--demo", "--demo-variant", "v41", "--speculative-algorithm", "DSPARK", "--max-running-requests", "2",
                  *layout])
    try:
        wait_ready(spec)
        results = [_greedy(spec, ids) for ids in PROMPTS]
        spec_log = spec.text()
    finally:
        stop(spec)
    plain = start(["--demo", "--demo-variant", "v41", "--max-running-requests", "2", *layout])
    try:
        wait_ready(plain)
        free = [_greedy(plain, ids)["output_ids"] for ids in PROMPTS]
        deficits = [server_deficits(plain.url, ids, r["output_ids"]) for ids, r in zip(PROMPTS, results, strict=True)]
        own = [server_deficits(plain.url, ids, tokens) for ids, tokens in zip(PROMPTS, free, strict=True)]
        controls = [server_deficits(plain.url, ids, r["output_ids"][1:] + r["output_ids"][:1])
                    for ids, r in zip(PROMPTS, results, strict=True)]
    finally:
        stop(plain)
    return {"spec": results, "spec_log": spec_log, "free": free, "deficits": deficits, "own": own,
            "controls": controls, "layout": request.param}


def test_the_bundled_draft_is_loaded(runs: dict[str, Any]) -> None:
    log = runs["spec_log"]
    assert "DeepseekV4ForCausalLMDSpark" in log, "SGLang did not load the bundled DSpark draft"
    assert "DSpark V4 draft: unexpected weight" not in log, re.findall(r".*unexpected weight.*", log)[:5]
    hybrid = "winport: routed experts run in kt-kernel" in log
    assert hybrid == (runs["layout"] == "hybrid"), "the expert layout is not the one asked for"


def test_speculation_runs_and_reports_the_accept_length(runs: dict[str, Any]) -> None:
    report = []
    for ids, r in zip(PROMPTS, runs["spec"], strict=True):
        meta = r["meta_info"]
        assert len(r["output_ids"]) == TOKENS
        assert meta.get("spec_verify_ct", 0) > 0, f"no DSpark verify step reported: {sorted(meta)}"
        accept = TOKENS / meta["spec_verify_ct"]
        assert accept >= 1.0 and abs(accept - meta["spec_accept_length"]) < 1e-6
        report.append({"prompt_len": len(ids), "verify_steps": meta["spec_verify_ct"], "accept_length": accept,
                       "accept_rate": meta.get("spec_accept_rate")})
        print(f"DSpark prompt of {len(ids)} tokens: {meta['spec_verify_ct']} verify steps for {TOKENS} tokens, "
              f"accept length {accept:.2f}, accept rate {meta.get('spec_accept_rate')}")
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"dspark_accept_{runs['layout']}.json").write_text(json.dumps(report, indent=1) + "\n")


def test_greedy_tokens_equal_without_speculation(runs: dict[str, Any]) -> None:
    for ids, r, free, deficit in zip(PROMPTS, runs["spec"], runs["free"], runs["deficits"], strict=True):
        tokens = r["output_ids"]
        first = next((i for i, (a, b) in enumerate(zip(tokens, free, strict=True)) if a != b), TOKENS)
        print(f"prompt of {len(ids)}: free-running equal for {first}/{TOKENS} tokens; teacher-forced argmax at "
              f"{sum(d == 0 for d in deficit)}/{TOKENS}, worst deficit {max(deficit):.3f} nat")
    bar = bar_from_self(runs["own"])
    print(f"DSpark ({runs['layout']}) vs the plain server's prefill: {describe(runs['deficits'], bar)}")
    assert meets(runs["deficits"], bar), runs["deficits"]
    assert not meets(runs["controls"], bar), runs["controls"]
