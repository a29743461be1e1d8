"""`winport serve --demo` for real: SGLang serving the DeepSeek-V4 demo model on CPU.

One server for the whole module (starting it takes about a minute on 2 cores), run exactly as a
user would run it (`python -m winport serve --demo ...`) under WINPORT_EMULATE_WINDOWS=1, so every
request here also exercises the Windows code paths (tcp zmq channels, no fork, no SIGQUIT, no
fcntl/resource, shims for every Linux-only library). Requests go through the real `openai` client.
The last test stops the server with Ctrl-C and checks that no process is left.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.helpers import REPO_ROOT
from tests.serve import _greedy_judge as greedy_judge
from tests.serve._server import Server, assert_ctrl_c_stops_all, post, start, stop, wait_ready

API_KEY = "test-key-123"
MAX_RUNNING = 4


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Start `winport serve --demo` once for this module; stop it (if still running) at the end."""
    srv = start(["--demo", "--api-key", API_KEY, "--max-running-requests", str(MAX_RUNNING)])
    wait_ready(srv)
    yield srv
    stop(srv)


def _client(srv: Server, key: str | None = API_KEY):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key=key or "none", timeout=300, max_retries=0)


def _model(srv: Server) -> str:
    return _client(srv).models.list().data[0].id


def _post(srv: Server, path: str, body: bytes, key: str | None = API_KEY) -> tuple[int, str]:
    return post(srv, path, body, key)


def test_ready_line_names_a_loopback_url(server: Server) -> None:
    line = next(ln for ln in server.output if "ready at" in ln)
    assert f"ready at {server.url} " in line
    assert server.url.startswith("http://127.0.0.1:")


def test_api_key_is_required(server: Server) -> None:
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        _client(server, key="wrong-key").models.list()
    status, _ = _post(server, "/v1/chat/completions", b'{"model": "m", "messages": []}', key=None)
    assert status == 401


def test_chat_completion(server: Server) -> None:
    reply = _client(server).chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": "hello world?"}], max_tokens=6, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens > 2


def test_streaming_chat_equals_non_streaming(server: Server) -> None:
    client, model = _client(server), _model(server)
    messages = [{"role": "user", "content": "The server loads 42 weights."}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    pieces = []
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                                stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == whole.choices[0].message.content


def test_completions_streaming_and_not(server: Server) -> None:
    client, model = _client(server), _model(server)
    whole = client.completions.create(model=model, prompt="def main():", max_tokens=5, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="def main():", max_tokens=5, temperature=0, stream=True) if c.choices)
    assert whole.choices[0].text and streamed == whole.choices[0].text
    assert whole.usage.completion_tokens == 5


def test_eight_concurrent_requests(server: Server) -> None:
    client, model = _client(server), _model(server)
    prompts = [f"question {i}: hello windows {i * 7}?" for i in range(8)]

    def ask(prompt: str) -> tuple[str, int]:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=4, temperature=0)
        return r.choices[0].message.content, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, prompts))
    assert len(results) == 8
    assert all(text and tokens == 4 for text, tokens in results)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}', "max_new_tokens must be at least 0"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}', ""),
        (b'{"model": "m", "messages": "not a list"}', "messages"),
    ],
)
def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server: Server, body: bytes, needle: str) -> None:
    status, text = _post(server, "/v1/chat/completions", body)
    assert 400 <= status < 500, (status, text)
    assert needle in text
    ok = _client(server).chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": "still there?"}], max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2


