"""Hostile requests against a real `winport serve --demo --api-key K`: each gets a 4xx naming the
field, no answer quotes a server path, and the server keeps serving (winport.patches.request_limits).

One server for the module, as tests/serve/test_server_live.py runs it. Before the patch, the token
id, top-logprob and empty-prompt cases here stopped the whole server (the scheduler died).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from tests.helpers import REPO_ROOT
from tests.serve._server import Server, post, start, stop, wait_ready

API_KEY = "K-request-limits"
DEMO_VOCAB = 1024
MODEL = "winport-demo-v4"
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Start `winport serve --demo --api-key K` once for this module."""
    srv = start(["--demo", "--api-key", API_KEY])
    wait_ready(srv)
    yield srv
    stop(srv)


def _post(srv: Server, path: str, body: bytes, key: str | None = API_KEY) -> tuple[int, str]:
    return post(srv, path, body, key)


LEAKS = ("/site-packages/", "site-packages", "dist-packages", "Traceback", str(REPO_ROOT), sys.prefix,
         os.path.expanduser("~") + os.sep, "C:\\Users", "C:/Users")


def _assert_no_path(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, f"{leak!r} in {text[:500]}"


def _j(value: object) -> bytes:
    return json.dumps(value).encode()


HOSTILE = [
    # token ids outside the vocabulary
    ("/v1/completions", _j({"model": MODEL, "prompt": [1, DEMO_VOCAB], "max_tokens": 2}), "prompt[1]"),
    ("/v1/completions", _j({"model": MODEL, "prompt": [-1], "max_tokens": 2}), "prompt[0]"),
    ("/v1/completions", _j({"model": MODEL, "prompt": [[1, 2], [3, 10**12]], "max_tokens": 2}), "prompt[1][1]"),
    ("/v1/completions", _j({"model": MODEL, "prompt": [1, 2**40], "max_tokens": 2, "stream": True}), "prompt[1]"),
    ("/generate", _j({"input_ids": [1, DEMO_VOCAB], "sampling_params": {"max_new_tokens": 2}}), "input_ids[1]"),
    ("/generate", _j({"input_ids": [[1], [-7]], "sampling_params": {"max_new_tokens": 2}}), "input_ids[1][0]"),
    # top log-probabilities
    ("/v1/chat/completions", _j({"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 1025,
                                 "max_tokens": 2}), "top_logprobs"),
    ("/v1/chat/completions", _j({"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": -1,
                                 "max_tokens": 2}), "top_logprobs"),
    ("/v1/chat/completions", _j({"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 21,
                                 "max_tokens": 2, "stream": True}), "top_logprobs"),
    ("/v1/completions", _j({"model": MODEL, "prompt": "hi", "logprobs": 1025, "max_tokens": 2}), "logprobs"),
    ("/v1/completions", _j({"model": MODEL, "prompt": "hi", "logprobs": -2, "max_tokens": 2}), "logprobs"),
    ("/generate", _j({"text": "hi", "return_logprob": True, "top_logprobs_num": 1025,
                      "sampling_params": {"max_new_tokens": 2}}), "top_logprobs_num"),
    ("/generate", _j({"text": "hi", "return_logprob": True, "top_logprobs_num": -1,
                      "sampling_params": {"max_new_tokens": 2}}), "top_logprobs_num"),
    # empty prompts
    ("/generate", _j({"text": "", "sampling_params": {"max_new_tokens": 2}}), "text"),
    ("/generate", _j({"input_ids": [], "sampling_params": {"max_new_tokens": 2}}), "input_ids"),
    ("/generate", _j({"text": ["hi", ""], "sampling_params": {"max_new_tokens": 2}}), "text[1]"),
    ("/v1/completions", _j({"model": MODEL, "prompt": "", "max_tokens": 2}), "prompt"),
    ("/v1/completions", _j({"model": MODEL, "prompt": [[1, 2], []], "max_tokens": 2}), "prompt[1]"),
    ("/v1/chat/completions", _j({"model": MODEL, "messages": [], "max_tokens": 2}), "messages"),
    # n
    ("/v1/chat/completions", _j({"model": MODEL, "messages": CHAT, "n": 1000, "max_tokens": 2}), "n"),
    ("/v1/completions", _j({"model": MODEL, "prompt": "hi", "n": 0, "max_tokens": 2}), "n"),
    ("/generate", _j({"text": "hi", "sampling_params": {"max_new_tokens": 2, "n": 1000}}), "sampling_params.n"),
    # bodies that are not objects
    *[(route, raw, "JSON object") for route in ("/v1/chat/completions", "/v1/completions", "/generate")
      for raw in (b"[]", b'"hello"', b"null", b"1")],
]


@pytest.mark.parametrize(("path", "body", "field"), HOSTILE)
def test_hostile_request_is_refused_naming_the_field(server: Server, path: str, body: bytes, field: str) -> None:
    status, text = _post(server, path, body)
    assert 400 <= status < 500, (status, text)
    assert field in text, text
    _assert_no_path(text)
    assert server.proc.poll() is None, server.text()[-4000:]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", b'{"model": "m", "messages": "not a list"}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}'),
    ("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}'),
    ("/generate", b'{"text": 5}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}'),
])
def test_sglangs_own_refusals_carry_no_server_path(server: Server, path: str, body: bytes) -> None:
    status, text = _post(server, path, body)
    assert 400 <= status < 500, (status, text)
    _assert_no_path(text)


def test_a_request_without_the_key_is_still_401(server: Server) -> None:
    status, _ = _post(server, "/v1/completions", b"[]", key=None)
    assert status == 401


def test_the_server_still_answers_after_all_of_them(server: Server) -> None:
    status, text = _post(server, "/v1/chat/completions", _j({
        "model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0, "logprobs": True, "top_logprobs": 20}))
    assert status == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 2
    status, text = _post(server, "/v1/completions", _j({
        "model": MODEL, "prompt": [0, DEMO_VOCAB - 1], "max_tokens": 2, "temperature": 0, "n": 2}))
    assert status == 200, text
    assert len(json.loads(text)["choices"]) == 2
    status, text = _post(server, "/generate", _j({
        "input_ids": [1, 2, 3], "return_logprob": True, "top_logprobs_num": DEMO_VOCAB,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}}))
    assert status == 200, text
    assert len(json.loads(text)["meta_info"]["output_top_logprobs"][0]) == DEMO_VOCAB
    assert server.proc.poll() is None
