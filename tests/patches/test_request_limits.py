"""winport.patches.request_limits: the ASGI middleware in front of SGLang's routes and the hook on
the tokenizer manager's per-request validation, driven without a server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import types
from typing import Any

import pytest

from tests.helpers import run_python
from winport.patches import request_limits as patch

SITE = os.path.join(sys.prefix, "lib", "python3.11", "site-packages", "sglang", "srt", "entrypoints", "x.py")


class FakeApp:
    """An ASGI app that records what it received and answers with a fixed status and body."""

    def __init__(self, status: int = 200, body: bytes = b'{"ok": true}', chunks: int = 1) -> None:
        self.status, self.body, self.chunks = status, body, chunks
        self.received: list[bytes] = []
        self.calls = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.calls += 1
        if scope["type"] == "http" and scope.get("method") in {"POST", "PUT"}:
            message = await receive()
            self.received.append(message.get("body", b""))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(self.body)).encode())]})
        step = max(1, len(self.body) // self.chunks)
        parts = [self.body[i:i + step] for i in range(0, len(self.body), step)] or [b""]
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


def _call(app: Any, path: str, body: bytes | None, *, method: str = "POST", content_type: bytes | None = b"application/json",
          pieces: int = 1) -> tuple[int, dict[bytes, bytes], bytes]:
    headers = [(b"content-type", content_type)] if content_type else []
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}
    data = body or b""
    step = max(1, len(data) // pieces)
    messages = [{"type": "http.request", "body": data[i:i + step], "more_body": i + step < len(data)}
                for i in range(0, len(data), step)] or [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app({**scope}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), out


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/completions", {"model": "m", "prompt": [1, 1024], "max_tokens": 2}, "prompt[1]"),
    ("/generate", {"text": "", "sampling_params": {"max_new_tokens": 2}}, "text"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 1025}, "top_logprobs_num"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 1025}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 1000}, "n"),
])
def test_hostile_requests_get_400_and_never_reach_sglang(path: str, body: dict, field: str) -> None:
    inner = FakeApp()
    status, headers, out = _call(patch.RequestLimitsMiddleware(inner, vocab_size=1024), path,
                                 json.dumps(body).encode(), pieces=3)
    assert status == 400 and inner.calls == 0
    assert int(headers[b"content-length"]) == len(out)
    assert field in out.decode()


@pytest.mark.parametrize("raw", [b"[]", b'"hello"', b"null", b"1"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
def test_non_object_bodies_get_400(path: str, raw: bytes) -> None:
    inner = FakeApp()
    status, _, out = _call(patch.RequestLimitsMiddleware(inner, vocab_size=1024), path, raw)
    assert status == 400 and inner.calls == 0 and b"must be a JSON object" in out


def test_an_ordinary_request_reaches_sglang_with_its_body_intact() -> None:
    inner = FakeApp()
    body = json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}).encode()
    status, _, out = _call(patch.RequestLimitsMiddleware(inner, vocab_size=1024), "/v1/completions", body, pieces=4)
    assert status == 200 and out == b'{"ok": true}' and inner.received == [body]


@pytest.mark.parametrize(("body", "content_type", "method"), [
    (b"{not json", b"application/json", "POST"),  # SGLang's own 400 says it is not JSON
    (b"[]", b"multipart/form-data; boundary=x", "POST"),  # audio uploads are not JSON
    (None, b"application/json", "GET"),
])
def test_what_the_middleware_does_not_judge_goes_through(body: bytes | None, content_type: bytes, method: str) -> None:
    inner = FakeApp()
    status, _, _ = _call(patch.RequestLimitsMiddleware(inner, vocab_size=1024), "/v1/chat/completions", body,
                         content_type=content_type, method=method)
    assert status == 200 and inner.calls == 1


@pytest.mark.parametrize("chunks", [1, 5])
def test_error_bodies_lose_server_paths(chunks: int) -> None:
    leaky = json.dumps({"object": "error", "message": f'File "{SITE}", line 3; C:\\Users\\bob\\x.py',
                        "code": 400}).encode()
    inner = FakeApp(status=400, body=leaky, chunks=chunks)
    status, headers, out = _call(patch.RequestLimitsMiddleware(inner, vocab_size=1024), "/v1/chat/completions",
                                 b'{"messages": [{"role": "user", "content": "x"}]}')
    assert status == 400 and int(headers[b"content-length"]) == len(out)
    text = out.decode()
    assert "site-packages" not in text and "Users" not in text and sys.prefix not in text
    assert json.loads(out)["code"] == 400


def test_success_bodies_are_left_alone() -> None:
    body = json.dumps({"text": f"the model wrote {SITE}"}).encode()
    _, _, out = _call(patch.RequestLimitsMiddleware(FakeApp(body=body), vocab_size=1024), "/generate",
                      b'{"text": "x"}')
    assert out == body


def _fake_manager(vocab: int) -> Any:
    return types.SimpleNamespace(model_config=types.SimpleNamespace(vocab_size=vocab))


def _req(**kw: Any) -> Any:
    base = {"sampling_params": {"max_new_tokens": 2}, "top_logprobs_num": None, "return_logprob": False,
            "input_embeds": None}
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(("ids", "obj", "needle"), [
    ([], _req(), "empty"),
    ([1, 1024], _req(), "input_ids[1]"),
    ([3], _req(return_logprob=True, top_logprobs_num=5000), "top_logprobs_num"),
    ([3], _req(sampling_params={"n": 1000}), "n must be"),
])
def test_tokenizer_hook_refuses_before_the_scheduler(ids: list[int], obj: Any, needle: str) -> None:
    called = []
    with pytest.raises(ValueError) as info:
        patch._validate_one_request(lambda *a: called.append(a), _fake_manager(1024), obj, ids)
    assert needle in str(info.value) and not called


def test_tokenizer_hook_passes_valid_requests_to_sglangs_own_checks() -> None:
    called = []
    manager, obj = _fake_manager(1024), _req(return_logprob=True, top_logprobs_num=5)
    patch._validate_one_request(lambda *a: called.append(a), manager, obj, [0, 1023])
    assert called == [(manager, obj, [0, 1023])]


def test_vocab_size_of() -> None:
    assert patch.vocab_size_of(_fake_manager(129280)) == 129280
    assert patch.vocab_size_of(object()) is None


def test_the_middleware_is_added_when_sglang_builds_its_app() -> None:
    # In a fresh interpreter: the patch hooks SGLang's app setup; the fake setup call below is what
    # SGLang's launch_server makes, and the app then carries the middleware with the model's vocabulary.
    code = """
import types
from winport.patches import request_limits as p
p.register_patch()
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()
assert {p.HTTP_TARGET, p.VALIDATE_TARGET} <= HookRegistry._patched
import sglang.srt.entrypoints.http_server as hs
manager = types.SimpleNamespace(model_config=types.SimpleNamespace(vocab_size=777))
p._add_middleware(None, manager, None, None, [{}], None)
mw = [m for m in hs.app.user_middleware if m.cls is p.RequestLimitsMiddleware]
print(len(mw), mw[0].kwargs)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "1 {'vocab_size': 777}"