def test_client_disconnect_mid_stream_frees_its_slot(server: Server) -> None:
    # Fill every running slot with long streams, read a little of each, hang up. If a slot were not
    # freed, the next request would queue behind ~1000 decode steps (minutes on this CPU).
    body = json.dumps({"model": _model(server), "messages": [{"role": "user", "content": "tell me more"}],
                       "max_tokens": 1000, "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    conns = []
    for _ in range(MAX_RUNNING):
        req = urllib.request.Request(server.url + "/v1/chat/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        resp = urllib.request.urlopen(req, timeout=300)  # noqa: S310 - loopback only
        resp.readline()
        conns.append(resp)
    for resp in conns:
        resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # hang up mid-stream, like a killed client
        resp.close()
    start = time.monotonic()
    reply = _client(server).chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": "next"}], max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens == 2
    assert time.monotonic() - start < 120, "the disconnected streams kept their slots"


PARITY_TEXT = (
    "The server loads 42 weights. def main(): return x + y. hello world windows linux deepseek "
    "flash attention sparse memory? The scheduler routes 7 tokens. import torch. The cache stores "
    "pages. for i in range(10): print('hello'). A request streams replies."
)


def _reference(folder):  # type: ignore[no-untyped-def]
    """The transformers reference for the server under test. `winport serve` runs on CUDA whenever
    torch sees a GPU, and there SGLang multiplies FP8-rounded activations (W8A8 block FP8 linears
    and Triton fused MoE), so the reference rounds the same activations: without that the GPU run
    differs by a median 0.15 nat (measured on the H200, and reproduced on CPU by comparing the
    reference with and without the activation rounding: median 0.148), which is the quantization's
    own effect and would hide any kernel error of that size."""
    import torch

    from winport.demo.reference import load_reference

    return load_reference(folder, fp8_activations=torch.cuda.is_available(),
                          fp8_expert_activations=torch.cuda.is_available() and _experts_w8a8())


def _experts_w8a8() -> bool:
    """Whether the server under test rounds the routed experts' inputs through FP8 on CUDA: SGLang's
    Triton fused MoE does (the default), winport's MXFP4 MoE (WINPORT_GPU_MXFP4_MOE=1) is W4A16.
    A reference that rounds them models another computation (H200, 2026-11-30: the W4A16 server met
    such a reference at 48/96 greedy steps, under the W8A8 floor's bar of 50)."""
    return os.environ.get("WINPORT_GPU_MXFP4_MOE", "0") != "1"


def _parity(served: list[float], reference: list[float]) -> tuple[float, float]:
    """Median |served - reference| and the share of positions under 0.3 nat."""
    import statistics

    diffs = [abs(a - b) for a, b in zip(served, reference, strict=True)]
    assert all(d == d for d in diffs), "NaN in the log-probabilities"
    return statistics.median(diffs), sum(d < 0.3 for d in diffs) / len(diffs)


def _bf16_w8a8_twin(folder):  # type: ignore[no-untyped-def]
    """The W8A8 reference in bf16, the second correct W8A8 computation the CUDA bounds come from.

    It runs on the GPU when there is one: that is the bf16 arithmetic the server's own runs on, and
    a bf16 model on a CPU is slow: on the H200 host (2026-11-30) its 96 free-running greedy steps
    did not finish within the time the whole live file had (300 s), against 25 s here."""
    import torch

    from winport.demo.reference import load_reference

    model = load_reference(folder, fp8_activations=True, fp8_expert_activations=_experts_w8a8())
    return _on_gpu_if_any(model.to(torch.bfloat16))


def _on_gpu_if_any(model):  # type: ignore[no-untyped-def]
    """`model` on the GPU when there is one: the H200 host's CPU did not finish the references'
    free-running greedy steps in the time the live file had (2026-11-30)."""
    import torch

    return model.to("cuda") if torch.cuda.is_available() else model


def _w8a8_bounds(folder, ids: list[int], reference: list[float]) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The bounds for a server that runs W8A8 (CUDA): from the spread of two correct W8A8 runs.

    FP8 e4m3 activations carry a relative rounding of 2^-4 (bf16: 2^-9), and whether a value rounds
    up or down depends on the last bits of its input, so two correct W8A8 implementations that
    differ only in the arithmetic before the quantizer (fp32 here, bf16 on the GPU) do not round the
    same values. Measured on the demo (CPU, 2026-11-30): the fp32 reference with activation rounding
    against the same in bf16 differ by a median 0.236 nat (share < 0.3 nat: 0.73); two runs without
    the rounding (fp32 vs bf16) by 0.060. The H200 served values were 0.130 / 0.77 from the fp32 one.
    A bound under that floor would fail a correct GPU path, so on CUDA the served values must be no
    further from the reference than 1.5x the floor's median, and keep at least the floor's share
    minus 0.1; both are computed here from the same prompt. The shifted control (median ~1 nat) must
    still fail that bound, so a kernel error that moves every position is still caught.
    """
    from winport.demo.reference import prompt_logprobs

    other = prompt_logprobs(_bf16_w8a8_twin(folder), ids)
    floor_median, floor_share = _parity(other, reference)
    print(f"W8A8 floor (fp32 vs bf16 reference, both FP8 activations): median {floor_median:.4f} "
          f"share<0.3: {floor_share:.2f}")
    return max(0.1, 1.5 * floor_median), min(0.8, floor_share - 0.1)


def test_prompt_logprobs_agree_with_transformers(server: Server) -> None:
    """SGLang's prompt log-probabilities against transformers' eager DeepSeek-V4 (+ FP8 KV).

    The demo is served from DeepSeek's FP8 block + MXFP4 checkpoint; the reference reads the exact
    bf16 dequantization of the same file, and SGLang on CPU multiplies bf16 activations by those same
    values (W8A16 / W4A16), so the weights add no difference.
    Tolerance on CPU, from the dtypes: SGLang runs bf16 activations (relative rounding 2^-9 per op)
    and the reference is fp32; both round the KV through FP8 e4m3 the same way (winport.demo.reference).
    That leaves a few percent per layer, about 0.03 nat per position (median 0.028 measured over 300
    tokens with routing forced equal). The random gates of the demo model make near-tied expert
    scores common, and a tie broken differently (top-2 of 8) moves that one position by up to ~1 nat:
    those isolated spikes are why the bounds are on the median and on the share of positions, not
    the maximum. A broken kernel moves every position (the shifted control below shows the scale).
    On CUDA SGLang rounds activations through FP8 (W8A8), whose noise is far larger: the bounds there
    come from the measured spread of two correct W8A8 runs (_w8a8_bounds).
    """
    import torch
    from transformers import AutoTokenizer

    from winport.demo.reference import prompt_logprobs

    folder = REPO_ROOT / ".cache" / "winport-test" / "demo-v4"
    ids = [0, *AutoTokenizer.from_pretrained(str(folder)).encode(PARITY_TEXT)]
    assert len(ids) > 48
    status, text = _post(server, "/generate", json.dumps({
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True, "logprob_start_len": 0}).encode())
    assert status == 200, text
    served = [lp for lp, _tok, _ in json.loads(text)["meta_info"]["input_token_logprobs"][1:]]
    reference = prompt_logprobs(_reference(folder), ids)
    assert len(served) == len(reference)
    if os.environ.get("WINPORT_TEST_SERVER_LOG_DIR"):  # kept for analysis after a GPU run
        os.makedirs(os.environ["WINPORT_TEST_SERVER_LOG_DIR"], exist_ok=True)
        with open(os.path.join(os.environ["WINPORT_TEST_SERVER_LOG_DIR"], "prompt_logprobs.json"), "w") as f:
            json.dump({"ids": ids, "served": served, "reference": reference}, f)
    max_median, min_share = _w8a8_bounds(folder, ids, reference) if torch.cuda.is_available() else (0.1, 0.8)
    median, within = _parity(served, reference)
    print(f"prompt logprobs vs transformers: n={len(served)} median {median:.4f} "
          f"share<0.3: {within:.2f} (bounds {max_median:.3f} / {min_share:.2f})")
    assert median < max_median
    assert within >= min_share
    # Control: the same statistic against the reference shifted by one position must fail.
    shifted_median, _ = _parity(served[1:], reference[:-1])
    assert shifted_median > max_median


GREEDY_PROMPTS = (
    "hello world windows linux deepseek flash attention sparse memory",
    "the quick brown fox jumps over the lazy dog",
    "def main(): return sum(range(10))",
)
GREEDY_TOKENS = 32


def _greedy_deficits(reference, ids: list[int], tokens: list[int]):  # type: ignore[no-untyped-def]
    """Per generated step: the reference's best log-probability minus that of the token taken.

    Teacher-forced (the reference reads the server's own continuation in one forward), so a
    disagreement at one step does not send the two down different paths afterwards.
    """
    import torch

    with torch.no_grad():
        seq = torch.tensor([ids + tokens], device=next(reference.parameters()).device)
        logits = reference(seq, use_cache=False).logits[0].double().cpu()
    lp = torch.log_softmax(logits[len(ids) - 1: len(ids) - 1 + len(tokens)], -1)
    top2 = lp.topk(2, -1).values
    taken = lp[torch.arange(len(tokens)), torch.tensor(tokens)]
    return top2[:, 0] - taken, top2[:, 0] - top2[:, 1]


def _free_greedy(model, ids: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """GREEDY_TOKENS greedy tokens of a transformers model after `ids`, free-running."""
    import torch

    seq, device = list(ids), next(model.parameters()).device
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            seq.append(int(model(torch.tensor([seq], device=device), use_cache=False).logits[0, -1].argmax()))
    return seq[len(ids):]


def _w8a8_greedy_bar(folder, prompts: list[list[int]], judge):  # type: ignore[no-untyped-def]
    """For a W8A8 server (CUDA): the bar from the greedy spread of two correct W8A8 computations.

    The bf16 copy of the W8A8 reference runs free for GREEDY_TOKENS steps per prompt and `judge` (the
    fp32 W8A8 reference the server is judged by) reads its continuations, as _w8a8_bounds does for
    prompt log-probabilities (tests/serve/_greedy_judge.py has the measured spread)."""
    started = time.monotonic()
    other = _bf16_w8a8_twin(folder)
    spread = [_greedy_deficits(judge, ids, _free_greedy(other, ids))[0].tolist() for ids in prompts]
    print(f"W8A8 greedy floor computed in {time.monotonic() - started:.0f} s on {next(other.parameters()).device}")
    return greedy_judge.bar_from_spread(spread, "W8A8 floor: bf16 W8A8 reference = fp32 W8A8 reference's argmax",
                                        "two W8A8 references disagree at most steps: this judge cannot tell")


def test_greedy_tokens_agree_with_transformers(server: Server) -> None:
    """32 greedy tokens per prompt from the server, judged by transformers' eager DeepSeek-V4.

    Exact equality of 32 free-running greedy tokens is not a property this random demo model has
    (measured: scripts/debug/compare_hf.py and the issue 5 note): its head gives top-2
    logit gaps below 0.05 nat every few steps, and the served logits differ from the fp32 reference
    by about 0.04 nat (median; bf16 activations vs fp32, both with DeepSeek's FP8 KV) with isolated
    routing-flip spikes; so the first divergence comes within a few tokens at a near-tie, and after
    it the two continue from different prefixes. Making routing decisive does not change that (the
    gap-to-noise ratio of a continuous top-k is scale-free; tried: routing fixed by bias still
    diverged at head gaps of 0.007-0.03). What is checked instead: the tie-aware verdict of
    tests/serve/_greedy_judge.py over the three prompts' 96 steps (at least 3/4 of the steps the
    reference's argmax exactly, the others mostly within a near-tie; measured on the CPU: 29/32 on
    each prompt, worst deficit 0.27 nat). On CUDA the bar is widened to the server's own decode-vs-
    prefill spread, measured here on the same continuations (SGLang's FP8 activations amplify the
    bf16 difference between its decode and prefill attention kernels; the module docstring has the
    numbers), and to the spread of two correct W8A8 references (_w8a8_greedy_bar). The same verdict on
    wrong continuations (the server's tokens shifted by one) must be negative.
    """
    import torch
    from transformers import AutoTokenizer

    folder = REPO_ROOT / ".cache" / "winport-test" / "demo-v4"
    tok = AutoTokenizer.from_pretrained(str(folder))
    reference = _reference(folder)
    prompts = [[0, *tok.encode(text)] for text in GREEDY_PROMPTS]
    judged, own, controls = [], [], []
    for text, ids in zip(GREEDY_PROMPTS, prompts, strict=True):
        status, body = _post(server, "/generate", json.dumps({"input_ids": ids, "sampling_params": {
            "max_new_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True}}).encode())
        assert status == 200, body
        tokens = json.loads(body)["output_ids"]
        assert len(tokens) == GREEDY_TOKENS
        deficit, gap = _greedy_deficits(reference, ids, tokens)
        assert not deficit.isnan().any()
        exact = int((deficit == 0).sum())
        first = next((i for i, d in enumerate(deficit.tolist()) if d > 0), GREEDY_TOKENS)
        print(f"greedy {text[:24]!r}: reference argmax at {exact}/{GREEDY_TOKENS} steps, first other at "
              f"{first}; worst deficit {float(deficit.max()):.3f} nat; reference top-2 gaps min "
              f"{float(gap.min()):.3f} median {float(gap.median()):.3f}")
        judged.append(deficit.tolist())
        own.append(greedy_judge.server_deficits(server.url, ids, tokens, api_key=API_KEY))
        controls.append(_greedy_deficits(reference, ids, tokens[1:] + tokens[:1])[0].tolist())
    bar = greedy_judge.bar_from_self(own)
    if torch.cuda.is_available():
        bar = greedy_judge.widest(bar, _w8a8_greedy_bar(folder, prompts, reference))
    print(f"greedy vs transformers: {greedy_judge.describe(judged, bar)}")
    assert greedy_judge.meets(judged, bar), judged
    assert not greedy_judge.meets(controls, bar), controls


@pytest.mark.slow
def test_w8a8_greedy_floor_is_wide_but_still_refuses_shifted_tokens() -> None:
    """The CUDA-only widening of the greedy bar, computed without a server (on the CPU or the GPU):
    two W8A8 references part at a good share of the steps (hence the wider bar), yet every
    continuation shifted by one still fails it. Slow tier: about 400 s of CPU reference decoding on
    2 cores, for a bar only CUDA servers use; the GPU runs (scripts/gpu/final_check.sh) compute the
    same floor inside test_greedy_tokens_agree_with_transformers."""
    from transformers import AutoTokenizer

    from winport.demo.build import ensure_demo
    from winport.demo.reference import load_reference

    folder = ensure_demo("v4", folder=REPO_ROOT / ".cache" / "winport-test" / "demo-v4")  # the server's copy
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompts = [[0, *tok.encode(t)] for t in GREEDY_PROMPTS]
    judge = _on_gpu_if_any(load_reference(folder, fp8_activations=True, fp8_expert_activations=_experts_w8a8()))
    bar = _w8a8_greedy_bar(folder, prompts, judge)
    cpu = greedy_judge.cpu_bar([[0.0] * GREEDY_TOKENS] * len(prompts))
    print(f"W8A8 greedy floor: {bar}")
    assert bar.min_exact < cpu.min_exact  # measured 55/96: the CPU bar would fail a correct W8A8 server
    shifted = []
    for ids in prompts:
        tokens = _free_greedy(judge, ids)
        shifted.append(_greedy_deficits(judge, ids, tokens[1:] + tokens[:1])[0].tolist())
    print(f"shifted: {greedy_judge.describe(shifted, bar)}")
    assert not greedy_judge.meets(shifted, bar), greedy_judge.describe(shifted, bar)


def test_ctrl_c_stops_every_process(server: Server) -> None:
    assert_ctrl_c_stops_all(server, 3, "winport serve, SGLang's server and its scheduler/detokenizer")
