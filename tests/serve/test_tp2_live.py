"""`winport serve --demo --tp 2` on CPU: two ranks with gloo collectives give what one rank gives.

Two servers are started side by side, as a user would start them (`python -m winport serve
--demo --tp N`, under WINPORT_EMULATE_WINDOWS=1): TP=1 and TP=2, each rank of the TP=2 server on
its own CPU (winport's CPU TP thread binding). One request through the real `openai` client asks
each for 8 greedy tokens and the log-probabilities of the prompt (`echo` + `logprobs`). Then
the TP=2 server is stopped with Ctrl-C and no process may be left (both ranks included).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator

import pytest

from tests.serve._server import Server, assert_ctrl_c_stops_all, start, stop, wait_ready

PROMPT = (
    "The server loads 42 weights. def main(): return x + y. hello world windows linux deepseek "
    "flash attention sparse memory? The scheduler routes 7 tokens. import torch."
)
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[int, Server]]:
    """TP=1 and TP=2 demo servers (started together: their start-up is mostly imports)."""
    both = {1: start(["--demo", "--tp", "1"])}
    # Build the demo model once (the first server does it) before the second one looks for it.
    while "winport serve: model" not in both[1].text() and both[1].proc.poll() is None:
        time.sleep(0.5)
    both[2] = start(["--demo", "--tp", "2"])
    try:
        for srv in both.values():
            wait_ready(srv)
        yield both
    finally:
        for srv in both.values():
            stop(srv)


def _ask(srv: Server) -> dict[str, object]:
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=900, max_retries=0)
    reply = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=NEW_TOKENS,
                                      temperature=0, echo=True, logprobs=2)
    lp = reply.choices[0].logprobs
    n_prompt = reply.usage.prompt_tokens
    assert reply.usage.completion_tokens == NEW_TOKENS and len(lp.tokens) == n_prompt + NEW_TOKENS
    return {"tokens": lp.tokens[n_prompt:], "prompt_logprobs": lp.token_logprobs[1:n_prompt],
            "top": lp.top_logprobs[n_prompt:], "text": reply.choices[0].text}


@pytest.fixture(scope="module")
def answers(servers: dict[int, Server]) -> dict[int, dict[str, object]]:
    """The same request to both servers (one at a time: the two would share the 2 cores)."""
    return {tp: _ask(srv) for tp, srv in servers.items()}


def test_tp2_ranks_run_on_one_cpu_each_without_custom_all_reduce(servers: dict[int, Server]) -> None:
    import psutil

    srv = servers[2]
    ranks = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
             if "scheduler_TP" in " ".join(p.cmdline() or [p.name()])]
    assert len(ranks) == 2, [p.cmdline() for p in psutil.Process(srv.proc.pid).children(recursive=True)]
    # winport's CPU TP binding: equal CPU ranges, every thread of a rank inside its range.
    per = (os.cpu_count() or 2) // 2
    expected = sorted(tuple(range(r * per, r * per + per)) for r in range(2))
    assert sorted(tuple(p.cpu_affinity()) for p in ranks) == expected
    for p in ranks:
        threads = [t.id for t in p.threads()]
        masks = {tuple(os.sched_getaffinity(tid)) for tid in threads}
        assert len(masks) == 1 and masks <= set(expected), (p.pid, masks)
    assert "Custom allreduce" not in srv.text(), "custom all-reduce was attempted"


def test_tp2_gives_the_tp1_greedy_tokens_and_prompt_logprobs(answers: dict[int, dict[str, object]]) -> None:
    """TP=2 against TP=1: same greedy tokens, prompt log-probabilities within a derived bound.

    What differs between the two is where sums are rounded: at TP=2 each rank rounds its half of
    every row-parallel product (attention wo_b, expert and shared-expert down projections; the
    embedding lookup is exact) to bf16 and gloo adds the two halves, where TP=1 rounds the whole
    sum once. That is about one extra bf16 rounding (2^-9 relative) per reduction, 2 reductions per
    layer x 4 layers: logits move by ~1e-2 relative, a few hundredths of a nat. Two things amplify it
    at single positions: the FP8 e4m3 KV cache (a value on a rounding boundary moves by a whole e4m3
    step, 2^-3 relative) and the demo's random expert gates (a near-tied top-2-of-8 choice flips,
    ~1 nat at that position; see test_server_live's parity test). Hence: median < 0.08 (a few
    hundredths expected, 0.031 measured), >= 80% of positions within 0.3 nat (spikes allowed), a
    shifted-by-one control that must fail the median bound, and greedy tokens identical unless
    TP=1's own top-2 gap was a near-tie (< 0.1 nat) at or before the first difference.
    """
    one, two = answers[1], answers[2]
    a, b = one["prompt_logprobs"], two["prompt_logprobs"]
    assert len(a) == len(b) > 20
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]  # type: ignore[arg-type]
    assert all(d == d for d in diffs), "NaN in the served log-probabilities"
    median, within = statistics.median(diffs), sum(d < 0.3 for d in diffs) / len(diffs)
    gaps = []
    for top in one["top"]:  # type: ignore[union-attr]
        best = sorted(top.values(), reverse=True)
        gaps.append(best[0] - best[1] if len(best) > 1 else float("inf"))
    shifted = [abs(x - y) for x, y in zip(a[1:], b[:-1], strict=True)]  # type: ignore[arg-type,index]
    quartiles = [round(q, 3) for q in statistics.quantiles(diffs, n=4)]
    print(f"TP=2 vs TP=1 prompt logprobs: n={len(diffs)} median {median:.4f} quartiles {quartiles} "
          f"max {max(diffs):.3f} share<0.3: {within:.2f}; shifted control median {statistics.median(shifted):.3f}; "
          f"TP=1 top-2 gaps {[round(g, 3) for g in gaps]}; tokens {one['tokens']} vs {two['tokens']}")
    # Measured on the 2-core dev VM: median 0.031, 82% of positions under 0.1, max 0.61 (one spike).
    assert median < 0.08
    assert within >= 0.8
    assert statistics.median(shifted) > 0.08, "the control should be outside the bound"
    first_diff = next((i for i, (x, y) in enumerate(zip(one["tokens"], two["tokens"], strict=True)) if x != y), None)  # type: ignore[call-overload]
    if first_diff is not None:
        assert min(gaps[: first_diff + 1]) < 0.1, f"greedy tokens differ at {first_diff} without a near-tie"


def test_tp2_listens_on_loopback_only(servers: dict[int, Server]) -> None:
    """Both ranks' gloo groups and their rendezvous (winport.patches.loopback_distributed) included."""
    import ipaddress

    from tests.serve._server import listeners

    found = listeners(servers[2])
    assert len({pid for pid, *_ in found}) >= 3, f"the launcher and both ranks listen (zmq, gloo): {found}"
    beyond = [s for s in found if not ipaddress.ip_address(s[3]).is_loopback]
    assert not beyond, f"listeners reachable from the network: {beyond}"


def test_ctrl_c_stops_both_ranks(servers: dict[int, Server], answers: dict[int, dict[str, object]]) -> None:
    assert_ctrl_c_stops_all(servers[2], 5, "winport serve, SGLang's server, 2 scheduler ranks and the detokenizer")
