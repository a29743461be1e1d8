"""winport.serve.request_limits: which bodies are refused, with which field named, and path scrubbing."""

from __future__ import annotations

import json
import os
import sys

import pytest

from winport.serve import request_limits as rl

VOCAB = 1024

# (route, body, field the refusal must name, text the message must hold)
REFUSED = [
    # token ids outside [0, vocab)
    ("/v1/completions", {"prompt": [1, 1024], "max_tokens": 2}, "prompt[1]", "[0, 1024)"),
    ("/v1/completions", {"prompt": [-1]}, "prompt[0]", "[0, 1024)"),
    ("/v1/completions", {"prompt": [5, 2**63]}, "prompt[1]", "[0, 1024)"),
    ("/v1/completions", {"prompt": [[1, 2], [3, 99999]]}, "prompt[1][1]", "[0, 1024)"),
    ("/v1/completions", {"prompt": [1, 1024.0]}, "prompt[1]", "[0, 1024)"),
    ("/generate", {"input_ids": [1024]}, "input_ids[0]", "[0, 1024)"),
    ("/generate", {"input_ids": [0, -5, 3]}, "input_ids[1]", "[0, 1024)"),
    ("/generate", {"input_ids": [[1], [2, 10**12]]}, "input_ids[1][1]", "[0, 1024)"),
    ("/encode", {"input_ids": [4096]}, "input_ids[0]", "[0, 1024)"),
    ("/v1/embeddings", {"input": [1, 1024]}, "input[1]", "[0, 1024)"),
    # empty prompts
    ("/generate", {"text": "", "sampling_params": {"max_new_tokens": 2}}, "text", "empty"),
    ("/generate", {"text": ["hi", ""]}, "text[1]", "empty"),
    ("/generate", {"text": []}, "text", "empty"),
    ("/generate", {"input_ids": []}, "input_ids", "empty"),
    ("/generate", {"input_ids": [[1, 2], []]}, "input_ids[1]", "empty"),
    ("/v1/completions", {"prompt": ""}, "prompt", "empty"),
    ("/v1/completions", {"prompt": []}, "prompt", "empty"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt[1]", "empty"),
    ("/v1/completions", {"prompt": [[1], []]}, "prompt[1]", "empty"),
    ("/v1/chat/completions", {"messages": []}, "messages", "empty"),
    ("/v1/responses", {"input": ""}, "input", "empty"),
    ("/api/generate", {"model": "m", "prompt": ""}, "prompt", "empty"),
    ("/api/chat", {"model": "m", "messages": []}, "messages", "empty"),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": []}, "messages", "empty"),
    # log-probabilities
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 1025}, "top_logprobs", "[0, 20]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21},
     "top_logprobs", "[0, 20]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": -1},
     "top_logprobs", "[0, 20]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": "1025"},
     "top_logprobs", "[0, 20]"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1025}, "logprobs", "[0, 20]"),
    ("/v1/completions", {"prompt": "x", "logprobs": -3}, "logprobs", "[0, 20]"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21.0}, "logprobs", "[0, 20]"),
    ("/v1/responses", {"input": "x", "top_logprobs": 50}, "top_logprobs", "[0, 20]"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 1025}, "top_logprobs_num",
     "[0, 1024]"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num",
     "[0, 1024]"),
    ("/generate", {"text": ["x", "y"], "top_logprobs_num": [1, 5000]}, "top_logprobs_num[1]", "[0, 1024]"),
    # n
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 1000}, "n", "[1, 128]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n", "[1, 128]"),
    ("/v1/completions", {"prompt": "x", "n": 129}, "n", "[1, 128]"),
    ("/v1/completions", {"prompt": "x", "n": -1}, "n", "[1, 128]"),
    ("/invocations", {"messages": [{"role": "user", "content": "x"}], "n": 500}, "n", "[1, 128]"),
    ("/generate", {"text": "x", "sampling_params": {"n": 1000}}, "sampling_params.n", "[1, 128]"),
    ("/generate", {"text": ["x", "y"], "sampling_params": [{"n": 1}, {"n": 0}]}, "sampling_params[1].n",
     "[1, 128]"),
]

ACCEPTED = [
    ("/v1/completions", {"prompt": [0, 1023]}),
    ("/v1/completions", {"prompt": [[5], [6, 7]], "n": 128, "logprobs": 20}),
    ("/v1/completions", {"prompt": ["a", " "], "logprobs": 0}),
    ("/v1/completions", {"prompt": "def main():", "n": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}], "top_logprobs": 20, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 0}),
    ("/generate", {"input_ids": [0, 1, 1023], "return_logprob": True, "top_logprobs_num": 1024}),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}, "top_logprobs_num": 0}),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 128}]}),
    # Types SGLang's own validation refuses are left to it (its message names them already).
    ("/v1/completions", {"prompt": {"not": "a prompt"}}),
    ("/v1/chat/completions", {"messages": "not a list"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": "many"}),
    # Routes without a prompt only need an object.
    ("/flush_cache", {}),
    ("/v1/tokenize", {"prompt": ""}),
]


@pytest.mark.parametrize(("route", "body", "field", "needle"), REFUSED)
def test_hostile_bodies_are_refused_naming_field_and_limit(route: str, body: dict, field: str, needle: str) -> None:
    refusal = rl.check_body(route, body, VOCAB)
    assert refusal is not None, (route, body)
    assert refusal.status == 400
    assert refusal.field == field
    assert field in refusal.message and needle in refusal.message, refusal.message


@pytest.mark.parametrize(("route", "body"), ACCEPTED)
def test_ordinary_bodies_pass(route: str, body: dict) -> None:
    assert rl.check_body(route, body, VOCAB) is None


@pytest.mark.parametrize("body", [[], [1, 2], "hello", None, 1, 2.5, True, ""])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/generate", "/flush_cache"])
def test_a_body_that_is_not_an_object_is_refused_on_every_route(route: str, body: object) -> None:
    refusal = rl.check_body(route, body, VOCAB)
    assert refusal is not None and refusal.field == "body"
    assert "must be a JSON object" in refusal.message


def test_trailing_slash_routes_are_checked() -> None:
    assert rl.check_body("/generate/", {"input_ids": [2000]}, VOCAB) is not None


def test_without_a_known_vocabulary_only_the_vocabulary_checks_are_off() -> None:
    assert rl.check_body("/generate", {"input_ids": [10**9]}, None) is None
    assert rl.check_body("/generate", {"input_ids": []}, None) is not None
    assert rl.check_body("/v1/completions", {"prompt": "x", "n": 1000}, None) is not None


@pytest.mark.parametrize(("ids", "kwargs", "needle"), [
    ([], {}, "empty"),
    (None, {}, "empty"),
    ([1, 1024], {}, "input_ids[1]"),
    ([-1], {}, "input_ids[0]"),
    ([1], {"return_logprob": True, "top_logprobs_num": 1025}, "top_logprobs_num"),
    ([1], {"return_logprob": True, "top_logprobs_num": -2}, "top_logprobs_num"),
    ([1], {"n": 1000}, "n must be"),
])
def test_tokenized_requests_are_refused(ids: list[int] | None, kwargs: dict, needle: str) -> None:
    refusal = rl.check_tokenized(ids, vocab_size=VOCAB, **kwargs)
    assert refusal is not None and needle in refusal.message


def test_tokenized_requests_that_fit_pass() -> None:
    assert rl.check_tokenized([0, 1023], vocab_size=VOCAB, return_logprob=True, top_logprobs_num=1024, n=128) is None
    # top_logprobs_num without return_logprob is never used by the scheduler
    assert rl.check_tokenized([5], vocab_size=VOCAB, top_logprobs_num=5000) is None
    # input_embeds replace the ids
    assert rl.check_tokenized(None, vocab_size=VOCAB, has_embeds=True) is None


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                                   "/generate", "/invocations"])
def test_error_bodies_carry_the_message(route: str) -> None:
    refusal = rl.Refusal("n", "n must be an integer in [1, 128], got 1000")
    assert refusal.message in json.dumps(rl.error_body(route, refusal))


SITE = os.path.join(sys.prefix, "lib", "python3.11", "site-packages", "sglang", "srt", "entrypoints", "http_server.py")


@pytest.mark.parametrize("text", [
    f'1 validation error: File "{SITE}", line 1200, in validate_json_request',
    "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: boom",
    "cannot open /home/alice/models/DeepSeek-V4/config.json",
    "error in /opt/conda/lib/python3.11/dist-packages/torch/nn/functional.py",
    "failed at /usr/local/lib/python3.11/site-packages/fastapi/routing.py:312",
    "from /srv/app/server.py",
    r"C:\Users\alice\AppData\Local\Programs\Python\Python311\Lib\site-packages\sglang\srt\x.py",
    r"D:/models/v4/model.gguf missing",
    r"share \\fileserver\models\v4 unreachable",
    f"cwd {os.getcwd()}/winport/serve/command.py",
    f"home {os.path.expanduser('~')}/.cache/winport",
])
def test_server_paths_are_scrubbed(text: str) -> None:
    out = rl.scrub_paths(text)
    assert rl.PATH_PLACEHOLDER in out or "traceback omitted" in out
    for leak in ("/home/alice", "site-packages", "dist-packages", "Users", "/srv/app", "models/v4",
                 "fileserver", "File \"x\"", os.getcwd(), os.path.expanduser("~") + "/"):
        assert leak not in out, (text, out)


@pytest.mark.parametrize("text", [
    "max_new_tokens must be at least 0, got -3.",
    "Model /v1/chat/completions expects messages; see /generate and /api/chat",
    "top_logprobs must be an integer in [0, 20], got 1025",
    "a/b ratio 3/4 and 1/2",
])
def test_messages_without_paths_are_unchanged(text: str) -> None:
    assert rl.scrub_paths(text) == text


def test_scrub_body_keeps_json_structure_and_handles_text() -> None:
    body = json.dumps({"object": "error", "message": f"bad File \"{SITE}\"", "code": 400}).encode()
    out = json.loads(rl.scrub_body(body))
    assert out["code"] == 400 and out["object"] == "error" and "site-packages" not in out["message"]
    assert b"site-packages" not in rl.scrub_body(f"Internal error at {SITE}".encode())
    windows = json.dumps({"error": {"message": r"at C:\Users\bob\x.py"}}).encode()
    assert b"Users" not in rl.scrub_body(windows)
